// Package gate is sluice's front door and policy: admission (validation, idempotent replay,
// the admission rate limit with refund, depth caps, immediate-or-refuse, the rollout mode),
// batch admission and redrive, reading, listing and cancelling jobs. Its HTTP face is gate/api;
// the runtime limits it enforces are in gate/limits, the rate-limit counters in gate/admitrate.
package gate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/gate/admitrate"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/limits"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/outbox"
)

// RateLimiter is the admission rate limit's counter store (gate/admitrate over memcached). An
// error means "unknown": admission fails open.
type RateLimiter interface {
	// Reserve takes up to n units of tenant's budget of limit per minute at now.
	Reserve(ctx context.Context, tenant string, n, limit int, now time.Time) (*admitrate.Reservation, error)
}

// GateLookup reads rate gates (SPEC §5), for queue=false admissions. Implementations fail open:
// an error makes admission treat the keys as not gated.
type GateLookup interface {
	// NotBefore returns the gate instant of each gated key among hashes.
	NotBefore(ctx context.Context, hashes []string) (map[string]time.Time, error)
}

// Faults are deterministic fault-injection points for tests. A nil *Faults and nil fields do
// nothing; production code never sets them.
type Faults struct {
	// AfterReserve runs after the rate-limit reservation; an error aborts the admission there.
	AfterReserve func(ctx context.Context) error
	// AfterInsert runs after the job rows were inserted, before COMMIT.
	AfterInsert func(ctx context.Context) error
	// Commit replaces the COMMIT: it may commit or roll back and then report any error, which
	// is how a test makes a COMMIT's outcome unknown.
	Commit func(ctx context.Context, tx Tx) error
}

// Config configures an Admitter. Field docs give the defaults.
type Config struct {
	// DB is the sluice database. Required.
	DB *sql.DB
	// Limits supplies the runtime configuration. Required.
	Limits *limits.Cache
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
	// Gates lets queue=false admissions refuse a gated rate key (scope rate_key). Default none:
	// keys are treated as not gated.
	Gates GateLookup
	// Clock is the admission's one clock besides the database's: it dates rate-limit windows
	// and gate instants (both live in memcached, which has no clock of its own), the global
	// depth estimate's refresh and the pacing of fail-open log lines. Job times are the
	// database's (UTC_TIMESTAMP(6), read with the admission state). Default clock.Host.
	Clock clock.Clock
	// GlobalDepthRefresh is how long a counted global queued depth may stand in for a new
	// count while it is well below the cap (see depthEstimate). Default 250 ms; negative counts
	// on every admission.
	GlobalDepthRefresh time.Duration
	// Lanes is how many single admissions one process decides at once, each in its own
	// transaction; admissions that arrive while every lane is busy share the next transaction
	// (see combiner). Default 2.
	Lanes int
	// Faults injects failures for tests. Default none.
	Faults *Faults
}

// Admitter admits jobs. Safe for concurrent use.
type Admitter struct {
	cfg     Config
	store   *store.Store
	stmts   *stmtCache
	depth   depthEstimate
	combine combiner

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
	if cfg.Faults == nil {
		cfg.Faults = &Faults{}
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
	a := &Admitter{cfg: cfg, store: &store.Store{Prefix: cfg.Prefix, Log: cfg.Log, Metrics: cfg.JobMetrics}, stmts: newStmtCache(cfg.DB),
		combine: combiner{lanes: cfg.Lanes}}
	a.combine.run = a.run
	return a, nil
}

// Store returns the job store the Admitter writes transitions through.
func (a *Admitter) Store() *store.Store { return a.store }

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
	// Limit and InFlight describe the tenant's in-flight cap at admission, for the headers.
	Limit    int
	InFlight int
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
	if err := a.admit(ctx, it, cfg); err != nil {
		a.cfg.Metrics.observe(Result{}, err)
		return Result{}, err
	}
	a.cfg.Metrics.observe(it.res, it.err)
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
	if err := a.run(ctx, items, cfg, false); err != nil {
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
		if ConnectionLost(err) {
			return Result{}, unavailable(err)
		}
		return Result{}, err
	}
	if old.Status != job.Lost && old.Status != job.Failed {
		return Result{}, &job.Error{Code: job.CodeNotRedrivable, Message: "only a lost or failed job can be redriven",
			Detail: map[string]any{"status": old.Status}}
	}
	cfg := a.cfg.Limits.Current().Config
	it := &item{req: Request{Tenant: old.Tenant, Payload: old.Payload}, hash: old.RateKeySHA256,
		retryOf: &id, noRate: true, caller: old.Caller}
	it.fp = it.req.fingerprint()
	if err := a.run(ctx, []*item{it}, cfg, false); err != nil {
		a.cfg.Metrics.observe(Result{}, err)
		return Result{}, err
	}
	a.cfg.Metrics.observe(it.res, it.err)
	return it.res, it.err
}

func forbiddenTenant() error {
	return job.Errorf(job.CodeForbidden, "this token may not act for that tenant")
}

func (a *Admitter) newItem(caller string, req Request, cfg limits.Config) *item {
	it := &item{req: req, caller: caller}
	if err := it.req.Validate(cfg.MaxPayloadBytes); err != nil {
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

// run decides and writes items in one transaction, retried as a whole on deadlock.
// shared marks a combiner group (see errGroupLocked).
func (a *Admitter) run(ctx context.Context, items []*item, cfg limits.Config, shared bool) error {
	if cfg.AdmissionMode != limits.ModeOff {
		if err := a.lookupGates(ctx, items); err != nil {
			return err
		}
	}
	var rows []outbox.Row
	var err error
	for attempt := 1; ; attempt++ {
		rows, err = a.attempt(ctx, items, cfg, shared)
		if err == nil || !retryable(err) || attempt >= a.cfg.TxAttempts {
			break
		}
	}
	if err != nil {
		return err
	}
	if len(rows) > 0 && a.cfg.Published != nil {
		a.cfg.Published(rows)
	}
	return nil
}

// lookupGates reads, before the transaction, the gates of queue=false items' rate keys: a
// memcached round trip must not be made while holding a tenant's lock. Its only error is the
// clock's.
func (a *Admitter) lookupGates(ctx context.Context, items []*item) error {
	if a.cfg.Gates == nil {
		return nil
	}
	var hashes []string
	for _, it := range items {
		if it.invalid == nil && it.hash != nil && it.req.Queue != nil && !*it.req.Queue {
			hashes = append(hashes, *it.hash)
		}
	}
	if len(hashes) == 0 {
		return nil
	}
	gctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	gated, gerr := a.cfg.Gates.NotBefore(gctx, hashes)
	now, err := a.cfg.Clock.Now(ctx)
	if err != nil {
		return unavailable(err)
	}
	if gerr != nil {
		a.cfg.FailOpenMetrics.gateLookupFailed()
		a.failOpen("rate gate lookup failed; treating keys as not gated", gerr, now)
	}
	for _, it := range items {
		if it.invalid != nil || it.hash == nil || it.req.Queue == nil || *it.req.Queue {
			continue
		}
		if nb, ok := gated[*it.hash]; ok && nb.After(now) {
			it.gatedFor = int((nb.Sub(now) + time.Second - 1) / time.Second)
		}
	}
	return nil
}

// failOpen logs a limiter-side failure at most once per 15 s (SPEC §5: fails open, counts it,
// logs sparingly). now is the admission's reading of Config.Clock.
func (a *Admitter) failOpen(msg string, err error, now time.Time) {
	a.logMu.Lock()
	if now.Sub(a.lastFailOpen) < 15*time.Second {
		a.logMu.Unlock()
		return
	}
	a.lastFailOpen = now
	a.logMu.Unlock()
	a.cfg.Log.Warn(msg, "error", err)
}

func (a *Admitter) attempt(ctx context.Context, items []*item, cfg limits.Config, shared bool) (rows []outbox.Row, err error) {
	var live []*item
	for _, it := range items {
		it.reset()
		if it.invalid == nil {
			live = append(live, it)
		}
	}
	if len(live) == 0 {
		return nil, nil
	}
	// The transaction's one reading of Config.Clock, taken before its statements run (see
	// depthEstimate.counted).
	wall, err := a.cfg.Clock.Now(ctx)
	if err != nil {
		return nil, unavailable(err)
	}
	var stmts *stmtCache
	if len(live) > maxGroup {
		stmts = a.stmts // a batch (see admissionTx)
	}
	tx, err := beginAdmission(ctx, a.cfg.DB, stmts)
	if err != nil {
		return nil, unavailable(err)
	}
	reservations := map[string]*admitrate.Reservation{}
	done := false
	defer func() {
		if !done {
			for _, r := range reservations {
				r.Refund(ctx, r.Granted())
			}
		}
		tx.close()
	}()
	st, err := a.read(ctx, tx, live, cfg, shared, wall)
	if err != nil {
		if shared && (lockBusy(err) || syntaxError(err)) {
			return nil, errGroupLocked
		}
		return nil, a.txErr(err)
	}
	replays(live, cfg, st)
	if err := replayPositions(ctx, tx.db(), live); err != nil {
		return nil, a.txErr(err)
	}
	a.reserve(ctx, rateCharges(live, cfg), cfg, st, reservations, wall)
	if f := a.cfg.Faults.AfterReserve; f != nil {
		if err := f(ctx); err != nil {
			return nil, a.txErr(err)
		}
	}
	for t, n := range decide(live, cfg, st) {
		reservations[t].Refund(context.Background(), n)
	}
	a.logShadowed(live)
	withInsert := a.commitWithInsert(tx, reservations)
	if err := a.insert(ctx, tx, live, st, !shared, withInsert); err != nil {
		if withInsert && ConnectionLost(err) {
			done = true // the COMMIT may have run
			return nil, a.commitErr(ctx, err, live, reservations)
		}
		return nil, a.txErr(err)
	}
	if !withInsert {
		if f := a.cfg.Faults.AfterInsert; f != nil {
			if err := f(ctx); err != nil {
				return nil, a.txErr(err)
			}
		}
		commit := tx.Commit
		if f := a.cfg.Faults.Commit; f != nil {
			commit = func() error { return f(ctx, tx) }
		}
		if err := commit(); err != nil {
			done = true // the transaction is over either way
			return nil, a.commitErr(ctx, err, live, reservations)
		}
	}
	done = true
	rows = a.finish(ctx, live, st)
	a.depth.admitted(len(rows))
	return rows, nil
}

// replayPositions reads the queue position of each replayed job still queued.
func replayPositions(ctx context.Context, tx store.DB, items []*item) error {
	for _, it := range items {
		if it.invalid != nil || !it.res.Replayed {
			continue
		}
		j, err := store.WithPosition(ctx, tx, it.res.Job)
		if err != nil {
			return err
		}
		it.res.Job = j
	}
	return nil
}

// reserve takes the rate-limit units of charges (rateCharges) and records each tenant's grant
// in st.rate for decide; reservations keeps them for refunds. A tenant whose reservation fails
// is admitted without the limit (SPEC §5: fails open, counted, logged sparingly).
func (a *Admitter) reserve(ctx context.Context, charges []rateCharge, cfg limits.Config, st *state, reservations map[string]*admitrate.Reservation, now time.Time) {
	if len(charges) == 0 {
		return
	}
	if a.cfg.RateLimiter == nil {
		a.logMu.Lock()
		warn := !a.warnedNoRL
		a.warnedNoRL = true
		a.logMu.Unlock()
		if warn {
			a.cfg.Log.Warn("admission_rate_per_minute is set but this process has no rate limiter (memcached); not enforced")
		}
		return
	}
	for _, c := range charges {
		rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		r, err := a.cfg.RateLimiter.Reserve(rctx, c.tenant, c.n, cfg.AdmissionRatePerMinute, now)
		cancel()
		if err != nil {
			a.cfg.FailOpenMetrics.limiterFailed()
			a.failOpen("admission rate limiter unavailable; admitting without it (fail open)", err, now)
			continue
		}
		reservations[c.tenant] = r
		st.rate[c.tenant] = rateGrant{granted: r.Granted(), retryAfter: r.RetryAfter}
	}
}

// logShadowed logs the refusals shadow mode let through (SPEC §5: recorded, not refused).
func (a *Admitter) logShadowed(items []*item) {
	for _, it := range items {
		if it.shadow.rate {
			a.cfg.Log.Warn("admission rate limit would refuse (shadow mode)", "tenant", it.req.Tenant)
		}
	}
	for _, it := range items {
		if it.shadow.scope != "" {
			a.cfg.Log.Warn("depth cap would refuse admission (shadow mode)", "tenant", it.req.Tenant, "scope", it.shadow.scope)
		}
		if it.shadow.immediate {
			a.cfg.Log.Warn("immediate-or-refuse would refuse admission (shadow mode)", "tenant", it.req.Tenant)
		}
	}
}

// commitWithInsert says whether the COMMIT goes in the inserts' round trip, which saves an
// admission one of its three (about a tenth of single-admission throughput at 4 clients, and
// some pickup latency). The price: if the connection breaks in that round trip, the new rows'
// ids are unknown as well as the outcome. Only a rate-limit reservation needs them then (SPEC
// §5: the row is re-read by its id to keep or refund the charge), so a transaction holding one
// commits in a round trip of its own, as do a batch (see admissionTx) and a test's transaction
// whose faults go between the inserts and the COMMIT.
func (a *Admitter) commitWithInsert(tx *admissionTx, reservations map[string]*admitrate.Reservation) bool {
	if f := a.cfg.Faults; f != nil && (f.AfterInsert != nil || f.Commit != nil) {
		return false
	}
	return len(reservations) == 0 && tx.canCommitWithExec()
}

// lockSQL is the statement that takes the row lock of n tenants, given in sorted order so that
// two batches lock in the same order and cannot deadlock. Locking a tenant serialises that
// tenant's admissions, which makes its depth cap and idempotent replay exact; other tenants are
// not blocked.
func lockSQL(n int) string {
	return "INSERT INTO tenants (tenant, created_at) VALUES " +
		strings.TrimSuffix(strings.Repeat("(?, UTC_TIMESTAMP(6)),", n), ",") +
		" ON DUPLICATE KEY UPDATE tenant = tenant"
}

const inFlightStates = "('claimed','dispatched','running')"

// read begins the transaction, locks the items' tenants and reads the database clock, the
// depths, in-flight counts, idempotency keys and redrives the decisions need, all in one round
// trip. Each read is its own statement after the lock: a statement that both locked and read
// would take its snapshot before it waited for the lock and miss what the previous holder
// committed (a racing duplicate key, a depth one short). Folding the reads into the lock as
// INSERT ... ON DUPLICATE KEY UPDATE ... RETURNING (subqueries) was tried and fails that way:
// the idempotency-key lookup, a unique-key lookup of constants, is read while the statement is
// optimised, before the lock wait, and TestFrontDoorIdempotency's 50 racers then hit a
// duplicate key. Under READ COMMITTED each later statement of the round trip reads after the
// lock is held.
func (a *Admitter) read(ctx context.Context, tx *admissionTx, items []*item, cfg limits.Config, shared bool, started time.Time) (*state, error) {
	st := newState()
	seen := map[string]bool{}
	var tenants []string
	for _, it := range items {
		if !seen[it.req.Tenant] {
			seen[it.req.Tenant] = true
			tenants = append(tenants, it.req.Tenant)
		}
	}
	sort.Strings(tenants)
	tenantArgs := make([]any, len(tenants))
	for i, t := range tenants {
		tenantArgs[i] = t
	}
	stmts := []string{lockSQL(len(tenants))}
	args := append([]any(nil), tenantArgs...)
	if shared {
		// A group takes its tenants' locks without waiting (see errGroupLocked). SET STATEMENT
		// is MariaDB's; a server that does not know it fails the statement, and the group falls
		// apart the same way (lockBusy).
		stmts[0] = "SET STATEMENT innodb_lock_wait_timeout = 0 FOR " + stmts[0]
	}

	// The global depth is counted exactly near the cap and for queue=false (whose Retry-After
	// depends on it, as on the global in-flight count); far below the cap a recent count plus
	// this process's admissions since stands in for it, because counting up to 2,000 index
	// entries is most of an admission's cost (see depthEstimate).
	immediate := false
	for _, it := range items {
		immediate = immediate || (it.req.Queue != nil && !*it.req.Queue)
	}
	est, fresh := a.depth.estimate(started, a.cfg.GlobalDepthRefresh)
	countGlobal := immediate || !fresh || est+len(items)+depthMargin(cfg.GlobalQueueDepth) >= cfg.GlobalQueueDepth
	globalSQL, globalArg := "(SELECT ?)", any(int64(est))
	if countGlobal {
		globalSQL = "(SELECT COUNT(*) FROM (SELECT 1 FROM jobs WHERE status = 'queued' LIMIT ?) g)"
		globalArg = int64(cfg.GlobalQueueDepth + 1)
	}
	inFlightSQL := "(SELECT 0)"
	if immediate {
		inFlightSQL = "(SELECT COUNT(*) FROM jobs WHERE status IN " + inFlightStates + ")"
	}
	single := len(tenants) == 1
	if single {
		// One scan of the tenant's (tenant, status) index range gives both its depth and its
		// in-flight count.
		stmts = append(stmts, `SELECT UTC_TIMESTAMP(6),
			COALESCE(SUM(status = 'queued'), 0), COALESCE(SUM(status <> 'queued'), 0),
			`+globalSQL+`, `+inFlightSQL+`
			FROM jobs WHERE tenant = ? AND status IN ('queued','claimed','dispatched','running')`)
		args = append(args, globalArg, tenants[0])
	} else {
		stmts = append(stmts, `SELECT UTC_TIMESTAMP(6), `+globalSQL+`, `+inFlightSQL,
			`SELECT tenant, status = 'queued', COUNT(*) FROM jobs
			WHERE status IN ('queued','claimed','dispatched','running') AND tenant IN (`+store.Placeholders(len(tenants))+`)
			GROUP BY tenant, status = 'queued'`)
		args = append(args, globalArg)
		args = append(args, tenantArgs...)
	}
	var keys, redrives []any
	for _, it := range items {
		if it.req.IdempotencyKey != nil {
			keys = append(keys, *it.req.IdempotencyKey)
		}
		if it.retryOf != nil {
			redrives = append(redrives, *it.retryOf)
		}
	}
	if len(keys) > 0 {
		stmts = append(stmts, "SELECT "+store.Columns+" FROM jobs WHERE tenant IN ("+
			store.Placeholders(len(tenants))+") AND idempotency_key IN ("+store.Placeholders(len(keys))+")")
		args = append(append(args, tenantArgs...), keys...)
	}
	if len(redrives) > 0 {
		// The job an earlier redrive of the same job created: the first, if several.
		stmts = append(stmts, "SELECT "+store.Columns+" FROM jobs WHERE id IN (SELECT MIN(id) FROM jobs WHERE retry_of IN ("+
			store.Placeholders(len(redrives))+") GROUP BY retry_of)")
		args = append(args, redrives...)
	}

	res, err := tx.query(ctx, stmts, args)
	if err != nil {
		return nil, fmt.Errorf("read admission state: %w", err)
	}
	defer res.Close()
	if single {
		var depth, inFlight int
		if err := res.ScanOne(&st.now, &depth, &inFlight, &st.globalDepth, &st.globalInFlight); err != nil {
			return nil, fmt.Errorf("read admission state: %w", err)
		}
		st.tenantDepth[tenants[0]], st.tenantInFlight[tenants[0]] = depth, inFlight
	} else {
		if err := res.ScanOne(&st.now, &st.globalDepth, &st.globalInFlight); err != nil {
			return nil, fmt.Errorf("read admission state: %w", err)
		}
		rows, err := res.Next()
		if err != nil {
			return nil, fmt.Errorf("read tenant depths: %w", err)
		}
		for rows.Next() {
			var t string
			var queued bool
			var n int
			if err := rows.Scan(&t, &queued, &n); err != nil {
				return nil, fmt.Errorf("read tenant depths: %w", err)
			}
			if queued {
				st.tenantDepth[t] = n
			} else {
				st.tenantInFlight[t] = n
			}
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("read tenant depths: %w", err)
		}
	}
	if countGlobal {
		a.depth.counted(started, st.globalDepth)
	}
	st.now = st.now.UTC()
	if len(keys) > 0 {
		err := res.EachRow(func(r store.Row) {
			st.keyed[keyOf(r.Tenant, *r.IdempotencyKey)] = &r
		})
		if err != nil {
			return nil, fmt.Errorf("read idempotency keys: %w", err)
		}
	}
	if len(redrives) > 0 {
		err := res.EachRow(func(r store.Row) { st.redriven[*r.RetryOf] = &r })
		if err != nil {
			return nil, fmt.Errorf("read redrives: %w", err)
		}
	}
	return st, res.Close()
}

// insertChunk bounds the rows of one INSERT, well under max_allowed_packet for any payloads a
// batch body may carry.
const insertChunk = 250

// insert writes, in one round trip, the rows of the items to insert (queued and rejected) and
// the enqueue pokes of the queued ones: a poke's body carries its job's id, which the server
// fills in (outbox.InsertPokes). With commit, it commits in the same round trip (see
// commitWithInsert).
//
// A request's jobs share pokes when perTenant is set (a batch): one poke per tenant, on its last
// queued job. A poke only says "look at this tenant's queue now" (SPEC §2, §7), and the drainer
// coalesces the pokes of one tenant into one pass anyway, so a thousand pokes for one batch
// would be a thousand outbox rows and publishes that wake nothing more. A combiner group is
// several requests: each of its admissions keeps its own poke.
func (a *Admitter) insert(ctx context.Context, tx *admissionTx, items []*item, st *state, perTenant, commit bool) error {
	var ins []*item
	lastOf := map[string]int{} // tenant → index in ins of its last queued job, when perTenant
	for _, it := range items {
		if it.insert {
			if perTenant && it.scope == "" {
				lastOf[it.req.Tenant] = len(ins)
			}
			ins = append(ins, it)
		}
	}
	if len(ins) == 0 {
		if commit {
			return tx.Commit()
		}
		return nil
	}
	var stmts []string
	var args [][]any
	type written struct {
		jobs  []*item // the rows of a jobs INSERT, in order
		pokes []*item // the rows of the outbox INSERT after it, if any
		stmt  int     // index of the jobs INSERT among stmts
	}
	var chunks []written
	for start := 0; start < len(ins); start += insertChunk {
		chunk := ins[start:min(len(ins), start+insertChunk)]
		var q strings.Builder
		q.WriteString(`INSERT INTO jobs (tenant, rate_key_sha256, payload, status, caller, idempotency_key,
			request_sha256, queued_at, finished_at, error_code, error_message, retry_of) VALUES `)
		w := written{jobs: chunk, stmt: len(stmts)}
		var pokes []outbox.NewPoke
		rowArgs := make([]any, 0, 12*len(chunk))
		for i, it := range chunk {
			if i > 0 {
				q.WriteString(",")
			}
			q.WriteString("(?,?,?,?,?,?,?,?,?,?,?,?)")
			var rateKey, payload, idem, fp, finished, code, msg, retryOf any
			if it.hash != nil {
				rateKey = *it.hash
			}
			if it.retryOf != nil {
				retryOf = *it.retryOf
			}
			status := job.Queued
			if it.scope != "" {
				// A rejected row does not consume the idempotency key (the caller may retry
				// with it) and keeps no payload.
				status, finished, code = job.Rejected, st.now, string(job.CodeQueueFull)
				msg = "queue full (" + it.scope + " depth cap)"
			} else {
				if len(it.req.Payload) > 0 {
					payload = []byte(it.req.Payload)
				}
				if it.req.IdempotencyKey != nil {
					idem, fp = *it.req.IdempotencyKey, it.fp
				}
				if !perTenant || lastOf[it.req.Tenant] == start+i {
					pokes = append(pokes, outbox.NewPoke{Kind: outbox.Enqueue, Tenant: it.req.Tenant, Offset: i})
					w.pokes = append(w.pokes, it)
				}
			}
			rowArgs = append(rowArgs, it.req.Tenant, rateKey, payload, string(status), it.caller, idem, fp,
				st.now, finished, code, msg, retryOf)
		}
		stmts = append(stmts, q.String())
		args = append(args, rowArgs)
		if len(pokes) > 0 {
			pq, pargs := outbox.InsertPokes(a.cfg.Prefix, st.now, pokes)
			stmts = append(stmts, pq)
			args = append(args, pargs)
		}
		chunks = append(chunks, w)
	}
	ids, err := tx.exec(ctx, stmts, args, commit)
	if err != nil {
		return fmt.Errorf("insert jobs: %w", err)
	}
	if len(ids) != len(stmts) {
		return fmt.Errorf("insert jobs: %d insert ids for %d statements", len(ids), len(stmts))
	}
	// A multi-row INSERT of known size gets consecutive ids (a "simple insert" reserves its
	// whole range at once under every InnoDB auto-increment lock mode).
	for _, w := range chunks {
		for i, it := range w.jobs {
			it.id = ids[w.stmt] + int64(i)
		}
		for i, it := range w.pokes {
			it.outboxID = ids[w.stmt+1] + int64(i)
		}
	}
	return nil
}

// finish builds the results of a committed transaction, logs and returns its outbox rows.
func (a *Admitter) finish(ctx context.Context, items []*item, st *state) []outbox.Row {
	var rows []outbox.Row
	for _, it := range items {
		switch {
		case it.dupOf != nil:
			if it.dupOf.err != nil || it.dupOf.scope != "" {
				it.err = it.dupOf.err
				if it.dupOf.scope != "" {
					it.err = depthError(it.dupOf)
				}
			} else {
				it.res = it.dupOf.res
				it.res.Replayed = true
			}
		case !it.insert:
		case it.scope != "":
			a.cfg.Log.Warn("depth cap refused admission", "tenant", it.req.Tenant, "scope", it.scope, "job_id", it.id)
			a.store.LogTransition(ctx, store.Row{Job: job.Job{ID: it.id, Tenant: it.req.Tenant, QueuedAt: st.now, Status: "admitted"}}, job.Rejected, 0, st.now, string(job.CodeQueueFull))
			a.store.Metrics.Finished(job.Rejected, nil, st.now)
			it.err = depthError(it)
		default:
			it.res.Job.ID, it.res.Job.Tenant, it.res.Job.Status, it.res.Job.QueuedAt = it.id, it.req.Tenant, job.Queued, st.now
			it.res.Job.RateKeySHA256, it.res.Job.RetryOf = it.hash, it.retryOf
			a.store.LogTransition(ctx, store.Row{Job: job.Job{ID: it.id, Tenant: it.req.Tenant, QueuedAt: st.now, Status: "admitted"}}, job.Queued, 0, st.now, "")
			if it.outboxID != 0 {
				msg := outbox.PokeMessage(a.cfg.Prefix, outbox.Enqueue, it.req.Tenant, it.id)
				rows = append(rows, outbox.Row{ID: it.outboxID, Subject: msg.Subject, Payload: msg.Payload, CreatedAt: st.now})
			}
		}
	}
	return rows
}

// txErr turns a database failure inside an admission transaction into the API's error: the
// database unreachable or the connection lost before COMMIT is "unavailable, retryable"
// (nothing was written); anything else stays an internal error for the log.
func (a *Admitter) txErr(err error) error {
	var je *job.Error
	if errors.As(err, &je) {
		return err
	}
	if ConnectionLost(err) {
		return unavailable(err)
	}
	return err
}

// commitErr classifies a failed COMMIT and settles the rate-limit reservations. If the
// connection broke during COMMIT its outcome is unknown: the first inserted row is re-read by
// id on another connection and the charges are kept if it exists, refunded if not. An unkeyed
// request must not be retried blindly (it may create a duplicate); a keyed one may, since its
// replay returns the one job that exists.
func (a *Admitter) commitErr(ctx context.Context, err error, items []*item, res map[string]*admitrate.Reservation) error {
	refundAll := func() {
		for _, r := range res {
			r.Refund(ctx, r.Granted())
		}
	}
	if !ConnectionLost(err) {
		refundAll()
		return fmt.Errorf("commit admission: %w", err)
	}
	var first int64
	keyed := true
	for _, it := range items {
		if it.insert && first == 0 {
			first = it.id
		}
		if it.req.IdempotencyKey == nil && it.retryOf == nil {
			keyed = false
		}
	}
	exists := "unknown"
	if first != 0 {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_, gerr := store.Get(rctx, a.cfg.DB, first, false)
		cancel()
		switch {
		case gerr == nil:
			exists = "yes"
		case errors.Is(gerr, store.ErrNotFound):
			exists = "no"
			refundAll()
		}
	}
	a.cfg.Log.Warn("admission commit outcome unknown", "job_id", first, "row_found_on_reread", exists, "error", err)
	detail := map[string]any{"retryable": keyed}
	if first != 0 && len(items) == 1 {
		detail["id"] = first
	}
	return &job.Error{Code: job.CodeOutcomeUnknown, Err: err,
		Message: "the database connection broke during commit; the job may or may not exist",
		Detail:  detail}
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
		if ConnectionLost(err) {
			return r, unavailable(err)
		}
		return r, err
	}
	r.Job, err = store.WithPosition(ctx, a.cfg.DB, r.Job)
	return r, a.readErr(err)
}
