// Package kit turns a Go function into a sluice executor: New returns an http.Handler that
// speaks the dispatch protocol of SPEC §8, so that an executor's author writes only the work.
//
// For each dispatch the handler refuses a body over its size limit before reading it, checks the
// Sluice-Signature in constant time, refuses a dispatch meant for another executor (Audience), a
// nonce it has already seen and a dispatch whose deadline has passed, takes a slot if a
// concurrency limit is set (else answers 503 busy with Retry-After), confirms the start with the
// dispatch's nonce and a random start id of its own (POST /v1/jobs/{id}/start) and runs the
// function only once the API has said 200: on a 409 (the dispatch was voided, the nonce expired,
// or the dispatch already started) the job is not run. The API lets only one start attempt of a
// dispatch through, so a dispatch replayed to another replica of the executor, or to this one
// after a restart, is refused there, while this attempt may repeat a confirmation whose answer
// was lost. The function runs under
// the dispatch deadline. Its Outcome is the answer to the dispatch or, for jobs the Async option
// picks, is reported later through POST /v1/jobs/{id}/complete, retried with backoff while the
// API is unreachable. An outcome of RateLimited (the upstream answered 429) gates the job's rate
// key for its retry_after.
//
// The package depends only on the protocol's own package (drainer/executor) and the standard
// library besides a backoff library, so that an executor built on it carries nothing else of
// sluice.
package kit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/drainer/executor"
)

// Job is one dispatch, as the function receives it.
type Job struct {
	// ID is the job's id; a job dispatched again after a requeue keeps it.
	ID     int64
	Tenant string
	// RateKeySHA256 is the hex SHA-256 of the job's rate key, "" if it has none.
	RateKeySHA256 string
	// Payload is the job's payload as the producer sent it (JSON), nil if it had none.
	Payload json.RawMessage
	// Nonce identifies this dispatch: a redispatch of the same job carries a new one. Deduplicate
	// on it, never on ID.
	Nonce string
	// Deadline is the dispatch's execution wall, by sluice's clock; zero if the dispatch gave none.
	Deadline time.Time
	// Version is the job's fencing version for this dispatch; Attempt counts its dispatches.
	Version int64
	Attempt int
}

// Status values of an Outcome.
const (
	StatusSucceeded = "succeeded"
	StatusFailed    = "failed"
)

// Outcome is what the function reports for a job. The zero Outcome is a success with no result.
type Outcome struct {
	// Status is StatusSucceeded or StatusFailed; "" means StatusSucceeded. Any other value is
	// reported as failed with error_code invalid_outcome.
	Status string
	// ErrorCode and ErrorMessage explain a failure (error_code is at most 64 bytes of printable
	// ASCII, error_message at most 4,096 bytes: the API refuses an asynchronous report past
	// them).
	ErrorCode    string
	ErrorMessage string
	// Result is the job's result, JSON; nil for none.
	Result json.RawMessage
	// RetryAfter, when above zero, says the upstream refused the work for that long (its 429):
	// Status is then ignored. The job's rate key is gated for RetryAfter rounded up to whole
	// seconds (1 to 86,400). A synchronous answer is a 429 with Retry-After: the job is queued
	// again if its start was not confirmed (BeforeStart, UnconfirmedStarts) and fails with
	// rate_limited if it was (SPEC §8). An asynchronous one is reported through /complete with
	// that gate, as failed with rate_limited, or as not_started (queued again) when starts are
	// not confirmed.
	RetryAfter time.Duration
}

// Succeeded is a success with result encoded as JSON (nil: no result). A result that cannot be
// encoded makes the outcome a failure with error_code result_unencodable.
func Succeeded(result any) Outcome {
	if result == nil {
		return Outcome{Status: StatusSucceeded}
	}
	raw, err := json.Marshal(result)
	if err != nil {
		return Failed("result_unencodable", err.Error())
	}
	return Outcome{Status: StatusSucceeded, Result: raw}
}

// Failed is a failure with an error code and message.
func Failed(code, message string) Outcome {
	return Outcome{Status: StatusFailed, ErrorCode: code, ErrorMessage: message}
}

// RateLimited says the upstream answered 429 and refuses work for retryAfter (at least 1 s):
// sluice gates the job's rate key for that long (see Outcome.RetryAfter).
func RateLimited(retryAfter time.Duration) Outcome {
	return Outcome{Status: StatusFailed, ErrorCode: codeRateLimited,
		ErrorMessage: "the upstream answered 429", RetryAfter: max(retryAfter, time.Nanosecond)}
}

// Func does one job's work. ctx ends at the job's deadline, when the dispatch's connection is
// lost (synchronous jobs) or when the Handler is closed (asynchronous jobs). A panic is reported
// as failed with error_code executor_panic.
type Func func(ctx context.Context, j Job) Outcome

// Option tunes New.
type Option func(*options)

type options struct {
	unconfirmed   bool
	maxConcurrent int
	busyRetry     time.Duration
	async         func(Job) bool
	beforeStart   func(context.Context, Job) *Outcome
	log           *slog.Logger
	http          *http.Client
	onReceive     func(Job)
	onRefused     func(Job, error)
	skipVerify    bool
	audience      string
	maxDispatch   int64
	maxReads      int
}

// UnconfirmedStarts skips the start confirmation (/start), for a sluice run with
// SLUICE_EXECUTOR_CONFIRM_START=false. The API URL is then needed only to report asynchronous
// jobs and may be empty if there are none. It gives up the guarantee that a dispatch starts at
// most once: only this process's memory of nonces (lost on restart) refuses a replayed dispatch,
// so a dispatch replayed to another replica or to a restarted executor runs again.
func UnconfirmedStarts() Option { return func(o *options) { o.unconfirmed = true } }

// MaxConcurrent runs at most n jobs at once (n < 1: no limit, the default). A dispatch that
// finds them all taken is answered 503 with Retry-After retryAfter rounded up to whole seconds
// (at least 1): sluice queues the job again, not before then, without spending its dispatch
// budget. An asynchronous job holds its slot until the function returns.
func MaxConcurrent(n int, retryAfter time.Duration) Option {
	return func(o *options) { o.maxConcurrent, o.busyRetry = n, retryAfter }
}

// Async picks the jobs that run asynchronously: once their start is confirmed the dispatch is
// answered 202 at once, the function runs in a goroutine the Handler owns, and its outcome is
// reported through /complete, retried with backoff until the API records or refuses it, the
// Handler is closed, or a minute past the job's deadline. Default: every job is synchronous, its
// outcome the answer to the dispatch.
func Async(pick func(Job) bool) Option { return func(o *options) { o.async = pick } }

// BeforeStart runs check on each dispatch before its start is confirmed. A nil answer goes on
// with the job; an Outcome is the dispatch's answer, the job never started: RateLimited queues
// the job again and gates its rate key (an executor that knows its quota is spent says so here,
// and the job is not failed), Succeeded or Failed end it.
func BeforeStart(check func(ctx context.Context, j Job) *Outcome) Option {
	return func(o *options) { o.beforeStart = check }
}

// Logger receives the handler's problems (refused starts, failed reports). Default: discard.
func Logger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// HTTPClient calls the API. Default: a client with a 10 s timeout per request.
func HTTPClient(c *http.Client) Option { return func(o *options) { o.http = c } }

// OnReceive is called with every authentic dispatch as it arrives, before any other check.
func OnReceive(f func(Job)) Option { return func(o *options) { o.onReceive = f } }

// OnStartRefused is called when a start confirmation fails and the job is therefore not run.
func OnStartRefused(f func(Job, error)) Option { return func(o *options) { o.onRefused = f } }

// Audience makes the handler refuse (403 wrong_audience) every dispatch that does not name id as
// its audience: sluice names it when run with SLUICE_EXECUTOR_ID=id, inside the signed body, so a
// dispatch meant for another executor that shares the secret (staging, another pool) is never run
// here. Default "": any audience is accepted.
func Audience(id string) Option { return func(o *options) { o.audience = id } }

// MaxDispatchBytes refuses (413) a dispatch whose body is over n bytes, before its signature is
// checked: unauthenticated bytes are read only up to n. Default 320 KiB: sluice's default
// payload cap (max_payload_bytes, 256 KiB) and room for the rest of the dispatch. Raise it with
// max_payload_bytes.
func MaxDispatchBytes(n int64) Option { return func(o *options) { o.maxDispatch = n } }

// MaxConcurrentReads bounds the dispatch bodies read at once, before their signatures are known
// (so the memory n × MaxDispatchBytes at most); a dispatch past it is answered 503 with
// Retry-After 1 and sluice queues the job again without spending its dispatch budget. Default 64.
func MaxConcurrentReads(n int) Option { return func(o *options) { o.maxReads = n } }

// InsecureSkipVerify accepts dispatches without checking their signature, for tests only:
// anyone who can reach the handler can then make it run anything.
func InsecureSkipVerify() Option { return func(o *options) { o.skipVerify = true } }

// Handler is an executor: an http.Handler for the dispatch endpoint. Safe for concurrent use.
// Close or Shutdown stops its asynchronous jobs.
type Handler struct {
	secret []byte
	apiURL string
	token  string
	run    Func
	o      options

	seen  *nonceMemory
	slots chan struct{} // nil: no concurrency limit
	reads chan struct{} // bodies being read, before their signature is checked

	base   context.Context // asynchronous jobs and every call to the API run under it
	cancel context.CancelFunc
	mu     sync.Mutex // guards closed and the Add of async against its Wait
	closed bool
	async  sync.WaitGroup
}

// New returns an executor that checks dispatches against secret (SLUICE_EXECUTOR_SECRET),
// confirms starts and reports asynchronous outcomes to the API at apiURL (e.g.
// http://127.0.0.1:7480) with token (an executor token), and runs each job with run. It returns
// an error naming the argument when one is missing or malformed. A dispatch is refused once its
// deadline has passed by this host's clock, which should therefore agree with sluice's database
// to well within the execution wall.
func New(secret, apiURL, token string, run Func, opts ...Option) (*Handler, error) {
	h := &Handler{secret: []byte(secret), apiURL: strings.TrimRight(apiURL, "/"), token: token, run: run}
	for _, opt := range opts {
		opt(&h.o)
	}
	switch {
	case run == nil:
		return nil, errors.New("invalid config: run: a function is required")
	case secret == "" && !h.o.skipVerify:
		return nil, errors.New("invalid config: secret: the dispatch signing secret is required")
	case apiURL == "" && !h.o.unconfirmed:
		return nil, errors.New("invalid config: apiURL: sluice's API URL is required to confirm starts")
	case apiURL != "" && token == "":
		return nil, errors.New("invalid config: token: an executor token is required to call the API")
	}
	if apiURL != "" {
		u, err := url.Parse(apiURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("invalid config: apiURL: %q is not an http or https URL", apiURL)
		}
	}
	if h.o.log == nil {
		h.o.log = slog.New(slog.DiscardHandler)
	}
	if executor.PlainHTTPToRemote(apiURL) {
		h.o.log.Warn("the API URL is plain http:// to a host that is not loopback: nonces, start ids, outcomes and the executor token cross the network unencrypted; use https://",
			"api_url", apiURL)
	}
	if h.o.maxDispatch <= 0 {
		h.o.maxDispatch = defaultMaxDispatch
	}
	if h.o.maxReads <= 0 {
		h.o.maxReads = defaultMaxReads
	}
	h.reads = make(chan struct{}, h.o.maxReads)
	if h.o.http == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		h.o.http = &http.Client{Timeout: 10 * time.Second, Transport: tr}
	}
	if h.o.maxConcurrent > 0 {
		h.slots = make(chan struct{}, h.o.maxConcurrent)
	}
	h.seen = newNonceMemory(replayMemory)
	h.base, h.cancel = context.WithCancel(context.Background())
	return h, nil
}

const (
	// defaultMaxDispatch bounds a dispatch body: sluice's default payload cap and room for the
	// dispatch's other fields.
	defaultMaxDispatch = 256<<10 + 64<<10
	// defaultMaxReads bounds the dispatch bodies read at once before their signatures are known.
	defaultMaxReads = 64
	// replayMemory is how many nonces are remembered, each until its dispatch's deadline (past
	// it the dispatch is refused anyway): a drainer sending 300 dispatches a second with the
	// default 310 s wall stays within it, in about 10 MB.
	replayMemory = 100_000
	// confirmTimeout bounds one start confirmation, retries included: longer than a database
	// restart, shorter than the nonce TTL (300 s by default).
	confirmTimeout = 30 * time.Second
	// reportGrace is how long past a job's deadline its asynchronous outcome is still retried:
	// until sluice's recovery marks the job lost, a late report is recorded.
	reportGrace = time.Minute
	// noDeadline stands for the deadline of a dispatch that gave none.
	noDeadline = 10 * time.Minute
	// maxRetryAfter is SPEC §5's longest gate.
	maxRetryAfter = 86_400

	codeRateLimited = "rate_limited"
)

// ServeHTTP handles one dispatch (POST; any path).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "dispatches are POSTed")
		return
	}
	body, ok := h.readBody(w, r)
	if !ok {
		return
	}
	if !h.o.skipVerify && !executor.Verify(h.secret, body, r.Header.Get(executor.HeaderSignature)) {
		writeError(w, http.StatusUnauthorized, "bad_signature", "Sluice-Signature does not match the body")
		return
	}
	j, audience, err := decodeJob(body, r.Header.Get(executor.HeaderJobID))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	if h.o.onReceive != nil {
		h.o.onReceive(j)
	}
	if h.o.audience != "" && audience != h.o.audience {
		writeError(w, http.StatusForbidden, "wrong_audience",
			fmt.Sprintf("the dispatch is meant for executor %q, not %q", audience, h.o.audience))
		return
	}
	now := time.Now()
	if !j.Deadline.IsZero() && !now.Before(j.Deadline) {
		writeError(w, http.StatusConflict, "deadline_passed", "the dispatch's deadline has passed")
		return
	}
	if !h.seen.add(j.Nonce, j.Deadline, now) {
		writeError(w, http.StatusConflict, "replayed", "this dispatch's nonce was already received")
		return
	}
	release, ok := h.acquire()
	if !ok {
		retry := retrySeconds(h.o.busyRetry)
		w.Header().Set("Retry-After", strconv.Itoa(retry))
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"error_code": "busy",
			"message": "every slot of the executor is taken", "retry_after": retry})
		return
	}
	h.serve(w, r, j, release)
}

// readBody reads the dispatch's body within MaxDispatchBytes and MaxConcurrentReads; false when
// it answered the dispatch instead. A declared length over the limit is refused unread.
func (h *Handler) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	limit := h.o.maxDispatch
	if r.ContentLength > limit {
		writeError(w, http.StatusRequestEntityTooLarge, "payload_too_large",
			fmt.Sprintf("the dispatch is over %d bytes (kit.MaxDispatchBytes)", limit))
		return nil, false
	}
	select {
	case h.reads <- struct{}{}:
		defer func() { <-h.reads }()
	default:
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "busy", "too many dispatches are being read")
		return nil, false
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	switch {
	case err != nil:
		writeError(w, http.StatusBadRequest, "invalid_request", "read the dispatch: "+err.Error())
		return nil, false
	case int64(len(body)) > limit:
		writeError(w, http.StatusRequestEntityTooLarge, "payload_too_large",
			fmt.Sprintf("the dispatch is over %d bytes (kit.MaxDispatchBytes)", limit))
		return nil, false
	}
	return body, true
}

// serve takes a job that passed the checks and holds a slot (release gives it back) through its
// start confirmation to its answer.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request, j Job, release func()) {
	if h.o.beforeStart != nil {
		if o := h.o.beforeStart(r.Context(), j); o != nil {
			release()
			h.answer(w, j, *o)
			return
		}
	}
	async := h.o.async != nil && h.o.async(j)
	if !h.admit(async) {
		// Refused before the start: sluice queues the job again without spending its budget.
		release()
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "stopping", "the executor is stopping")
		return
	}
	if !h.o.unconfirmed {
		// The confirmation runs under the Handler, not the dispatch's connection: once the API
		// may have recorded the start, a lost connection must not cut the confirmation short.
		ctx, cancel := context.WithTimeout(h.base, confirmTimeout)
		err := h.confirm(ctx, j)
		cancel()
		if err != nil {
			release()
			if async {
				h.async.Done()
			}
			if h.o.onRefused != nil {
				h.o.onRefused(j, err)
			}
			h.o.log.Info("start refused; not running the job", "job_id", j.ID, "error", err)
			writeError(w, http.StatusConflict, "start_refused", err.Error())
			return
		}
	}
	if async {
		go func() {
			defer h.async.Done()
			o := h.call(h.base, j)
			release()
			h.report(j, o)
		}()
		writeJSON(w, http.StatusAccepted, map[string]any{"accepted": true})
		return
	}
	o := h.call(r.Context(), j)
	release()
	if r.Context().Err() != nil {
		h.o.log.Info("the dispatch's connection ended before the outcome; it is not delivered", "job_id", j.ID)
	}
	h.answer(w, j, o)
}

// decodeJob reads a dispatch body and the audience it names. jobIDHeader, when set, must name the
// body's job.
func decodeJob(body []byte, jobIDHeader string) (Job, string, error) {
	var d executor.Dispatch
	if err := json.Unmarshal(body, &d); err != nil {
		return Job{}, "", fmt.Errorf("the dispatch is not JSON: %w", err)
	}
	switch {
	case d.JobID <= 0:
		return Job{}, "", errors.New("the dispatch has no job_id")
	case d.Nonce == "":
		return Job{}, "", errors.New("the dispatch has no nonce")
	case jobIDHeader != "" && jobIDHeader != strconv.FormatInt(d.JobID, 10):
		return Job{}, "", fmt.Errorf("%s %q does not match job_id %d", executor.HeaderJobID, jobIDHeader, d.JobID)
	}
	j := Job{ID: d.JobID, Tenant: d.Tenant, Payload: d.Payload, Nonce: d.Nonce, Deadline: d.Deadline,
		Version: d.Version, Attempt: d.Attempt}
	if d.RateKeySHA256 != nil {
		j.RateKeySHA256 = *d.RateKeySHA256
	}
	if string(j.Payload) == "null" {
		j.Payload = nil
	}
	return j, d.Audience, nil
}

// acquire takes a slot; false when all are taken. release is idempotent.
func (h *Handler) acquire() (release func(), ok bool) {
	if h.slots == nil {
		return func() {}, true
	}
	select {
	case h.slots <- struct{}{}:
		var once sync.Once
		return func() { once.Do(func() { <-h.slots }) }, true
	default:
		return nil, false
	}
}

// admit reports whether a job may start (the Handler is not closed) and counts it among the
// asynchronous jobs if async.
func (h *Handler) admit(async bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	if async {
		h.async.Add(1)
	}
	return true
}

// call runs the function under the job's deadline and turns a panic into a failure.
func (h *Handler) call(parent context.Context, j Job) (o Outcome) {
	ctx, cancel := parent, context.CancelFunc(func() {})
	if !j.Deadline.IsZero() {
		ctx, cancel = context.WithDeadline(parent, j.Deadline)
	}
	defer cancel()
	defer func() {
		if v := recover(); v != nil {
			h.o.log.Error("the executor's function panicked", "job_id", j.ID, "panic", v, "stack", string(debug.Stack()))
			o = Failed("executor_panic", fmt.Sprint(v))
		}
	}()
	return h.run(ctx, j)
}

// answer writes o as the dispatch's answer.
func (h *Handler) answer(w http.ResponseWriter, j Job, o Outcome) {
	if o.RetryAfter > 0 {
		retry := retrySeconds(o.RetryAfter)
		w.Header().Set("Retry-After", strconv.Itoa(retry))
		writeJSON(w, http.StatusTooManyRequests, map[string]any{"error_code": codeRateLimited,
			"message": "the upstream refused the work", "retry_after": retry})
		return
	}
	status, code, msg := settle(o)
	body := map[string]any{"status": status}
	if code != "" {
		body["error_code"] = code
	}
	if msg != "" {
		body["error_message"] = msg
	}
	if len(o.Result) > 0 {
		body["result"] = o.Result
	}
	writeJSON(w, http.StatusOK, body)
}

// settle returns o's status, error code and message, an invalid status made a failure.
func settle(o Outcome) (status, code, msg string) {
	switch o.Status {
	case "", StatusSucceeded:
		return StatusSucceeded, o.ErrorCode, o.ErrorMessage
	case StatusFailed:
		return StatusFailed, o.ErrorCode, o.ErrorMessage
	default:
		return StatusFailed, "invalid_outcome", fmt.Sprintf("the executor returned status %q", o.Status)
	}
}

// retrySeconds is d in whole seconds, rounded up, within SPEC §5's 1 to 86,400.
func retrySeconds(d time.Duration) int {
	s := (d + time.Second - 1) / time.Second
	return int(min(max(s, 1), maxRetryAfter))
}

// Close stops the asynchronous jobs (their context ends) and any report or start confirmation
// under way, and waits for them. Later dispatches are answered 503 before their start.
// Idempotent.
func (h *Handler) Close() {
	h.stop()
	h.cancel()
	h.async.Wait()
}

// Shutdown stops taking jobs (later dispatches are answered 503 before their start) and waits
// for the asynchronous jobs under way to finish and be reported, until ctx ends; then it closes
// the Handler (Close). It returns ctx's error if it had to cut them short. Synchronous jobs end
// with their dispatch's connection: http.Server.Shutdown waits for them.
func (h *Handler) Shutdown(ctx context.Context) error {
	h.stop()
	done := make(chan struct{})
	go func() {
		h.async.Wait()
		close(done)
	}()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	h.Close()
	return err
}

func (h *Handler) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]any{"error_code": code, "message": msg})
}
