package drainer

import (
	"context"
	"sync"
	"time"

	"github.com/sluicehq/sluice/gate/store"
)

// leaseKeeper holds the jobs this drainer dispatched and still owns, and renews their leases
// (SPEC §4: at most every third of the lease). The claimer hands it the jobs it claims (hold);
// the dispatcher lets go of a job once its answer is dealt with (release). RunOnce is one
// renewal: the pass's upkeep calls it, and so does keepDuring's timer while a pass or a Stop runs
// long. Safe for concurrent use: mu guards held and lastRenew.
type leaseKeeper struct {
	cfg    *Config
	config *configView

	mu        sync.Mutex
	held      map[int64]int64 // job id -> version: the jobs this drainer dispatched and still owns
	lastRenew time.Time
}

// hold records jobs this drainer committed as dispatched: their leases are renewed until
// release.
func (k *leaseKeeper) hold(cs []claimed) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, c := range cs {
		k.held[c.row.ID] = c.row.Version
	}
}

// release drops c from the jobs held, unless a later claim of the same job replaced it.
func (k *leaseKeeper) release(c claimed) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if v, ok := k.held[c.row.ID]; ok && v == c.row.Version {
		delete(k.held, c.row.ID)
	}
}

// count returns how many jobs are held.
func (k *leaseKeeper) count() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.held)
}

// RunOnce extends the leases of the jobs this drainer holds, at most every third of the lease.
// Jobs past their wall are not renewed, so recovery takes them when the lease runs out. A job
// whose fenced renewal matches nothing was taken from this drainer: it is forgotten.
func (k *leaseKeeper) RunOnce(ctx context.Context, now time.Time) (int, error) {
	k.mu.Lock()
	if len(k.held) == 0 {
		k.mu.Unlock()
		return 0, nil
	}
	ids := make([]int64, 0, len(k.held))
	versions := make(map[int64]int64, len(k.held))
	for id, version := range k.held {
		ids = append(ids, id)
		versions[id] = version
	}
	k.mu.Unlock()
	cfg := k.config.get()
	cfgLease, wall := cfg.Lease(), cfg.Wall()
	k.mu.Lock()
	due := now.Sub(k.lastRenew) >= cfgLease/3 || now.Before(k.lastRenew)
	k.mu.Unlock()
	if !due {
		return 0, nil
	}
	jobs := make([]store.JobVersion, len(ids))
	for i, id := range ids {
		jobs[i] = store.JobVersion{ID: id, Version: versions[id]}
	}
	n, err := store.RenewLeases(ctx, k.cfg.DB, store.RenewLeasesParams{DrainerID: k.cfg.ID, Now: now,
		Until: now.Add(cfgLease), DispatchedAfter: now.Add(-wall), Jobs: jobs})
	if err != nil {
		return 0, err
	}
	k.mu.Lock()
	k.lastRenew = now
	k.mu.Unlock()
	if n < len(ids) {
		if err := k.forgetLost(ctx, now, wall, ids, versions); err != nil {
			return n, err
		}
	}
	return n, nil
}

// forgetLost drops from held the jobs that no longer match their fence.
func (k *leaseKeeper) forgetLost(ctx context.Context, now time.Time, wall time.Duration, ids []int64, versions map[int64]int64) error {
	leases, err := store.ReadLeases(ctx, k.cfg.DB, ids)
	if err != nil {
		return err
	}
	keep := map[int64]bool{}
	for _, l := range leases {
		if l.Version == versions[l.ID] && l.Status.InFlight() && l.DrainerID == k.cfg.ID &&
			l.DispatchedAt != nil && l.DispatchedAt.After(now.Add(-wall)) {
			keep[l.ID] = true
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, id := range ids {
		if v, ok := k.held[id]; ok && !keep[id] && v == versions[id] {
			delete(k.held, id)
		}
	}
	return nil
}

// renewNow renews the leases if a renewal is due, outside any pass.
func (k *leaseKeeper) renewNow(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, k.cfg.PollInterval)
	defer cancel()
	now, err := k.cfg.Clock.Now(ctx)
	if err == nil {
		_, err = k.RunOnce(ctx, now)
	}
	if err != nil && ctx.Err() == nil {
		k.cfg.Log.Warn("renewing leases outside a pass failed", "error", err)
	}
}

// keepDuring renews the leases once a poll period for as long as the pass (or the Stop) that
// calls it runs, and returns the function that stops it (and waits for a renewal under way). A
// pass renews after its claim, and a claim can wait for the claim lock as long as a lease (the
// 10 s lock wait, while another process holds the lock): without this, the leases of the jobs
// this drainer is running would run out meanwhile and another drainer would recover them as
// lost. A pass that ends within a poll period, nearly every one, starts no goroutine.
func (k *leaseKeeper) keepDuring(ctx context.Context) (stop func()) {
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
		k.renewNow(ctx)
		mu.Lock()
		if !stopped {
			t.Reset(k.cfg.PollInterval)
		}
		mu.Unlock()
	}
	mu.Lock()
	t = time.AfterFunc(k.cfg.PollInterval, tick)
	mu.Unlock()
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
		running.Wait()
	}
}
