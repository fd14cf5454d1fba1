// Package simexec is the simulated executor that the demo, the tests and the benchmarks run
// against (SPEC §9). It is built on the executor kit (drainer/executor/kit), which speaks the
// dispatch protocol of SPEC §8: it checks the signature, confirms each start with the job's nonce
// before "running" it, runs for the payload's sleep_ms and answers with the payload's outcome. It
// counts starts per job id and the highest concurrency it saw, globally and per tenant, and
// serves those counters at GET /stats.
//
// It sits under drainer/executor, next to the protocol it speaks, because the binary runs it
// (`sluice dev`, `sluice simexec`) and the binary never imports integration/.
package simexec

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/drainer/executor/kit"
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
	// Unset, dispatches are not checked (tests that post unsigned dispatches).
	Secret []byte
	// Audience, if set, is the executor id a dispatch must name (kit.Audience); others are
	// refused with 403 wrong_audience.
	Audience string
	// Log receives problems. Default: discard.
	Log *slog.Logger
	// OnReceive, if set, is called when a dispatch arrives, before anything else (tests measure
	// pickup latency with it).
	OnReceive func(jobID int64, tenant string, at time.Time)
}

// maxPayload is the ceiling of max_payload_bytes (config.MaxPayloadCap).
const maxPayload = 4 << 20

// Payload is the part of a job's payload the simulated executor reads.
type Payload struct {
	SleepMS    int    `json:"sleep_ms"`
	Outcome    string `json:"outcome"`
	RetryAfter int    `json:"retry_after"`
	Async      bool   `json:"async"`
	// ConfirmDelayMS delays the start confirmation: an executor slow to start, which lets a
	// test void the dispatch before the confirmation arrives.
	ConfirmDelayMS int `json:"confirm_delay_ms"`
	// Groups are names the executor counts the job under while it runs (Stats.MaxInFlightByGroup):
	// a test names a job's lanes, tier or kind there and checks each limit where the work runs.
	Groups []string `json:"groups"`
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
	MaxInFlightByGroup  map[string]int   `json:"max_in_flight_by_group"`
	Completed           map[string]int64 `json:"completed"`
	// InFlightSecondsByTenant is each tenant's jobs in flight integrated over time since the
	// counters were reset (unit-seconds): its change between two reads, divided by the time
	// between them, is the tenant's mean in flight over that window, as the executor saw it.
	InFlightSecondsByTenant map[string]float64 `json:"in_flight_seconds_by_tenant"`
}

// Server is the simulated executor. Safe for concurrent use.
type Server struct {
	cfg Config // APIURL and Token change under mu (SetAPI)

	mu       sync.Mutex
	stats    Stats
	byTenant map[string]int
	byGroup  map[string]int
	// changed is when each tenant's in-flight count last changed (InFlightSecondsByTenant is
	// integrated up to it).
	changed map[string]time.Time
	exec    *kit.Handler   // serves dispatches; replaced by SetAPI
	retired []*kit.Handler // replaced by SetAPI, closed by Close
}

// Validate reports what New would refuse: an APIURL that is not an http or https URL, or one set
// without a Token (every call to the API would be refused).
func (c Config) Validate() error {
	s := &Server{cfg: c}
	ex, err := s.buildExec()
	if err != nil {
		return err
	}
	ex.Close()
	return nil
}

// New returns a simulated executor. It panics if cfg is invalid (Validate).
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg}
	s.reset()
	s.exec = s.newExec()
	return s
}

// newExec builds the executor for the current config (s.cfg, under s.mu or before s is shared):
// starts are confirmed when an API is set and UnconfirmedStarts is off.
func (s *Server) newExec() *kit.Handler {
	ex, err := s.buildExec()
	if err != nil {
		panic("simexec: " + err.Error())
	}
	return ex
}

func (s *Server) buildExec() (*kit.Handler, error) {
	opts := []kit.Option{kit.Logger(s.cfg.Log),
		kit.OnReceive(s.received), kit.OnStartRefused(s.refused), kit.BeforeStart(s.beforeStart),
		kit.Async(func(j kit.Job) bool { return payloadOf(j).Async })}
	if s.cfg.APIURL == "" || s.cfg.UnconfirmedStarts {
		opts = append(opts, kit.UnconfirmedStarts())
	}
	if len(s.cfg.Secret) == 0 {
		opts = append(opts, kit.InsecureSkipVerify())
	}
	if s.cfg.Audience != "" {
		opts = append(opts, kit.Audience(s.cfg.Audience))
	}
	// The demo and the tests may raise max_payload_bytes to its ceiling: take any dispatch sluice
	// can send.
	opts = append(opts, kit.MaxDispatchBytes(maxPayload+64<<10))
	return kit.New(string(s.cfg.Secret), s.cfg.APIURL, s.cfg.Token, s.work, opts...)
}

// SetAPI points the executor at sluice's API (for /start and /complete) after construction, for
// callers that learn the API's address only once it listens. Dispatches already under way finish
// with the API they started with.
func (s *Server) SetAPI(url, token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg.APIURL, s.cfg.Token = url, token
	s.retired = append(s.retired, s.exec)
	s.exec = s.newExec()
}

// Close stops asynchronous completions and waits for them.
func (s *Server) Close() {
	s.mu.Lock()
	all := append([]*kit.Handler{s.exec}, s.retired...)
	s.mu.Unlock()
	for _, ex := range all {
		ex.Close()
	}
}

func (s *Server) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats = Stats{Starts: map[string]int{}, MaxInFlightByTenant: map[string]int{}, MaxInFlightByGroup: map[string]int{},
		Completed: map[string]int64{}, InFlightSecondsByTenant: map[string]float64{}}
	s.byTenant, s.byGroup, s.changed = map[string]int{}, map[string]int{}, map[string]time.Time{}
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
	out.InFlightSecondsByTenant = copyMap(s.stats.InFlightSecondsByTenant)
	now := time.Now()
	for t, n := range s.byTenant {
		out.InFlightSecondsByTenant[t] += float64(n) * now.Sub(s.changed[t]).Seconds()
	}
	return out
}

// integrate adds tenant's in-flight count since its last change to its unit-seconds, before the
// count changes (under mu).
func (s *Server) integrate(tenant string) {
	now := time.Now()
	if n := s.byTenant[tenant]; n > 0 {
		s.stats.InFlightSecondsByTenant[tenant] += float64(n) * now.Sub(s.changed[tenant]).Seconds()
	}
	s.changed[tenant] = now
}

func copyMap[V any](m map[string]V) map[string]V {
	out := make(map[string]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// dispatch hands a dispatch to the executor of the moment (SetAPI replaces it).
func (s *Server) dispatch(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	ex := s.exec
	s.mu.Unlock()
	ex.ServeHTTP(w, r)
}

func (s *Server) received(j kit.Job) {
	if s.cfg.OnReceive != nil {
		s.cfg.OnReceive(j.ID, j.Tenant, time.Now())
	}
	s.mu.Lock()
	s.stats.Received++
	s.mu.Unlock()
}

func (s *Server) refused(kit.Job, error) {
	s.mu.Lock()
	s.stats.RefusedStarts++
	s.mu.Unlock()
}

// payloadOf reads the fields of j's payload the simulated executor acts on; a payload that is
// not a JSON object asks for nothing.
func payloadOf(j kit.Job) Payload {
	var p Payload
	if len(j.Payload) > 0 && j.Payload[0] == '{' {
		_ = json.Unmarshal(j.Payload, &p)
	}
	return p
}

// beforeStart answers retry_after with a 429 without confirming the start, and holds a start
// that is confirmed for confirm_delay_ms.
func (s *Server) beforeStart(ctx context.Context, j kit.Job) *kit.Outcome {
	p := payloadOf(j)
	if p.RetryAfter > 0 {
		o := kit.RateLimited(time.Duration(p.RetryAfter) * time.Second)
		return &o
	}
	s.mu.Lock()
	confirms := s.cfg.APIURL != "" && !s.cfg.UnconfirmedStarts
	s.mu.Unlock()
	if confirms {
		sleep(ctx, p.ConfirmDelayMS)
	}
	return nil
}

// work is the simulated job: counted as started, it takes sleep_ms (less if ctx ends first) and
// ends with the payload's outcome.
func (s *Server) work(ctx context.Context, j kit.Job) kit.Outcome {
	p := payloadOf(j)
	outcome := p.Outcome
	if outcome == "" {
		outcome = kit.StatusSucceeded
	}
	s.begin(j, p.Groups)
	sleep(ctx, p.SleepMS)
	s.end(j, p.Groups, outcome)
	result, _ := json.Marshal(map[string]any{"slept_ms": p.SleepMS})
	return kit.Outcome{Status: outcome, Result: result}
}

// sleep is the simulated work: it takes ms, or less if ctx ends first.
func sleep(ctx context.Context, ms int) {
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

// begin counts d as started, in its tenant and in groups (its payload's).
func (s *Server) begin(d kit.Job, groups []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := strconv.FormatInt(d.ID, 10)
	s.stats.Starts[id]++
	s.stats.TotalStarts++
	if s.stats.Starts[id] > 1 {
		s.stats.DuplicateStarts++
	}
	s.stats.InFlight++
	s.stats.MaxInFlight = max(s.stats.MaxInFlight, s.stats.InFlight)
	s.integrate(d.Tenant)
	s.byTenant[d.Tenant]++
	s.stats.MaxInFlightByTenant[d.Tenant] = max(s.stats.MaxInFlightByTenant[d.Tenant], s.byTenant[d.Tenant])
	for _, g := range groups {
		s.byGroup[g]++
		s.stats.MaxInFlightByGroup[g] = max(s.stats.MaxInFlightByGroup[g], s.byGroup[g])
	}
}

func (s *Server) end(d kit.Job, groups []string, outcome string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.InFlight--
	s.integrate(d.Tenant)
	s.byTenant[d.Tenant]--
	for _, g := range groups {
		s.byGroup[g]--
	}
	s.stats.Completed[outcome]++
}
