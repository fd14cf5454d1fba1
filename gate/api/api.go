// Package api is sluice's HTTP face (SPEC §6): routing, authentication, request decoding and
// the one table that maps error codes to HTTP statuses. The decisions are gate's and the
// fenced writes gate/store's; this package only translates.
package api

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/console"
	"github.com/sluicehq/sluice/gate/groupcommit"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/rategate"
	"github.com/sluicehq/sluice/gate/sqldb"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/gate/waiters"
	"github.com/sluicehq/sluice/outbox"
)

// Config configures the API server.
type Config struct {
	// DB is the sluice database. Required.
	DB *sql.DB
	// TxDB is the pool of the API's own transactions that send several statements in one round
	// trip (the start confirmations): an OpenMulti pool. Default: the Admitter's.
	TxDB *sql.DB
	// Admitter admits jobs. Required.
	Admitter *gate.Admitter
	// Limits supplies the runtime configuration. Required.
	Limits *config.Cache
	// Tokens authenticates callers. Required.
	Tokens *Tokens
	// Clock judges nonce TTLs. Default: the database's clock, followed by clock.Synced.
	Clock clock.Clock
	// Gatherer serves /metrics. Default: an empty registry.
	Gatherer prometheus.Gatherer
	// Ready reports readiness for /readyz. Default: always ready. /readyz shows anyone only the
	// reason word of a *NotReadyError it returns (ReadyReasonUnknown for any other error) and
	// logs the error itself.
	Ready func(ctx context.Context) error
	// Components, if set, reports the optional dependencies (NATS, memcached) in /readyz; they
	// never make the process unready, since sluice works without them.
	Components func(ctx context.Context) map[string]any
	// Status serves GET /v1/status, and GET /v1/tenants if it implements TenantsReader.
	// Default: the database part only (broker and memcached reported down).
	Status StatusReader
	// Published is called with the outbox rows a start or completion wrote (the fast path).
	Published func([]outbox.Row)
	// Log receives request errors. Default: discard.
	Log *slog.Logger
	// RateGates is the rate-gate store behind /v1/gates and the gate field of /complete. Default:
	// none (those endpoints answer 503 unavailable, /complete ignores its gate).
	RateGates *rategate.Store
	// FailedAuthPerMinute is how many failed authentications one source address (an IPv4
	// address, an IPv6 /64) may make per minute; past it, its requests that fail to
	// authenticate answer 429 rate_limited with Retry-After instead of 401. Requests with a
	// valid token are never limited. Default DefaultFailedAuthPerMinute; negative: no limit.
	FailedAuthPerMinute int
	// FailedAuthSources bounds how many source addresses the limit remembers; the one that
	// failed least recently is forgotten first. Default DefaultFailedAuthSources.
	FailedAuthSources int
	// MetricsToken, if set, is the bearer token a scrape of /metrics must carry (SLUICE_METRICS_TOKEN).
	MetricsToken string
	// MetricsElsewhere, if set, is the address /metrics is served on instead of this listener
	// (SLUICE_METRICS_LISTEN); here it answers 404 naming it.
	MetricsElsewhere string
	// ReleasesPerMinute is how many capacity-release events (POST /v1/releases) one caller may
	// write per minute; past it they answer 429 rate_limited with Retry-After and write nothing.
	// Default DefaultReleasesPerMinute; negative: no limit.
	ReleasesPerMinute int
	// MaxRequests bounds the requests in progress at once, other than the executor's
	// callbacks (/start, /complete) and the probes (/healthz, /readyz), which are never
	// counted: past it a request answers 503 busy with Retry-After at once, so that slow or
	// hostile callers holding requests open can never take the capacity that the executor
	// needs to report starts and outcomes. Default DefaultMaxRequests; negative: no bound.
	MaxRequests int
	// MaxBatches bounds the POST /v1/jobs:batch requests in progress at once: each holds up to
	// 32 MiB of body and about twice that while it is decoded. Past it a batch answers 503 busy
	// with Retry-After before its body is read. Default DefaultMaxBatches; negative: no bound.
	MaxBatches int
	// MemoryBudget bounds the bytes that request bodies and pages of jobs in progress hold
	// together, process-wide (SLUICE_MEMORY_BUDGET): a body is charged twice its Content-Length
	// before it is read (as it arrives, when its length is unknown), a page of GET /v1/jobs
	// twice its rows' estimate before it is read and twice its results once their size is
	// known. Past it a request answers 503 busy with Retry-After and writes nothing. The
	// executor's callbacks are charged but never refused: they must get through, and the jobs
	// in flight bound them. A request larger than the whole budget passes when nothing else is
	// charged. Default DefaultMemoryBudget; negative: no budget.
	MemoryBudget int64
	// Waiters wakes the requests that wait for a job to change (GET /v1/jobs/{id}?wait=, POST
	// /v1/jobs?wait=, the events stream with follow=1). Its owner runs its backstop and feeds it
	// the release pokes. Default: a hub reading DB, with the default bounds.
	Waiters *waiters.Hub
	// CORSOrigins are the browser origins allowed to call the API (SLUICE_CORS_ORIGINS): a
	// request from one of them is answered with Access-Control-Allow-Origin and the capacity
	// headers exposed, and its preflight is answered. "*" allows every origin. Default none.
	CORSOrigins []string
	// Simulate serves POST /v1/config/simulate: a window of the audit trail replayed under the
	// configuration in force and under it with changes (cmd/sluice/app wires drainer/simulate's
	// RunRecorded). Default none: the endpoint answers 503 unavailable.
	Simulate SimulateFunc
}

// DefaultMaxBatches is Config.MaxBatches' default: four batches of the largest size hold about
// 256 MiB at most.
const DefaultMaxBatches = 4

// DefaultMaxRequests is Config.MaxRequests' default: well below a process's connection bound
// (cmd/sluice/app's DefaultMaxConns), so that the executor's callbacks keep connections and
// goroutines of their own however many other requests are held open.
const DefaultMaxRequests = 512

// unbounded are the routes Config.MaxRequests never counts: the executor's callbacks, which
// must get through for jobs to finish, and the probes, so that a load balancer does not take a
// busy process for a dead one.
var unbounded = map[string]bool{
	"POST /v1/jobs/{id}/start":    true,
	"POST /v1/jobs/{id}/complete": true,
	"GET /healthz":                true,
	"GET /readyz":                 true,
}

// Server serves the API. Safe for concurrent use.
type Server struct {
	cfg       Config
	store     *store.Store
	mux       *http.ServeMux
	authFails *bucketLimiter
	releases  *bucketLimiter // nil: no limit  // nil: no limit
	requests  chan struct{}  // a slot per request in progress that MaxRequests counts; nil: no bound
	batches   chan struct{}  // a slot per batch in progress (MaxBatches); nil: no bound
	budget    *memBudget     // MemoryBudget; nil: none
	// simulations holds a slot per POST /v1/config/simulate in progress (maxSimulations).
	simulations chan struct{}
	// starts commits concurrent start confirmations together (confirmStarts).
	starts *groupcommit.Group[*store.Start]
	// waiters wakes the requests that wait for a job to change (wait.go).
	waiters *waiters.Hub
}

// New returns a Server, or an "invalid config" error naming the field.
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.DB == nil:
		return nil, errors.New("invalid config: DB: required")
	case cfg.Admitter == nil:
		return nil, errors.New("invalid config: Admitter: required")
	case cfg.Limits == nil:
		return nil, errors.New("invalid config: Limits: required")
	case cfg.Tokens == nil:
		return nil, errors.New("invalid config: Tokens: required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.NewDBSynced(cfg.DB)
	}
	if cfg.TxDB == nil {
		cfg.TxDB = cfg.Admitter.TxDB()
	}
	if cfg.Gatherer == nil {
		cfg.Gatherer = prometheus.NewRegistry()
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, store: cfg.Admitter.Store(), mux: http.NewServeMux(),
		authFails: newBucketLimiter(cfg.FailedAuthPerMinute, cfg.FailedAuthSources, nil)}
	releasesPerMinute := cfg.ReleasesPerMinute
	if releasesPerMinute == 0 {
		releasesPerMinute = DefaultReleasesPerMinute
	}
	s.releases = newBucketLimiter(releasesPerMinute, releaseCallers, nil)
	s.starts = groupcommit.New(startLanes, startGroupSize, func(ctx context.Context, batch []*store.Start) error {
		return s.confirmStarts(ctx, batch, false)
	})
	if cfg.MaxRequests == 0 {
		cfg.MaxRequests = DefaultMaxRequests
	}
	if cfg.MaxRequests > 0 {
		s.requests = make(chan struct{}, cfg.MaxRequests)
	}
	if cfg.MemoryBudget == 0 {
		cfg.MemoryBudget = DefaultMemoryBudget
	}
	if cfg.MemoryBudget > 0 {
		s.budget = &memBudget{limit: cfg.MemoryBudget}
	}
	if cfg.MaxBatches == 0 {
		cfg.MaxBatches = DefaultMaxBatches
	}
	if cfg.MaxBatches > 0 {
		s.batches = make(chan struct{}, cfg.MaxBatches)
	}
	s.simulations = make(chan struct{}, maxSimulations)
	if s.waiters = cfg.Waiters; s.waiters == nil {
		var err error
		if s.waiters, err = NewWaiters(cfg.DB, waiters.Config{Log: cfg.Log}); err != nil {
			return nil, err
		}
	}
	s.routes()
	return s, nil
}

// Routes lists every method and path of the API the server registers; the OpenAPI test checks
// it. The console's files under /ui/ are not part of the API and not listed.
func (s *Server) Routes() []string { return routeList }

var routeList = []string{
	"POST /v1/jobs",
	"POST /v1/jobs:batch",
	"GET /v1/jobs",
	"POST /v1/jobs/{id}/redrive",
	"GET /v1/jobs/{id}",
	"GET /v1/jobs/{id}/events",
	"DELETE /v1/jobs/{id}",
	"POST /v1/jobs/{id}/start",
	"POST /v1/jobs/{id}/complete",
	"POST /v1/gates",
	"GET /v1/gates",
	"DELETE /v1/gates/{rate_key_sha256}",
	"GET /healthz",
	"GET /readyz",
	"GET /metrics",
	"POST /v1/releases",
	"GET /v1/status",
	"GET /v1/tenants",
	"GET /v1/config",
	"PATCH /v1/config",
	"POST /v1/config/simulate",
	"GET /v1/config/history",
	"GET /v1/whoami",
	"GET /v1/audit",
	"POST /v1/slots",
	"GET /v1/slots",
	"POST /v1/slots/{id}/renew",
	"DELETE /v1/slots/{id}",
}

func (s *Server) routes() {
	s.mux.HandleFunc("POST /v1/jobs", s.auth(s.admit, Producer))
	s.mux.HandleFunc("POST /v1/jobs:batch", s.auth(s.admitBatch, Producer))
	s.mux.HandleFunc("GET /v1/jobs", s.auth(s.list, Producer))
	s.mux.HandleFunc("POST /v1/jobs/{id}/redrive", s.auth(s.redrive))
	s.mux.HandleFunc("GET /v1/jobs/{id}", s.auth(s.getJob, Producer))
	s.mux.HandleFunc("GET /v1/jobs/{id}/events", s.auth(s.jobEvents, Producer))
	s.mux.HandleFunc("GET /v1/audit", s.auth(s.listAudit, Admin))
	s.mux.HandleFunc("DELETE /v1/jobs/{id}", s.auth(s.cancel, Producer))
	s.mux.HandleFunc("POST /v1/jobs/{id}/start", s.auth(s.start, Executor))
	s.mux.HandleFunc("POST /v1/jobs/{id}/complete", s.auth(s.complete, Executor))
	s.mux.HandleFunc("POST /v1/gates", s.auth(s.setGate, Executor))
	s.mux.HandleFunc("GET /v1/gates", s.auth(s.listGates, Admin))
	s.mux.HandleFunc("DELETE /v1/gates/{rate_key_sha256}", s.auth(s.clearGate, Admin))
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok"})
	})
	s.mux.HandleFunc("GET /readyz", s.readyz)
	if s.cfg.MetricsElsewhere != "" {
		s.mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
			s.fail(w, r, job.Errorf(job.CodeNotFound, "metrics are served on %s (SLUICE_METRICS_LISTEN)", s.cfg.MetricsElsewhere))
		})
	} else {
		s.mux.Handle("GET /metrics", MetricsHandler(s.cfg.Gatherer, s.cfg.MetricsToken))
	}
	s.mux.HandleFunc("POST /v1/releases", s.auth(s.release, Executor))
	s.mux.HandleFunc("GET /v1/status", s.auth(s.getStatus, Admin))
	s.mux.HandleFunc("GET /v1/tenants", s.auth(s.listTenants, Admin))
	s.mux.HandleFunc("GET /v1/config", s.auth(s.getConfig, Admin))
	s.mux.HandleFunc("PATCH /v1/config", s.auth(s.patchConfig, Admin))
	s.mux.HandleFunc("POST /v1/config/simulate", s.auth(s.simulateConfig, Admin))
	s.mux.HandleFunc("GET /v1/config/history", s.auth(s.configHistory, Admin))
	s.mux.HandleFunc("GET /v1/whoami", s.auth(s.whoami, Producer, Executor))
	s.mux.HandleFunc("POST /v1/slots", s.auth(s.takeSlot, Producer))
	s.mux.HandleFunc("GET /v1/slots", s.auth(s.listSlots, Admin))
	s.mux.HandleFunc("POST /v1/slots/{id}/renew", s.auth(s.renewSlot, Producer))
	s.mux.HandleFunc("DELETE /v1/slots/{id}", s.auth(s.releaseSlot, Producer))
	// The operator console: static files, no token needed to load them (they hold no data;
	// the console sends the operator's token with each API call).
	s.mux.Handle("GET "+console.Prefix, console.Handler())
}

// ServeHTTP implements http.Handler. A request no route takes is answered before
// authentication: 405 method_not_allowed with an Allow header for a known path and another
// method, 404 not_found for an unknown path.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.cors(w, r) {
		return
	}
	// No method-less catch-all is registered, because it would match every method of every
	// path and hide the mux's own 405. The mux's answers for a miss are plain text, so they
	// are rewritten as JSON errors; its redirects to a cleaned path pass through. A matched
	// request goes through the mux's ServeHTTP, since only that sets its path values.
	h, pattern := s.mux.Handler(r)
	if pattern == "" {
		h.ServeHTTP(&routeMiss{ResponseWriter: w, s: s, r: r}, r)
		return
	}
	if !unbounded[pattern] {
		if !s.acquire(w, r, s.requests, "too many requests in progress; retry shortly") {
			return
		}
		// The slot rides the response writer rather than the request's context: a context value
		// would copy every request, a cost every admission would pay, for the few requests that
		// wait and give it back (wait.go).
		sw := &slotWriter{ResponseWriter: w, slot: requestSlot{sem: s.requests}}
		defer sw.slot.release()
		w = sw
	}
	s.mux.ServeHTTP(w, r)
}

// acquire takes a slot of sem (nil: no bound) without waiting, or answers 503 busy with
// Retry-After 1 and message and reports false.
func (s *Server) acquire(w http.ResponseWriter, r *http.Request, sem chan struct{}, message string) bool {
	if sem == nil {
		return true
	}
	select {
	case sem <- struct{}{}:
		return true
	default:
		s.fail(w, r, busy(message))
		return false
	}
}

// busy is the 503 busy answer of a bound that is full: retry in a second.
func busy(message string) error {
	return &job.Error{Code: job.CodeBusy, Message: message, Detail: map[string]any{"retry_after": 1, "retryable": true}}
}

// release gives back a slot that acquire took.
func release(sem chan struct{}) {
	if sem != nil {
		<-sem
	}
}

// routeMiss turns the mux's 404 and 405 into the SPEC §6 error body, keeping the Allow header
// the mux set, and discards the mux's plain-text body.
type routeMiss struct {
	http.ResponseWriter
	s       *Server
	r       *http.Request
	written bool
}

func (m *routeMiss) WriteHeader(status int) {
	var err error
	switch status {
	case http.StatusNotFound:
		err = job.Errorf(job.CodeNotFound, "no such endpoint: %s %s", m.r.Method, m.r.URL.Path)
	case http.StatusMethodNotAllowed:
		err = job.Errorf(job.CodeMethodNotAllowed, "%s is not allowed on %s; allowed: %s",
			m.r.Method, m.r.URL.Path, m.Header().Get("Allow"))
	default:
		m.ResponseWriter.WriteHeader(status)
		return
	}
	m.written = true
	m.s.fail(m.ResponseWriter, m.r, err)
}

func (m *routeMiss) Write(p []byte) (int, error) {
	if m.written {
		return len(p), nil
	}
	return m.ResponseWriter.Write(p)
}

type callerKey struct{}

// auth wraps h: 401 without a valid token, 403 for a role that may not call it. Admin may call
// everything.
func (s *Server) auth(h http.HandlerFunc, roles ...Role) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, ok := s.cfg.Tokens.Authenticate(r)
		if !ok {
			if wait, limited := s.authFails.take(sourceOf(r)); limited {
				s.fail(w, r, &job.Error{Code: job.CodeRateLimited,
					Message: "too many failed authentications from this address; retry later with a valid token",
					Detail:  map[string]any{"retry_after": wait}})
				return
			}
			s.fail(w, r, job.Errorf(job.CodeUnauthorized, "a valid bearer token is required"))
			return
		}
		allowed := c.Role == Admin
		for _, role := range roles {
			allowed = allowed || c.Role == role
		}
		if !allowed {
			s.fail(w, r, job.Errorf(job.CodeForbidden, "role %s may not call %s %s", c.Role, r.Method, r.Pattern))
			return
		}
		// The caller is the actor of the audit rows the request writes (SPEC §10). The hold
		// is what its body and page take of the memory budget: every route that reads a body
		// or builds a page is authenticated, so it is attached here, with the caller.
		hold := &memHold{b: s.budget, force: unbounded[r.Pattern]}
		defer hold.release()
		ctx := context.WithValue(context.WithValue(r.Context(), callerKey{}, c), holdKey{}, hold)
		h(w, r.WithContext(store.WithActor(ctx, c.Name)))
	}
}

func callerOf(r *http.Request) Caller {
	c, _ := r.Context().Value(callerKey{}).(Caller)
	return c
}

// statusOf is the one table from error codes to HTTP statuses.
var statusOf = map[job.Code]int{
	job.CodeInvalidRequest:      http.StatusBadRequest,
	job.CodeUnauthorized:        http.StatusUnauthorized,
	job.CodeForbidden:           http.StatusForbidden,
	job.CodeNotFound:            http.StatusNotFound,
	job.CodeMethodNotAllowed:    http.StatusMethodNotAllowed,
	job.CodePayloadTooLarge:     http.StatusRequestEntityTooLarge,
	job.CodeQueueFull:           http.StatusTooManyRequests,
	job.CodeCapacityExceeded:    http.StatusTooManyRequests,
	job.CodeRateLimited:         http.StatusTooManyRequests,
	job.CodeDeadlineUnreachable: http.StatusTooManyRequests,
	job.CodeIdempotencyConflict: http.StatusConflict,
	job.CodeNotCancelable:       http.StatusConflict,
	job.CodeNotRedrivable:       http.StatusConflict,
	job.CodeSlotLost:            http.StatusGone,
	job.CodeBusy:                http.StatusServiceUnavailable,
	job.CodeNonceInvalid:        http.StatusConflict,
	job.CodeNonceExpired:        http.StatusConflict,
	job.CodeNonceUsed:           http.StatusConflict,
	job.CodeDispatchVoid:        http.StatusConflict,
	job.CodeOutcomeConflict:     http.StatusConflict,
	job.CodeUnavailable:         http.StatusServiceUnavailable,
	job.CodeOutcomeUnknown:      http.StatusServiceUnavailable,
	job.CodeInternal:            http.StatusInternalServerError,
}

// fail writes err as the SPEC §6 error body (see errorBody), with Retry-After when the error
// carries one.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	status, body := s.errorBody(r, err)
	if ra, ok := body["retry_after"].(int); ok && ra > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(ra))
	}
	writeJSON(w, status, body)
}

// errorBody returns the HTTP status and SPEC §6 error body of err, for a whole request or one
// batch item. Anything that is not a *job.Error is an internal error: the client sees a generic
// message, the log the whole error.
func (s *Server) errorBody(r *http.Request, err error) (int, map[string]any) {
	var je *job.Error
	if errors.Is(err, store.ErrNotFound) {
		je = job.Errorf(job.CodeNotFound, "no such job")
	} else if !errors.As(err, &je) {
		s.cfg.Log.Error("request failed", "method", r.Method, "path", r.URL.Path, "error", err)
		je = job.Errorf(job.CodeInternal, "internal error")
	} else if je.Err != nil {
		s.cfg.Log.Warn("request failed", "method", r.Method, "path", r.URL.Path, "code", je.Code, "error", je.Err)
	}
	status, ok := statusOf[je.Code]
	if !ok {
		status = http.StatusInternalServerError
	}
	body := map[string]any{}
	for k, v := range je.Detail {
		body[k] = v
	}
	body["error_code"] = je.Code
	body["message"] = je.Message
	return status, body
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v)
}

// writeJob answers j as writeJSON would, in bytes job.Job.AppendJSON writes once: writeJSON
// has encoding/json validate and compact a MarshalJSON's output a second time.
func writeJob(w http.ResponseWriter, status int, j job.Job) {
	b, err := j.AppendJSON(make([]byte, 0, 512))
	if err != nil {
		writeJSON(w, status, j) // fails the same way, as it always did
		return
	}
	writeBytes(w, status, append(b, '\n'))
}

// writeBatch answers a batch's items as writeJSON(map{"results": items}) would (writeJob).
func writeBatch(w http.ResponseWriter, items []job.BatchItem) {
	b := make([]byte, 0, 16+640*len(items))
	b = append(b, `{"results":[`...)
	for i, it := range items {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = it.AppendJSON(b); err != nil {
			writeJSON(w, http.StatusOK, map[string]any{"results": items})
			return
		}
	}
	writeBytes(w, http.StatusOK, append(b, "]}\n"...))
}

func writeBytes(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// bodyOverhead is what a request body may carry beyond its payload (tenant, keys, framing).
const bodyOverhead = 16 << 10

// readBody reads at most limit bytes of r's body; more is payload_too_large. A body that is not
// valid UTF-8 is refused before decoding, because encoding/json would silently replace the bad
// bytes.
func readBody(r *http.Request, limit int) ([]byte, error) {
	data, err := readRaw(r, limit)
	if err != nil {
		return nil, err
	}
	if !utf8.Valid(data) {
		return nil, job.Invalid("body", "the request body is not valid UTF-8")
	}
	return data, nil
}

// decode unmarshals data into v and names the offending field of a type error.
func decode(data []byte, v any) error {
	if err := json.Unmarshal(data, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			field := te.Field
			if field == "" {
				field = "body"
			}
			return job.Invalid(field, "%s must be a JSON %s", field, jsonKind(te.Type.Kind().String()))
		}
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return job.Invalid("body", "malformed JSON at byte %d: %v", se.Offset, err)
		}
		return job.Invalid("body", "malformed JSON: %v", err)
	}
	return nil
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "string"
	case "bool":
		return "boolean"
	case "int", "int64", "float64", "uint":
		return "number"
	case "struct", "map":
		return "object"
	case "slice":
		return "array"
	case "ptr":
		return "value of the documented type"
	}
	return goKind
}

func pathID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, job.Errorf(job.CodeNotFound, "no such job")
	}
	return id, nil
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	body := map[string]any{"status": "ready", "ready": true}
	if s.cfg.Components != nil {
		for k, v := range s.cfg.Components(r.Context()) {
			body[k] = v
		}
	}
	if s.cfg.Ready != nil {
		if err := s.cfg.Ready(r.Context()); err != nil {
			// No token is needed here: the answer names a reason word, the error goes to the log.
			NotReadyBody(body, err)
			s.cfg.Log.Warn("not ready", "reason", body["reason"], "error", err)
			writeJSON(w, http.StatusServiceUnavailable, body)
			return
		}
	}
	writeJSON(w, http.StatusOK, body)
}

// inTx runs fn in a transaction for a request that is safe to repeat (/start, /complete,
// cancel, /v1/releases). A database that cannot be reached or a connection lost before COMMIT
// is 503 unavailable, retryable: nothing was written. A connection lost during COMMIT is 503
// outcome_unknown, retryable too, since a repeat of the request finds the change made or makes
// it (a second release poke is harmless: pokes are hints); admission answers the same for a
// keyed request.
func (s *Server) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.cfg.DB.BeginTx(ctx, nil)
	if err != nil {
		return gate.AsUnavailable(fmt.Errorf("begin: %w", err))
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return gate.AsUnavailable(err)
	}
	if err := tx.Commit(); err != nil {
		err = fmt.Errorf("commit: %w", err)
		if sqldb.ConnectionLost(err) {
			return outcomeUnknown(err)
		}
		return err
	}
	return nil
}

// outcomeUnknown is the answer to a request safe to repeat whose COMMIT lost its connection.
func outcomeUnknown(err error) error {
	return &job.Error{Code: job.CodeOutcomeUnknown, Err: err,
		Message: "the database connection broke during commit; the change may or may not have been made, and repeating the request is safe",
		Detail:  map[string]any{"retryable": true}}
}
