// Package simexec is the simulated executor that the demo, the tests and the benchmarks run
// against (SPEC §9). It honours the dispatch protocol of SPEC §8: it checks the signature,
// confirms each start with the job's nonce before "running" it, runs for the payload's sleep_ms
// and answers with the payload's outcome. It counts starts per job id and the highest
// concurrency it saw, globally and per tenant, and serves those counters at GET /stats.
//
// It sits under drainer/executor, next to the protocol it speaks, because the binary runs it
// (`sluice dev`, `sluice simexec`) and the binary never imports integration/.
package simexec

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/sluicehq/sluice/drainer/executor"
)

// Config configures the simulated executor. Field docs give the defaults.
type Config struct {
	// APIURL is sluice's API base URL, for /start and /complete. Empty: starts are not
	// confirmed and asynchronous jobs cannot complete.
	APIURL string
	// UnconfirmedStarts skips /start while APIURL is still used for /complete: the mode of a
	// sluice run with SLUICE_EXECUTOR_CONFIRM_START=false, whose drainer expects no
	// confirmation but whose async jobs must still report their outcome. Default false: every
	// start is confirmed when APIURL is set.
	UnconfirmedStarts bool
	// Token is the executor's bearer token for the API.
	Token string
	// Secret, if set, is checked against every dispatch's Sluice-Signature (401 on mismatch).
	Secret []byte
	// Log receives problems. Default: discard.
	Log *slog.Logger
	// OnReceive, if set, is called when a dispatch arrives, before anything else (tests measure
	// pickup latency with it).
	OnReceive func(jobID int64, tenant string, at time.Time)
}

// Payload is the part of a job's payload the simulated executor reads.
type Payload struct {
	SleepMS    int    `json:"sleep_ms"`
	Outcome    string `json:"outcome"`
	RetryAfter int    `json:"retry_after"`
	Async      bool   `json:"async"`
	// ConfirmDelayMS delays the start confirmation: an executor slow to start, which lets a
	// test void the dispatch before the confirmation arrives.
	ConfirmDelayMS int `json:"confirm_delay_ms"`
}

// Stats are the executor's counters.
type Stats struct {
	Received            int64            `json:"received"`
	Starts              map[string]int   `json:"starts"`
	TotalStarts         int64            `json:"total_starts"`
	DuplicateStarts     int64            `json:"duplicate_starts"`
	RefusedStarts       int64            `json:"refused_starts"`
	InFlight            int              `json:"in_flight"`
	MaxInFlight         int              `json:"max_in_flight"`
	MaxInFlightByTenant map[string]int   `json:"max_in_flight_by_tenant"`
	Completed           map[string]int64 `json:"completed"`
}

// Server is the simulated executor. Safe for concurrent use.
type Server struct {
	cfg  Config
	http *http.Client

	mu       sync.Mutex
	stats    Stats
	byTenant map[string]int

	ctx    context.Context // asynchronous completions run under it
	cancel context.CancelFunc
	async  sync.WaitGroup
}

// New returns a simulated executor.
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{cfg: cfg, http: &http.Client{Timeout: 10 * time.Second}, ctx: ctx, cancel: cancel}
	s.reset()
	return s
}

// SetAPI points the executor at sluice's API (for /start and /complete) after construction, for
// callers that learn the API's address only once it listens.
func (s *Server) SetAPI(url, token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg.APIURL, s.cfg.Token = url, token
}

func (s *Server) api() (string, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.APIURL, s.cfg.Token
}

// Close stops asynchronous completions and waits for them.
func (s *Server) Close() {
	s.cancel()
	s.async.Wait()
}

func (s *Server) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats = Stats{Starts: map[string]int{}, MaxInFlightByTenant: map[string]int{}, Completed: map[string]int64{}}
	s.byTenant = map[string]int{}
}

// Handler serves POST / (dispatch), GET /stats and POST /stats/reset.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /", s.dispatch)
	mux.HandleFunc("POST /dispatch", s.dispatch)
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.Stats())
	})
	mux.HandleFunc("POST /stats/reset", func(w http.ResponseWriter, r *http.Request) {
		s.reset()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte("{}\n"))
	})
	return mux
}

// Stats returns a copy of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.stats
	out.Starts = copyMap(s.stats.Starts)
	out.MaxInFlightByTenant = copyMap(s.stats.MaxInFlightByTenant)
	out.Completed = copyMap(s.stats.Completed)
	return out
}

func copyMap[V any](m map[string]V) map[string]V {
	out := make(map[string]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (s *Server) dispatch(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 32<<20))
	if err != nil {
		http.Error(w, "read body", http.StatusBadRequest)
		return
	}
	if len(s.cfg.Secret) > 0 && !executor.Verify(s.cfg.Secret, body, r.Header.Get(executor.HeaderSignature)) {
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	var d executor.Dispatch
	if err := json.Unmarshal(body, &d); err != nil {
		http.Error(w, "bad dispatch", http.StatusBadRequest)
		return
	}
	if s.cfg.OnReceive != nil {
		s.cfg.OnReceive(d.JobID, d.Tenant, time.Now())
	}
	s.mu.Lock()
	s.stats.Received++
	s.mu.Unlock()
	var p Payload
	if len(d.Payload) > 0 && d.Payload[0] == '{' {
		_ = json.Unmarshal(d.Payload, &p)
	}
	if p.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(p.RetryAfter))
		writeJSON(w, http.StatusTooManyRequests, map[string]any{"error": "rate limited upstream"})
		return
	}
	if apiURL, _ := s.api(); apiURL != "" && !s.cfg.UnconfirmedStarts {
		s.run(r.Context(), p.ConfirmDelayMS)
		// Once the API has answered /start the executor is committed to the job, whatever
		// becomes of the dispatch connection: the confirmation must not be abandoned halfway
		// because the drainer that sent the dispatch died, or the API would record a start the
		// counters never saw.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), confirmTimeout)
		err := s.confirm(cctx, d)
		cancel()
		if err != nil {
			s.mu.Lock()
			s.stats.RefusedStarts++
			s.mu.Unlock()
			s.cfg.Log.Info("start refused; not running the job", "job_id", d.JobID, "error", err)
			writeJSON(w, http.StatusConflict, map[string]any{"error": err.Error()})
			return
		}
	}
	s.begin(d)
	outcome := p.Outcome
	if outcome == "" {
		outcome = "succeeded"
	}
	if p.Async {
		s.async.Add(1)
		go func() {
			defer s.async.Done()
			s.run(s.ctx, p.SleepMS)
			s.end(d, outcome)
			if err := s.complete(s.ctx, d, outcome); err != nil {
				s.cfg.Log.Warn("async completion failed", "job_id", d.JobID, "error", err)
			}
		}()
		writeJSON(w, http.StatusAccepted, map[string]any{"accepted": true})
		return
	}
	s.run(r.Context(), p.SleepMS)
	s.end(d, outcome)
	writeJSON(w, http.StatusOK, map[string]any{"status": outcome, "result": map[string]any{"slept_ms": p.SleepMS}})
}

// run is the simulated work: it takes sleep_ms, or less if the request is abandoned.
// confirmTimeout bounds the confirmation of one start, retries included: longer than the database
// outages the tests cause, shorter than the nonce TTL.
const confirmTimeout = 30 * time.Second

func (s *Server) run(ctx context.Context, ms int) {
	if ms <= 0 {
		return
	}
	t := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func (s *Server) begin(d executor.Dispatch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := strconv.FormatInt(d.JobID, 10)
	s.stats.Starts[id]++
	s.stats.TotalStarts++
	if s.stats.Starts[id] > 1 {
		s.stats.DuplicateStarts++
	}
	s.stats.InFlight++
	s.stats.MaxInFlight = max(s.stats.MaxInFlight, s.stats.InFlight)
	s.byTenant[d.Tenant]++
	s.stats.MaxInFlightByTenant[d.Tenant] = max(s.stats.MaxInFlightByTenant[d.Tenant], s.byTenant[d.Tenant])
}

func (s *Server) end(d executor.Dispatch, outcome string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.InFlight--
	s.byTenant[d.Tenant]--
	s.stats.Completed[outcome]++
}

// confirm confirms the start of d. An answer that may have been lost (no answer, or a 503 that
// says retryable: the database was unreachable or the COMMIT's outcome is unknown) is asked
// again with the same nonce until ctx ends: SPEC §4 answers a repeated /start of a running job
// 200 again for this, and giving up would leave a start recorded that the executor never ran.
func (s *Server) confirm(ctx context.Context, d executor.Dispatch) error {
	b := backoff.WithContext(backoff.NewExponentialBackOff(backoff.WithInitialInterval(20*time.Millisecond),
		backoff.WithMaxInterval(time.Second), backoff.WithMaxElapsedTime(0)), ctx)
	return backoff.Retry(func() error {
		err := s.post(ctx, fmt.Sprintf("/v1/jobs/%d/start", d.JobID), map[string]any{"nonce": d.Nonce})
		var refused *refusal
		if errors.As(err, &refused) && !refused.retryable {
			return backoff.Permanent(err)
		}
		return err
	}, b)
}

func (s *Server) complete(ctx context.Context, d executor.Dispatch, outcome string) error {
	return s.post(ctx, fmt.Sprintf("/v1/jobs/%d/complete", d.JobID), map[string]any{"nonce": d.Nonce, "status": outcome})
}

func (s *Server) post(ctx context.Context, path string, body any) error {
	raw, _ := json.Marshal(body)
	apiURL, token := s.api()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(apiURL, "/")+path, bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("build %s: %w", path, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := s.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		var body struct {
			Retryable bool `json:"retryable"`
		}
		_ = json.Unmarshal(msg, &body)
		return &refusal{msg: path + ": HTTP " + strconv.Itoa(resp.StatusCode) + ": " + strings.TrimSpace(string(msg)),
			retryable: resp.StatusCode == http.StatusServiceUnavailable && body.Retryable}
	}
	return nil
}

// refusal is an API answer other than 200; retryable when the API said the call may be repeated.
type refusal struct {
	msg       string
	retryable bool
}

func (r *refusal) Error() string { return r.msg }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
