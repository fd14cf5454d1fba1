// Package drainer moves queued jobs to the executor: it reacts to pokes, polls once a second as
// the backstop, claims eligible jobs under the global and per-tenant caps, dispatches them,
// records their outcomes (fenced on the claimed version), renews leases and recovers the jobs of
// drainers that died. One pass of all of that is RunOnce; Run only schedules passes.
package drainer

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/limits"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/outbox"
)

// Sender sends a dispatch to the executor and classifies its answer. *executor.Client is one.
// Send blocks until the answer or until ctx ends; it must be safe for concurrent use.
type Sender interface {
	Send(ctx context.Context, d executor.Dispatch) executor.Answer
}

// Gates is the rate-gate store as the drainer uses it (SPEC §5). Implementations fail open:
// NotBefore returns what it could read and an error the drainer only counts and logs.
type Gates interface {
	// NotBefore returns the gate instant of each gated key among hashes.
	NotBefore(ctx context.Context, hashes []string) (map[string]time.Time, error)
	// Extend gates hash for retryAfter seconds from now, never shortening a longer gate.
	Extend(ctx context.Context, hash string, retryAfter int) (time.Time, error)
}

// Config configures a Drainer. Field docs give the defaults.
type Config struct {
	// DB is the sluice database. Required.
	DB *sql.DB
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
	// Gates, if set, is consulted before claiming and written on an executor's 429.
	Gates Gates
	// PollInterval is the backstop poll period. Default 1 s.
	PollInterval time.Duration
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
	// Recorded, if set, is called after the drainer has dealt with an executor's answer to
	// dispatch jobID (recorded it, or found it fenced off). A test signal: tests wait on it
	// instead of on time. Nil in production.
	Recorded func(jobID int64)
}

// Drainer claims and dispatches jobs. Its methods are safe for concurrent use.
type Drainer struct {
	cfg   Config
	store *store.Store
	wake  chan struct{}
	host  string // written in heartbeats; read once, not on every beat
	pid   int

	passMu sync.Mutex // one pass at a time

	mu        sync.Mutex
	held      map[int64]int64 // job id -> version: the jobs this drainer dispatched and still owns
	lastRenew time.Time
	lastBeat  time.Time
	lastClaim time.Time
	rrLast    string // round_robin: the tenant served last
	probe     bool   // the last pass left the queue empty: the next one probes for a lone job

	viewed     bool          // a claim transaction has run
	viewCfg    limits.Config // the runtime config the last claim transaction read
	lastUpkeep time.Time     // renewal and recovery run at most once per PollInterval
	headCache  headCache     // queue heads read but not yet claimed
	gatedSeen  gatedSeen     // rate keys found gated by recent passes (guarded by passMu)

	// Outcome recording is batched: the first dispatch goroutine to find no batch in progress
	// writes everyone's outcomes queued meanwhile in one transaction (group commit).
	recMu    sync.Mutex
	recQueue []*outcomeReq
	recBusy  bool

	work       context.Context // dispatches run under it; canceled by Stop after the grace
	cancelWork context.CancelFunc
	dispatches sync.WaitGroup
	// unanswered counts the dispatches sent whose answer has not yet been recorded and acted on
	// (asynchronous executors' jobs leave it at the 202). Bar the moment between an outcome's
	// commit and its decrement, which is followed by a wake, those jobs are in flight in the
	// database whatever else is; when they alone fill the global cap no claim can start anything
	// (see claim).
	unanswered atomic.Int64
	poked      atomic.Bool // a Poke since the last claim
}

// New returns a Drainer, or an "invalid config" error naming the field.
func New(cfg Config) (*Drainer, error) {
	if cfg.DB == nil {
		return nil, errors.New("invalid config: DB: required")
	}
	if cfg.Executor == nil {
		return nil, errors.New("invalid config: Executor: required")
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
	work, cancel := context.WithCancel(context.Background())
	return &Drainer{
		cfg:        cfg,
		store:      &store.Store{Prefix: cfg.Prefix, Log: cfg.Log, Metrics: cfg.JobMetrics},
		wake:       make(chan struct{}, 1),
		held:       map[int64]int64{},
		probe:      true,
		host:       host,
		pid:        os.Getpid(),
		work:       work,
		cancelWork: cancel,
	}, nil
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
	d.poked.Store(true)
	d.Wake()
}

// Pass reports what one RunOnce did.
type Pass struct {
	Renewed   int
	Recovered int
	// Expired counts queued jobs expired for max_queue_age_seconds.
	Expired int
	Claimed int
	// Full is true when the pass stopped at ClaimBatch with capacity possibly left.
	Full bool
}

// RunOnce does one drain pass: claim what the caps allow and start dispatching it, then (at most
// once per PollInterval: leases last many poll periods, and a poke-driven pass should cost only
// the claim) renew this drainer's leases and recover expired claims. Dispatches run in goroutines
// owned by the Drainer (Stop waits for them); RunOnce does not wait for their outcomes. Passes do
// not overlap: a call waits for one in progress.
func (d *Drainer) RunOnce(ctx context.Context) (Pass, error) {
	d.passMu.Lock()
	defer d.passMu.Unlock()
	defer d.keepLeasesDuring(ctx)()
	var p Pass
	now, err := d.cfg.Clock.Now(ctx)
	if err != nil {
		return p, err
	}
	// The claim goes first and the upkeep after it, so that a poke's job is not held up by the
	// upkeep's statements (about one pass a second does both). A failed claim does not skip the
	// upkeep: leases must be renewed whatever else fails.
	upkeep := d.lastUpkeep.IsZero() || now.Sub(d.lastUpkeep) >= d.cfg.PollInterval || now.Before(d.lastUpkeep)
	out, full, err := d.claim(ctx, now)
	p.Claimed, p.Full = len(out), full
	d.started(now, out)
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
			more, p.Full, err = d.claim(ctx, now)
			p.Claimed += len(more)
			d.started(now, more)
		}
	}
	if err != nil {
		return p, err
	}
	if !beaten {
		if err := d.heartbeat(ctx, now); err != nil {
			d.cfg.Log.Warn("drainer heartbeat failed", "error", err)
		}
	}
	if d.cfg.Metrics != nil {
		d.cfg.Metrics.observePass(p)
	}
	return p, nil
}

// upkeep renews this drainer's leases, recovers expired ones and expires queued jobs past
// max_queue_age_seconds, re-reading the runtime config
// first when something depends on it (configNeeded). A config that changed gets a pass of its
// own at once (Wake). With beat, a heartbeat that is due is written in the lease scan's round
// trip (two statements a second fewer for an idle drainer than config, scan and heartbeat
// apart); beaten reports whether it was.
func (d *Drainer) upkeep(ctx context.Context, now time.Time, p *Pass, beat bool) (beaten bool, err error) {
	fresh := false
	if d.configNeeded() {
		if err := d.refreshConfig(ctx); err != nil {
			return false, err
		}
		fresh = true
	}
	if p.Renewed, err = d.renew(ctx, now); err != nil {
		return false, err
	}
	var hb *heartbeatSQL
	if beat {
		hb = d.dueHeartbeat(now)
	}
	expired, err := d.scanExpired(ctx, now, hb)
	if err != nil {
		return hb != nil, err
	}
	if p.Recovered, err = d.recover(ctx, now, fresh, expired); err != nil {
		return hb != nil, err
	}
	if p.Expired, err = d.expire(ctx, now); err != nil {
		return hb != nil, err
	}
	// Jobs requeued elsewhere keep their place in their tenant's queue; the cache is dropped so
	// that they are seen within one poll interval.
	d.headCache.reset()
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
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.viewed || len(d.held) > 0 || !d.probe
}

// refreshConfig re-reads the runtime config, and wakes a pass if it changed.
func (d *Drainer) refreshConfig(ctx context.Context) error {
	cfg, err := loadLimits(ctx, d.cfg.DB)
	if err != nil {
		return err
	}
	if !reflect.DeepEqual(cfg, d.lastConfig()) {
		d.Wake()
	}
	d.remember(cfg)
	return nil
}

// Run drains until ctx is done: a pass on every wake and at least every PollInterval. It
// returns when ctx is done; in-flight dispatches go on until Stop.
func (d *Drainer) Run(ctx context.Context) {
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
	done := make(chan struct{})
	go func() {
		d.dispatches.Wait()
		close(done)
	}()
	// Stop runs no passes, so it renews the leases as a long pass does.
	stopRenewing := d.keepLeasesDuring(context.Background())
	select {
	case <-done:
	case <-ctx.Done():
		d.cancelWork()
		<-done
	}
	stopRenewing()
	d.cancelWork()
	d.markStopped()
}

// renewNow renews this drainer's leases if a renewal is due, outside any pass.
func (d *Drainer) renewNow(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.PollInterval)
	defer cancel()
	now, err := d.cfg.Clock.Now(ctx)
	if err == nil {
		_, err = d.renew(ctx, now)
	}
	if err != nil && ctx.Err() == nil {
		d.cfg.Log.Warn("renewing leases outside a pass failed", "error", err)
	}
}

// keepLeasesDuring renews this drainer's leases once a poll period for as long as the pass (or
// the Stop) that calls it runs, and returns the function that stops it (and waits for a renewal
// under way). A pass renews after its claim, and a claim can wait for the claim lock as long as a lease (the
// 10 s lock wait, while another process holds the lock): without this, the leases of the jobs
// this drainer is running would run out meanwhile and another drainer would recover them as
// lost. A pass that ends within a poll period, nearly every one, starts no goroutine.
func (d *Drainer) keepLeasesDuring(ctx context.Context) (stop func()) {
	var mu sync.Mutex
	var stopped bool
	var running sync.WaitGroup
	var t *time.Timer
	tick := func() {
		mu.Lock()
		if stopped {
			mu.Unlock()
			return
		}
		running.Add(1)
		mu.Unlock()
		defer running.Done()
		d.renewNow(ctx)
		mu.Lock()
		if !stopped {
			t.Reset(d.cfg.PollInterval)
		}
		mu.Unlock()
	}
	mu.Lock()
	t = time.AfterFunc(d.cfg.PollInterval, tick)
	mu.Unlock()
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
		running.Wait()
	}
}

// markStopped records a clean stop in the heartbeat row, so that status does not report a
// drainer that exited on purpose as stalled. Best effort: a drainer killed instead is judged by
// its heartbeat's age.
func (d *Drainer) markStopped() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := d.cfg.DB.ExecContext(ctx, "UPDATE drainers SET stopped_at = UTC_TIMESTAMP(6), in_flight = ? WHERE id = ?",
		d.InFlight(), d.cfg.ID); err != nil {
		d.cfg.Log.Warn("could not record the drainer's stop", "error", err)
	}
}

// InFlight returns how many jobs this drainer holds.
func (d *Drainer) InFlight() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.held)
}

func newNonce() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("mint nonce: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// renew extends the leases of the jobs this drainer holds, at most every third of the lease.
// Jobs past their wall are not renewed, so recovery takes them when the lease runs out. A job
// whose fenced renewal matches nothing was taken from this drainer: it is forgotten.
func (d *Drainer) renew(ctx context.Context, now time.Time) (int, error) {
	d.mu.Lock()
	if len(d.held) == 0 {
		d.mu.Unlock()
		return 0, nil
	}
	ids := make([]int64, 0, len(d.held))
	versions := make(map[int64]int64, len(d.held))
	for id, version := range d.held {
		ids = append(ids, id)
		versions[id] = version
	}
	d.mu.Unlock()
	cfg := d.lastConfig()
	cfgLease, wall := cfg.Lease(), cfg.Wall()
	d.mu.Lock()
	due := now.Sub(d.lastRenew) >= cfgLease/3 || now.Before(d.lastRenew)
	d.mu.Unlock()
	if !due {
		return 0, nil
	}
	// A renewal only ever extends: a 202 answered while this statement was on its way has moved
	// the job's lease to its wall (leaseToWall), and must not be cut back to one lease.
	q := "UPDATE jobs SET lease_until = GREATEST(COALESCE(lease_until, ?), ?) WHERE drainer_id = ? AND status IN ('claimed','dispatched','running') AND dispatched_at > ? AND ("
	args := []any{now, now.Add(cfgLease), d.cfg.ID, now.Add(-wall)}
	for i, id := range ids {
		if i > 0 {
			q += " OR "
		}
		q += "(id = ? AND version = ?)"
		args = append(args, id, versions[id])
	}
	q += ")"
	res, err := d.cfg.DB.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("renew leases: %w", err)
	}
	n, _ := res.RowsAffected()
	d.mu.Lock()
	d.lastRenew = now
	d.mu.Unlock()
	if int(n) < len(ids) {
		if err := d.forgetLost(ctx, now, wall, ids, versions); err != nil {
			return int(n), err
		}
	}
	return int(n), nil
}

// forgetLost drops from d.held the jobs that no longer match their fence.
func (d *Drainer) forgetLost(ctx context.Context, now time.Time, wall time.Duration, ids []int64, versions map[int64]int64) error {
	rows, err := d.cfg.DB.QueryContext(ctx, "SELECT id, version, status, drainer_id, dispatched_at FROM jobs WHERE id IN ("+store.Placeholders(len(ids))+")", int64Args(ids)...)
	if err != nil {
		return fmt.Errorf("check held jobs: %w", err)
	}
	defer rows.Close()
	keep := map[int64]bool{}
	for rows.Next() {
		var id, version int64
		var status string
		var drainer sql.NullString
		var dispatched sql.NullTime
		if err := rows.Scan(&id, &version, &status, &drainer, &dispatched); err != nil {
			return fmt.Errorf("check held jobs: %w", err)
		}
		if version == versions[id] && job.Status(status).InFlight() && drainer.String == d.cfg.ID &&
			dispatched.Valid && dispatched.Time.After(now.Add(-wall)) {
			keep[id] = true
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("check held jobs: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, id := range ids {
		if v, ok := d.held[id]; ok && !keep[id] && v == versions[id] {
			delete(d.held, id)
		}
	}
	return nil
}

// heartbeatSQL is the statement that writes this drainer's heartbeat row.
type heartbeatSQL struct {
	query string
	args  []any
}

// started dispatches what a claim took, and notes when, for the heartbeat.
func (d *Drainer) started(now time.Time, out []claimed) {
	if len(out) == 0 {
		return
	}
	d.mu.Lock()
	d.lastClaim = now
	d.mu.Unlock()
	for _, c := range out {
		d.startDispatch(c)
	}
}

// dueHeartbeat returns the heartbeat to write if one is due (at most two a poll period), and
// records it as written.
func (d *Drainer) dueHeartbeat(now time.Time) *heartbeatSQL {
	d.mu.Lock()
	defer d.mu.Unlock()
	if now.Sub(d.lastBeat) < d.cfg.PollInterval/2 && !now.Before(d.lastBeat) {
		return nil
	}
	d.lastBeat = now
	var lastClaim any
	if !d.lastClaim.IsZero() {
		lastClaim = d.lastClaim
	}
	// A drainer restarted under the same id (a fixed SLUICE_DRAINER_ID) is a new process: the
	// row's start time follows the pid, and a clean stop recorded earlier is cleared.
	return &heartbeatSQL{query: `INSERT INTO drainers (id, host, pid, version, started_at, heartbeat_at,
		last_poll_at, last_claim_at, in_flight, poll_interval_ms)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE
		started_at = IF(pid = VALUES(pid) AND host = VALUES(host), started_at, VALUES(started_at)),
		host = VALUES(host), pid = VALUES(pid), version = VALUES(version),
		heartbeat_at = VALUES(heartbeat_at), last_poll_at = VALUES(last_poll_at),
		last_claim_at = VALUES(last_claim_at), in_flight = VALUES(in_flight),
		poll_interval_ms = VALUES(poll_interval_ms), stopped_at = NULL`,
		args: []any{d.cfg.ID, d.host, d.pid, d.cfg.BuildVersion, now, now, now, lastClaim, len(d.held), d.cfg.PollInterval.Milliseconds()}}
}

func (d *Drainer) heartbeat(ctx context.Context, now time.Time) error {
	hb := d.dueHeartbeat(now)
	if hb == nil {
		return nil
	}
	if _, err := d.cfg.DB.ExecContext(ctx, hb.query, hb.args...); err != nil {
		return fmt.Errorf("drainer heartbeat: %w", err)
	}
	return nil
}
