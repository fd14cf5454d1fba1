package drainer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/outbox"
)

// Sender sends a dispatch to the executor and classifies its answer. *executor.Client is one.
// Send blocks until the answer or until ctx ends; it must be safe for concurrent use.
type Sender interface {
	Send(ctx context.Context, d executor.Dispatch) executor.Answer
}

// RateGates is the rate-gate store as the drainer uses it (SPEC §5). Implementations fail open:
// NotBefore returns what it could read and an error the drainer only counts and logs.
type RateGates interface {
	// NotBefore returns the gate instant of each gated key among hashes.
	NotBefore(ctx context.Context, hashes []string) (map[string]time.Time, error)
	// Extend gates hash for retryAfter seconds from now, never shortening a longer gate.
	Extend(ctx context.Context, hash string, retryAfter int) (time.Time, error)
}

// Config configures a Drainer. Field docs give the defaults.
type Config struct {
	// DB is the sluice database. Required.
	DB *sql.DB
	// TxDB is the pool of the round trips that carry several statements (store.OpenMulti): a
	// claim's, a completion's, the lone-job probe's and the lease scan's with the heartbeat; DB
	// may refuse them (store.Open). Default DB, which must then take them. A claim that brings
	// outcomes holds two of its connections at once (claimCandidates).
	TxDB *sql.DB
	// Executor receives dispatches. Required.
	Executor Sender
	// Clock judges leases, walls and nonce TTLs. Default: the database's clock, followed by clock.Synced.
	Clock clock.Clock
	// ID names this drainer in job rows and heartbeats. Default hostname-pid.
	ID string
	// Prefix is the NATS subject prefix of the pokes it writes. Default "sluice".
	Prefix string
	// UnconfirmedStarts is true when the executor cannot confirm starts
	// (SLUICE_EXECUTOR_CONFIRM_START=false): a dispatch whose outcome is unknown is then lost,
	// never requeued. Default false (starts are confirmed).
	UnconfirmedStarts bool
	// RateGates, if set, is consulted before claiming and written on an executor's 429.
	RateGates RateGates
	// PollInterval is the backstop poll period. Default 1 s.
	PollInterval time.Duration
	// HeadAdvance is how often the tenants this drainer claimed from get their queue heads set
	// forward (store.AdvanceHeads) while more tenants have work than one page of a pass holds: a
	// claim leaves its tenants' heads behind (migration 0018), and a tenant claimed from in
	// several passes within it pays one advance instead of one per job. A head left behind is
	// older than its tenant's oldest queued job, which orders the tenant too early in the head
	// index: that matters to a pass only across pages, so while one page holds every tenant with
	// work the heads are set forward once per PollInterval (for the status's oldest queued job and
	// the slots' fair-order check). The advance runs at the end of a pass, after its claims, and a
	// pass comes at least every PollInterval. Default 100 ms.
	HeadAdvance time.Duration
	// ClaimBatch bounds the jobs claimed in one transaction. Default 64.
	ClaimBatch int
	// Log receives transitions and problems. Default: discard.
	Log *slog.Logger
	// Metrics, if set, is updated by every pass.
	Metrics *Metrics
	// JobMetrics, if set, counts the jobs this drainer ends (dispatch outcomes, lease recovery,
	// expiry) and observes each dispatch's wait and each dispatched job's execution time. A
	// process shares one with its API (store.Metrics). Default none: nothing is counted.
	JobMetrics *store.Metrics
	// BuildVersion is written in heartbeats. Default "dev".
	BuildVersion string
	// OutcomeBatch bounds the dispatch outcomes written in one transaction: answers arriving
	// together are written together (group commit), and while Run schedules passes, in the next
	// claim's transaction (outcomeHandoff). Default 256; 1 writes each outcome in a transaction
	// of its own, from the dispatch that got it.
	OutcomeBatch int
	// AuditOff drops the audit rows of the transitions this drainer writes (store.Store.AuditOff).
	// Not a setting: it exists only for the benchmarks' same-run comparison of the audit trail's
	// cost. Default false.
	AuditOff bool
	// Ended, if set, is called after a transaction of this drainer that wrote outcomes or
	// expiries committed, with the jobs it wrote: a process that also serves the API wakes the
	// requests waiting on them at once (waiters.Hub.Wake), where the release pokes reach them only
	// after the relay's next pass. It must return at once. Default none.
	Ended func(jobIDs []int64)
	// Observer, if set, is told of claims and recorded answers as they happen. A test signal:
	// tests wait on it instead of on time. Nil in production.
	Observer Observer
}

// Drainer claims and dispatches jobs. It is the scheduler of small services, each owning its
// own state: the claimer (candidates, the claim transaction, the lone-job path), the dispatcher
// (sending, answers, with the completer that records outcomes), the lease keeper (the jobs held
// and their renewal), the rescuer (expired leases), the expirer (max_queue_age_seconds) and the
// heartbeat. RunOnce runs one pass of them; Run schedules passes; Stop winds the dispatches down.
// Its methods are safe for concurrent use.
type Drainer struct {
	cfg  Config
	wake chan struct{}

	passMu     sync.Mutex // one pass at a time; guards lastUpkeep and the services only passes call
	lastUpkeep time.Time  // renewal and recovery run at most once per PollInterval

	afterClaim pokeWaiters     // PokeThen's callbacks, run after the claim of the next pass
	handoff    *outcomeHandoff // outcomes for the next pass to write (nil with OutcomeBatch 1)

	config *configView // the runtime config last read; shared by the services, lock-free
	heads  *headCache  // queue heads read but not yet claimed (claimer; invalidated by completer)
	writer *outcomeWriter
	leases *leaseKeeper
	claims *claimer
	sends  *dispatcher
	rescue *rescuer
	expiry *expirer
	beat   *heartbeat
}

// New returns a Drainer, or an "invalid config" error naming the field.
func New(cfg Config) (*Drainer, error) {
	if cfg.DB == nil {
		return nil, errors.New("invalid config: DB: required")
	}
	if cfg.Executor == nil {
		return nil, errors.New("invalid config: Executor: required")
	}
	if cfg.TxDB == nil {
		cfg.TxDB = cfg.DB
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.NewDBSynced(cfg.DB)
	}
	host, _ := os.Hostname()
	if cfg.ID == "" {
		cfg.ID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if len(cfg.ID) > 191 {
		return nil, errors.New("invalid config: ID: at most 191 bytes")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = outbox.DefaultPrefix
	}
	if cfg.HeadAdvance <= 0 {
		cfg.HeadAdvance = 100 * time.Millisecond
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.BuildVersion == "" {
		cfg.BuildVersion = "dev"
	}
	if cfg.ClaimBatch <= 0 {
		cfg.ClaimBatch = 64
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.OutcomeBatch <= 0 {
		cfg.OutcomeBatch = maxOutcomeBatch
	}
	d := &Drainer{cfg: cfg, wake: make(chan struct{}, 1), config: &configView{}, heads: &headCache{}}
	st := &store.Store{Prefix: cfg.Prefix, Log: cfg.Log, Metrics: cfg.JobMetrics, Actor: cfg.ID, AuditOff: cfg.AuditOff,
		ChargeTime: func() bool { return d.config.get().Ordering == config.FairTime }}
	d.leases = &leaseKeeper{cfg: &d.cfg, config: d.config, held: map[int64]int64{}}
	d.beat = &heartbeat{cfg: &d.cfg, leases: d.leases, host: host, pid: os.Getpid()}
	d.writer = &outcomeWriter{cfg: &d.cfg, store: st, heads: d.heads}
	var complete completer = inlineCompleter{w: d.writer}
	if cfg.OutcomeBatch > 1 {
		d.handoff = &outcomeHandoff{direct: d.writer.write, wake: d.Wake}
		complete = &batchCompleter{write: d.handoff.write, max: cfg.OutcomeBatch}
	}
	d.sends = newDispatcher(&d.cfg, d.leases, complete, d.Wake)
	d.sends.timed = st.ChargeTime
	d.claims = &claimer{cfg: &d.cfg, store: st, config: d.config, headCache: d.heads, leases: d.leases,
		writer: d.writer, unanswered: d.sends.unanswered.Load, probe: true, chooser: chooser{claimBatch: cfg.ClaimBatch}}
	d.rescue = &rescuer{cfg: &d.cfg, store: st, config: d.config, refresh: d.refreshConfig, wake: d.Wake}
	d.expiry = &expirer{cfg: &d.cfg, store: st, config: d.config}
	return d, nil
}

// ID returns the drainer's id.
func (d *Drainer) ID() string { return d.cfg.ID }

// Wake asks for a drain pass soon. It never blocks: a burst of wakes while a pass is pending
// collapses into that one pass.
func (d *Drainer) Wake() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Poke is Wake for news of a queued job: a broker's poke, or this process's API committing one.
// If the pass it starts finds the drainer probing for a lone job (the last pass left the queue
// empty), the probe goes in the claim transaction's first round trip rather than one of its own
// before it: a round trip less between the job's commit and its dispatch.
func (d *Drainer) Poke() {
	d.claims.poked.Store(true)
	d.Wake()
}

// PokeThen is Poke for news this process committed itself, with f to run once the claim of a
// pass that starts after the call is done (its jobs committed and their dispatches started), or
// at once if no pass is coming: Run is not scheduling passes, or too many callbacks wait. f must
// not block: it runs on the pass's goroutine.
//
// The API of a process that also drains hands its enqueue pokes to the broker this way (see
// cmd/sluice/app): its own drainer hears of the job directly, and publishing the poke while
// that drainer's claim is under way only takes the two cores from it (the broker's publish and
// acknowledgement, the outbox row's mark, the poke coming back), for drainers elsewhere that
// would then race it for the claim lock (BenchmarkPickupLatency, one process). A poke that waits
// is still in the outbox, which the relay publishes on its own schedule if it never runs.
func (d *Drainer) PokeThen(f func()) {
	if !d.afterClaim.add(f) {
		f()
	}
	d.Poke()
}

// maxPokeWaiters bounds the callbacks PokeThen keeps for the next pass; past it they run at
// once. A pass takes them all, so it is only reached while one pass runs long.
const maxPokeWaiters = 4096

// pokeWaiters are PokeThen's callbacks waiting for a pass, at most maxPokeWaiters; when Run
// stops, those still waiting run at once. Safe for concurrent use.
type pokeWaiters struct{ q nextPass[func()] }

// add keeps f for the next pass and reports whether it did (false: no pass is coming).
func (w *pokeWaiters) add(f func()) bool { return w.q.add(f, maxPokeWaiters) }

// take returns the callbacks waiting, for a pass that is starting.
func (w *pokeWaiters) take() []func() { return w.q.take() }

// setRunning records whether Run schedules passes.
func (w *pokeWaiters) setRunning(on bool) { runAll(w.q.setRunning(on)) }

// nextPass holds what waits for the next pass (PokeThen's callbacks, the outcomes handed to a
// claim) while Run schedules passes, when a pass follows every wake. Safe for concurrent use.
type nextPass[T any] struct {
	mu      sync.Mutex
	running bool
	waiting []T
}

// add keeps v for the next pass and reports whether it did: not when no pass is coming, nor past
// max waiting.
func (q *nextPass[T]) add(v T, max int) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.running || len(q.waiting) >= max {
		return false
	}
	q.waiting = append(q.waiting, v)
	return true
}

// take returns what waits, for a pass that is starting.
func (q *nextPass[T]) take() []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	vs := q.waiting
	q.waiting = nil
	return vs
}

// setRunning records whether Run schedules passes. When it stops, it returns what still waited,
// which no pass will take: the caller deals with it at once.
func (q *nextPass[T]) setRunning(on bool) []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.running = on
	if on {
		return nil
	}
	vs := q.waiting
	q.waiting = nil
	return vs
}

func runAll(fs []func()) {
	for _, f := range fs {
		f()
	}
}

// Pass reports what one RunOnce did.
type Pass struct {
	Renewed   int
	Recovered int
	// Expired counts queued jobs expired for max_queue_age_seconds.
	Expired int
	// SlotsLost counts the slots whose lease ran out that the upkeep deleted.
	SlotsLost int
	Claimed   int
	// Full is true when the pass stopped at ClaimBatch with capacity possibly left.
	Full bool
}

// RunOnce does one drain pass: claim what the caps allow and start dispatching it, then (at most
// once per PollInterval: leases last many poll periods, and a poke-driven pass should cost only
// the claim) renew this drainer's leases and recover expired claims. Dispatches run in goroutines
// owned by the dispatcher (Stop waits for them); RunOnce does not wait for their outcomes. Passes do
// not overlap: a call waits for one in progress.
func (d *Drainer) RunOnce(ctx context.Context) (Pass, error) {
	d.passMu.Lock()
	defer d.passMu.Unlock()
	defer d.leases.keepDuring(ctx)()
	// The callbacks of PokeThen calls made before this pass run once its claim is done (or it
	// failed).
	served := d.afterClaim.take()
	defer func() { runAll(served) }()
	var p Pass
	now, err := d.cfg.Clock.Now(ctx)
	if err != nil {
		return p, err
	}
	// The outcomes handed over before this pass are written beside its claim, or on their own
	// right after it if it claims nothing. While the queue was last found empty, their writer
	// writes them at once instead: the next job is then most likely one a producer is waiting to
	// see start, and its claim should not wait for them (BenchmarkPickupLatency).
	outs := d.handoff.take()
	if outs != nil && d.claims.probe {
		outs.answer(errNotTaken, false)
		outs = nil
	}
	// The claim goes first and the upkeep after it, so that a poke's job is not held up by the
	// upkeep's statements (about one pass a second does both). A failed claim does not skip the
	// upkeep: leases must be renewed whatever else fails.
	upkeep := d.lastUpkeep.IsZero() || now.Sub(d.lastUpkeep) >= d.cfg.PollInterval || now.Before(d.lastUpkeep)
	out, full, err := d.claims.RunOnce(ctx, now, outs)
	p.Claimed, p.Full = len(out), full
	d.writeLeft(ctx, outs)
	d.started(now, out)
	runAll(served)
	served = nil
	beaten := false
	if upkeep {
		// The heartbeat rides with the upkeep's lease scan when the claim went well (a pass that
		// failed writes none).
		var uerr error
		beaten, uerr = d.upkeep(ctx, now, &p, err == nil)
		err = errors.Join(err, uerr)
		if err == nil && p.Recovered > 0 {
			// Jobs taken back from a dead drainer are claimed in the pass that found them.
			var more []claimed
			more, p.Full, err = d.claims.RunOnce(ctx, now, nil)
			p.Claimed += len(more)
			d.started(now, more)
		}
	}
	// After the claims, off the path from a poke to a dispatch; every pass, since a drainer whose
	// cap stays full claims nothing but still has heads to set forward.
	d.claims.advanceHeads(ctx, now)
	if err != nil {
		return p, err
	}
	if !beaten {
		if err := d.beat.RunOnce(ctx, now); err != nil {
			d.cfg.Log.Warn("drainer heartbeat failed", "error", err)
		}
	}
	if d.cfg.Metrics != nil {
		d.cfg.Metrics.observePass(p)
	}
	return p, nil
}

// writeLeft writes the outcomes of outs that no claim wrote, in a transaction of their own, and
// answers their writer.
func (d *Drainer) writeLeft(ctx context.Context, outs *outcomeBatch) {
	if outs.pending() {
		outs.answer(d.writer.write(ctx, outs.reqs), false)
	}
}

// started dispatches what a claim took, and notes when, for the heartbeat.
func (d *Drainer) started(now time.Time, out []claimed) {
	if len(out) == 0 {
		return
	}
	d.beat.claimed(now)
	if d.cfg.Observer != nil {
		ids := make([]int64, len(out))
		for i, c := range out {
			ids[i] = c.row.ID
		}
		d.cfg.Observer.Claimed(ids)
	}
	for _, c := range out {
		d.sends.start(c)
	}
}

// upkeep renews this drainer's leases (leaseKeeper), recovers expired ones and sweeps the expired
// slots (rescuer) and expires queued jobs past their start_by or max_queue_age_seconds (expirer), re-reading the runtime config first when
// something depends on it (configNeeded). A config that changed gets a pass of its own at once
// (Wake). With beat, a heartbeat that is due is written in the lease scan's round trip (two
// statements a second fewer for an idle drainer than config, scan and heartbeat apart); beaten
// reports whether it was.
func (d *Drainer) upkeep(ctx context.Context, now time.Time, p *Pass, beat bool) (beaten bool, err error) {
	fresh := false
	if d.configNeeded() {
		if err := d.refreshConfig(ctx); err != nil {
			return false, err
		}
		fresh = true
	}
	if p.Renewed, err = d.leases.RunOnce(ctx, now); err != nil {
		return false, err
	}
	var hb *store.Heartbeat
	if beat {
		hb = d.beat.due(now)
	}
	if p.Recovered, p.SlotsLost, err = d.rescue.RunOnce(ctx, now, hb, fresh); err != nil {
		return hb != nil, err
	}
	queued := d.claims.sawQueued || d.config.get().GlobalInFlight == 0 // a paused drainer claims nothing, so learns nothing
	if p.Expired, err = d.expiry.RunOnce(ctx, now, queued); err != nil {
		return hb != nil, err
	}
	if d.claims.sawPrioritized || queued || d.leases.count() > 0 {
		// While there is work, and then until the table is found empty: a job of a priority may
		// end after the upkeep that followed its claim (a lone job's claim reads no tenants
		// page), and no page names its tenant again if it has no more work. With no priority in
		// use this is one dive into an empty table.
		left, err := store.DeleteEndedPriorities(ctx, d.cfg.DB, endedPrioritiesBatch)
		if err != nil {
			return hb != nil, err
		}
		d.claims.sawPrioritized = left
	}
	// Jobs requeued elsewhere keep their place in their tenant's queue; the cache is dropped so
	// that they are seen within one poll interval.
	d.heads.reset()
	d.lastUpkeep = now
	return hb != nil, nil
}

// configNeeded reports whether the upkeep must re-read the runtime config: before the first
// claim; while this drainer holds jobs (renewal reads their lease and wall from it); and while
// the last pass left queued work behind, since candidates are chosen on the config the last
// claim read, and a paused drainer (global_in_flight 0) runs no claim, so only this read sees
// the caps raised again. A drainer whose last pass found the queue empty needs none of that:
// the claim of the next job reads the config under the claim lock, as every claim does. Idle,
// that is one statement a second fewer.
func (d *Drainer) configNeeded() bool {
	return !d.config.seen() || d.leases.count() > 0 || !d.claims.probe
}

// refreshConfig re-reads the runtime config, and wakes a pass if it changed.
func (d *Drainer) refreshConfig(ctx context.Context) error {
	changed, err := d.config.refresh(ctx, d.cfg.DB)
	if err != nil {
		return err
	}
	if changed {
		d.Wake()
	}
	return nil
}

// Run drains until ctx is done: a pass on every wake and at least every PollInterval. It
// returns when ctx is done; in-flight dispatches go on until Stop.
func (d *Drainer) Run(ctx context.Context) {
	d.afterClaim.setRunning(true)
	defer d.afterClaim.setRunning(false)
	d.handoff.setRunning(true)
	defer d.handoff.setRunning(false)
	t := time.NewTicker(d.cfg.PollInterval)
	defer t.Stop()
	failures := 0
	for {
		p, err := d.RunOnce(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			failures++
			if failures == 1 || failures%30 == 0 {
				d.cfg.Log.Error("drain pass failed", "error", err, "consecutive_failures", failures)
			}
		default:
			if failures > 0 {
				d.cfg.Log.Info("drain pass recovered", "after_failures", failures)
			}
			failures = 0
			if p.Full {
				continue
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
		case <-t.C:
		}
	}
}

// Stop waits for in-flight dispatches to be answered, up to ctx's deadline, then cancels the
// rest (their jobs are recorded as unknown outcomes: requeued if never started, else lost) and
// waits for those records. Meanwhile it keeps renewing their leases, once a poll period as the
// passes did: a grace longer than the lease (30 s against 10 s by default) must not let another
// drainer recover, as lost, a job whose answer this one is still waiting for. Call it after Run
// has returned. Idempotent.
func (d *Drainer) Stop(ctx context.Context) {
	// Stop runs no passes, so it renews the leases as a long pass does.
	stopRenewing := d.leases.keepDuring(context.Background())
	d.sends.wait(ctx)
	stopRenewing()
	d.sends.cancel()
	d.beat.markStopped()
}

// InFlight returns how many jobs this drainer holds.
func (d *Drainer) InFlight() int { return d.leases.count() }
