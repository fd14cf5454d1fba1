// Package gate is sluice's front door and policy: admission (validation, idempotent replay,
// the admission rate limit with refund, depth caps, immediate-or-refuse, the rollout mode),
// batch admission and redrive, reading, listing and cancelling jobs. Its HTTP face is gate/api;
// the runtime limits it enforces are in gate/config, the rate-limit counters in gate/admitrate.
package gate

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/sluicehq/sluice/gate/admitrate"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/sqldb"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/outbox"
)

// RateLimiter is the admission rate limit's counter store (gate/admitrate over memcached). An
// error means "unknown": admission fails open.
type RateLimiter interface {
	// Reserve takes up to n units of tenant's budget of limit per minute at now.
	Reserve(ctx context.Context, tenant string, n, limit int, now time.Time) (*admitrate.Reservation, error)
}

// RateGateLookup reads rate gates (SPEC §5), for queue=false admissions. Implementations fail open:
// an error makes admission treat the keys as not gated.
type RateGateLookup interface {
	// NotBefore returns the gate instant of each gated key among hashes.
	NotBefore(ctx context.Context, hashes []string) (map[string]time.Time, error)
}

// Config configures an Admitter. Field docs give the defaults.
type Config struct {
	// DB is the sluice database, for reads (a job, a listing). Required.
	DB *sql.DB
	// TxDB is the pool of the admission transactions, which send several statements in one
	// round trip (store.OpenMulti); DB may refuse them (store.Open). Default DB, which must then
	// take them.
	TxDB *sql.DB
	// Limits supplies the runtime configuration. Required.
	Limits *config.Cache
	// Prefix is the NATS subject prefix. Default "sluice".
	Prefix string
	// Log receives warnings and job transitions. Default: discard.
	Log *slog.Logger
	// Published, if set, is called after every commit with the outbox rows it wrote: the fast
	// path that publishes them at once. It must not block.
	Published func([]outbox.Row)
	// TxAttempts bounds retries of a transaction that hit a deadlock or lock wait timeout.
	// Default 3.
	TxAttempts int
	// Metrics, if set, counts admissions and depth cap refusals.
	Metrics *Metrics
	// JobMetrics, if set, counts the rejected rows admission writes, and whatever the API ends
	// through Store (completions, cancels). A process shares one with its drainer
	// (store.Metrics). Default none: nothing is counted.
	JobMetrics *store.Metrics
	// FailOpenMetrics, if set, counts rate-limiter and gate-lookup failures admission survived.
	FailOpenMetrics *FailOpenMetrics
	// RateLimiter enforces admission_rate_per_minute (a *admitrate.Limiter; a nil one counts as
	// none). Default none: the limit is not enforced (and a warning is logged once when it is
	// configured).
	RateLimiter RateLimiter
	// RateGates lets queue=false admissions refuse a gated rate key (scope rate_key). Default none:
	// keys are treated as not gated.
	RateGates RateGateLookup
	// Clock is the admission's one clock besides the database's: it dates rate-limit windows
	// and gate instants (both live in memcached, which has no clock of its own), the global
	// depth estimate's refresh and the pacing of fail-open log lines. Job times are the
	// database's (UTC_TIMESTAMP(6), read with the admission state). Default clock.Host.
	Clock clock.Clock
	// GlobalDepthRefresh is how long a counted global queued depth may stand in for a new
	// count while it is well below the cap (see depthEstimate). Default 250 ms; negative counts
	// on every admission.
	GlobalDepthRefresh time.Duration
	// Lanes is the most single admissions one process decides at once, each in its own
	// transaction: one lane while it keeps up (and a second overlapping its COMMIT), more for
	// admissions that waited LaneStall; admissions that arrive while the open lanes are busy
	// share the next transaction (see combiner). Default 2.
	Lanes int
	// LaneStall is how long single admissions wait for the running lane before another of the
	// Lanes opens: while one lane keeps up, admissions that arrive share its next transaction
	// rather than start one of their own (see combiner). Default 5 ms, several single
	// admissions' transactions; negative opens every lane at once.
	LaneStall time.Duration
	// Audit, if set, takes the audit events of refusals and replays, which write nothing else
	// (SPEC §10). Default none: only the decisions admission writes rows for are audited.
	Audit *store.AuditQueue
	// AuditOff writes no audit row for admissions, and none for the transitions the Admitter's
	// Store writes (store.Store.AuditOff); Audit is then not used. Not a setting: it exists only
	// for the benchmarks' same-run comparison of the audit trail's cost. Default false.
	AuditOff bool
	// Faults injects failures for tests. Default none.
	Faults *Faults
}

// Admitter admits jobs. Safe for concurrent use.
type Admitter struct {
	cfg     Config
	store   *store.Store
	stmts   *store.StmtCache
	depth   depthEstimate
	combine combiner

	slotRefusals recentRefusals

	logMu        sync.Mutex
	lastFailOpen time.Time
	warnedNoRL   bool
}

// New returns an Admitter, or an "invalid config" error naming the field.
func New(cfg Config) (*Admitter, error) {
	if cfg.DB == nil {
		return nil, errors.New("invalid config: DB: required")
	}
	if cfg.Limits == nil {
		return nil, errors.New("invalid config: Limits: required")
	}
	if cfg.TxDB == nil {
		cfg.TxDB = cfg.DB
	}
	if cfg.Prefix == "" {
		cfg.Prefix = outbox.DefaultPrefix
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.TxAttempts <= 0 {
		cfg.TxAttempts = 3
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Host{}
	}
	if l, ok := cfg.RateLimiter.(*admitrate.Limiter); ok && l == nil {
		cfg.RateLimiter = nil // an interface holding a nil pointer is not "none"
	}
	if cfg.GlobalDepthRefresh == 0 {
		cfg.GlobalDepthRefresh = 250 * time.Millisecond
	}
	if cfg.Lanes <= 0 {
		cfg.Lanes = 2
	}
	if cfg.LaneStall == 0 {
		cfg.LaneStall = 5 * time.Millisecond
	}
	a := &Admitter{cfg: cfg, store: &store.Store{Prefix: cfg.Prefix, Log: cfg.Log, Metrics: cfg.JobMetrics, AuditOff: cfg.AuditOff,
		ChargeTime: func() bool { return cfg.Limits.Current().Config.Ordering == config.FairTime }}, stmts: store.NewStmtCache(cfg.TxDB),
		combine: combiner{lanes: cfg.Lanes, stallAfter: max(cfg.LaneStall, 0)}}
	a.combine.run = a.run
	return a, nil
}

// Store returns the job store the Admitter writes transitions through.
func (a *Admitter) Store() *store.Store { return a.store }

// TxDB is the pool of the transactions that send several statements in one round trip.
func (a *Admitter) TxDB() *sql.DB { return a.cfg.TxDB }

// Decision is the admission decision of SPEC §5 (the Sluice-Capacity-Decision header); empty
// when the rollout mode is off.
type Decision string

// The decisions of SPEC §5.
const (
	Admitted      Decision = "admitted"
	ShadowRefused Decision = "shadow-refused"
	Refused       Decision = "refused"
)

// Result is an admission's outcome.
type Result struct {
	Job      job.Job
	Replayed bool
	Decision Decision
	// Limit and InFlight describe the tenant's in-flight cap at admission, for the audit trail.
	Limit    int
	InFlight int
	// Verdict is the capacity decision (SPEC §5a) for a job like this one as things stand: the
	// refusing scope of a capacity refusal, else the fullest limit that applies. The headers
	// show it. Zero with the rollout mode off.
	Verdict config.Verdict
}

// ItemResult is one batch item's outcome: a Result, or Err (a *job.Error for refusals).
type ItemResult struct {
	Result
	Err error
}

// MaxBatch is the most jobs one batch may admit (SPEC §6).
const MaxBatch = 1000

// Admit admits req for caller. mayActFor, if set, refuses a tenant the caller may not act for
// with forbidden, once the request is valid (SPEC §5: validation comes before the rest). It
// returns a Result, or a *job.Error: invalid_request, payload_too_large, forbidden,
// idempotency_conflict, rate_limited, queue_full (with a rejected row's id), capacity_exceeded,
// unavailable or outcome_unknown. Nothing is written for a refusal except a queue_full's
// rejected row.
func (a *Admitter) Admit(ctx context.Context, caller string, req Request, mayActFor func(tenant string) bool) (Result, error) {
	cfg := a.cfg.Limits.Current().Config
	it := a.newItem(caller, req, cfg)
	if it.invalid == nil && mayActFor != nil && !mayActFor(req.Tenant) {
		it.invalid = forbiddenTenant()
	}
	if it.invalid != nil {
		a.cfg.Metrics.observe(Result{}, it.invalid)
		return Result{}, it.invalid
	}
	if it.req.refuseIfLate() {
		a.serviceTimes(ctx, []*item{it})
	}
	var err error
	if it.req.ReplaceKey != nil {
		// Alone, not in a combiner group: it locks a job row besides its tenant's, without
		// waiting (store.LockReplaceable), and a group's members must not fail for it.
		err = a.run(ctx, []*item{it}, cfg, false, nil)
	} else {
		err = a.admit(ctx, it, cfg)
	}
	if err != nil {
		a.cfg.Metrics.observe(Result{}, err)
		a.auditOutcome(it, Result{}, err)
		return Result{}, err
	}
	a.cfg.Metrics.observe(it.res, it.err)
	a.auditOutcome(it, it.res, it.err)
	return it.res, it.err
}

// AdmitBatch admits reqs for caller in one transaction and returns one result per request, in
// order, each decided by the same rules as Admit (a later item sees the earlier ones' effect on
// depths). mayActFor, if set, refuses items of other tenants with forbidden. pre, if not nil,
// holds one error per request found while decoding it: such an item fails with that error. The
// error is for the whole batch (invalid_request, unavailable, outcome_unknown, internal): then
// no result is given.
func (a *Admitter) AdmitBatch(ctx context.Context, caller string, reqs []Request, mayActFor func(tenant string) bool, pre []error) ([]ItemResult, error) {
	if len(reqs) > MaxBatch {
		return nil, job.Invalid("jobs", "a batch holds at most %d jobs, got %d", MaxBatch, len(reqs))
	}
	cfg := a.cfg.Limits.Current().Config
	items := make([]*item, len(reqs))
	for i, r := range reqs {
		items[i] = a.newItem(caller, r, cfg)
		if i < len(pre) && pre[i] != nil {
			items[i].invalid = pre[i]
		}
		if items[i].invalid == nil && mayActFor != nil && !mayActFor(r.Tenant) {
			items[i].invalid = forbiddenTenant()
		}
	}
	a.serviceTimes(ctx, items)
	if err := a.run(ctx, items, cfg, false, nil); err != nil {
		a.cfg.Metrics.observe(Result{}, err)
		return nil, err
	}
	out := make([]ItemResult, len(items))
	for i, it := range items {
		err := it.err
		if it.invalid != nil {
			err = it.invalid
		}
		out[i] = ItemResult{Result: it.res, Err: err}
		a.cfg.Metrics.observe(it.res, err)
		a.auditOutcome(it, it.res, err)
	}
	return out, nil
}

// Redrive admits a new job with the tenant, rate key and payload of job id, which must be lost
// or failed, with retry_of = id (SPEC §4). Redriving a job again returns the job its first
// redrive created, with Replayed set. Depth caps apply; the admission rate limit does not (an
// operator's action). Errors: store.ErrNotFound, not_redrivable, queue_full, unavailable,
// outcome_unknown.
func (a *Admitter) Redrive(ctx context.Context, caller string, id int64) (Result, error) {
	old, err := store.Get(ctx, a.cfg.DB, id, false)
	if err != nil {
		if sqldb.ConnectionLost(err) {
			return Result{}, unavailable(err)
		}
		return Result{}, err
	}
	if old.Status != job.Lost && old.Status != job.Failed {
		return Result{}, &job.Error{Code: job.CodeNotRedrivable, Message: "only a lost or failed job can be redriven",
			Detail: map[string]any{"status": old.Status}}
	}
	cfg := a.cfg.Limits.Current().Config
	var lanes []string
	if len(old.Lanes) > 0 {
		lanes = old.Lanes
	}
	interactive, priority := old.Interactive, old.Priority
	it := &item{req: Request{Tenant: old.Tenant, Payload: old.Payload, Lanes: lanes, Interactive: &interactive, Priority: &priority}, hash: old.RateKeySHA256,
		retryOf: &id, noRate: true, caller: old.Caller, actor: caller}
	it.fp = it.req.fingerprint()
	if err := a.run(ctx, []*item{it}, cfg, false, nil); err != nil {
		a.cfg.Metrics.observe(Result{}, err)
		return Result{}, err
	}
	a.cfg.Metrics.observe(it.res, it.err)
	return it.res, it.err
}

func forbiddenTenant() error {
	return job.Errorf(job.CodeForbidden, "this token may not act for that tenant")
}

func (a *Admitter) newItem(caller string, req Request, cfg config.Config) *item {
	it := &item{req: req, caller: caller}
	if err := it.req.Validate(cfg.MaxPayloadBytes); err != nil {
		it.invalid = err
		return it
	}
	if err := it.req.knownLanes(cfg); err != nil {
		it.invalid = err
		return it
	}
	if it.req.RateKey != nil {
		h := RateKeyHash(*it.req.RateKey)
		it.hash = &h
	}
	it.fp = it.req.fingerprint()
	return it
}

// serviceTimes reads, for each valid item with refuse_if_late, its tenant's recent service time
// (once a tenant), outside the admission's transaction: an estimate needs no lock. A read that
// fails leaves it unknown, so the deadline is judged by the due time alone (fail open).
func (a *Admitter) serviceTimes(ctx context.Context, items []*item) {
	known := map[string]time.Duration{}
	for _, it := range items {
		if it.invalid != nil || !it.req.refuseIfLate() {
			continue
		}
		d, ok := known[it.req.Tenant]
		if !ok {
			var err error
			if d, _, err = store.RecentServiceTime(ctx, a.cfg.DB, it.req.Tenant); err != nil {
				a.cfg.Log.Warn("refuse_if_late: the tenant's service time could not be read; judging by the due time alone",
					"tenant", it.req.Tenant, "error", err)
			}
			known[it.req.Tenant] = d
		}
		it.service = d
	}
}

func unavailable(err error) error {
	return &job.Error{Code: job.CodeUnavailable, Err: err, Message: "the database is unavailable; nothing was written",
		Detail: map[string]any{"retryable": true}}
}

// Get returns job id with its position when queued, or store.ErrNotFound; a database that
// cannot be reached or a connection lost is unavailable.
func (a *Admitter) Get(ctx context.Context, id int64) (store.Row, error) {
	r, err := store.Get(ctx, a.cfg.DB, id, false)
	if err != nil {
		if sqldb.ConnectionLost(err) {
			return r, unavailable(err)
		}
		return r, err
	}
	r.Job, err = store.WithPosition(ctx, a.cfg.DB, r.Job)
	return r, a.readErr(err)
}
