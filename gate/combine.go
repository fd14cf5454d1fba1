package gate

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
)

// maxGroup bounds the admissions one shared transaction carries.
const maxGroup = 64

// errGroupLocked is a group's failure to lock its tenants at once: another transaction holds
// one of them (another process's admission or batch). A group never waits for a lock: if it
// did, every tenant in it would wait on one tenant's lock, and a tenant whose lock is held long
// (a wedged connection elsewhere) would stall the admissions of every other tenant in the
// process. Its members then run alone, each waiting only for its own tenant's lock, as without
// grouping. Groups do not take tenants a lane of this process holds (combiner.held), so only
// other processes make a group fall apart.
var errGroupLocked = errors.New("a tenant of the group is locked by another transaction")

// errRunAlone tells a member of a group that fell apart to run on its own.
var errRunAlone = errors.New("run alone")

// combiner commits concurrent single admissions together (group commit). An admission that finds a
// lane free (see stallAfter below: with it, no lane running) runs at once, alone; one that arrives
// while the lanes are busy waits, and when a transaction ends the admissions that waited meanwhile
// share the next one. One client pays no added latency; many clients pay one lock, one read and one
// COMMIT per group instead of per job, which is what lets HTTP admission keep pace with the raw
// two-row transaction on a small machine (SPEC §14). A group is decided exactly like a batch
// (AdmitBatch): each item by the same rules, in arrival order, later items seeing the earlier ones'
// effect on the depths. Two admissions with the same idempotency key never share a group, so the
// second is decided after the first committed, as without grouping.
//
// No goroutine of its own: the admission that leads a group runs it on its own goroutine and,
// when done, hands the waiting queue to the first waiter, which leads the next group. The
// start confirmations' group commit (gate/groupcommit) waits, cancels and hands off by the same
// protocol without the tenant holds: a fix to one belongs in both.
//
// With stallAfter set, one lane runs while it keeps up: an admission arriving while it runs
// waits for the next group, even with another lane free, so that more admissions share each
// transaction (a transaction's fixed cost is most of a single admission's work). Another lane
// opens only for admissions that have waited stallAfter (the running lane is slow: waiting for
// a tenant's lock that another process or a batch holds, say), so one stuck admission still
// cannot hold up the others for long; and it closes at its hand-off while the admissions
// waiting are younger than that. The one exception is overlap: once the running lane has read
// its state, the admissions waiting start their transaction in another lane, so that their lock
// and read run during its inserts and COMMIT (at 4 clients, 10 % more admissions a second).
type combiner struct {
	lanes int // transactions that may run at once
	// stallAfter is how long admissions wait for a lane before another opens; 0 opens every
	// lane at once.
	stallAfter time.Duration
	// run decides items in one transaction (Admitter.run; shared marks a group). Unit tests
	// replace it.
	run func(ctx context.Context, items []*item, cfg config.Config, shared bool, read func()) error

	mu      sync.Mutex
	running int
	queue   []*waiter
	held    map[string]int // tenants of the admissions running in lanes, with their counts
	armed   bool           // a timer will look for admissions waiting stallAfter (unstall)
}

// waiter is an admission waiting in the queue.
type waiter struct {
	it    *item
	since time.Time      // when it began to wait
	taken bool           // in a group; guarded by combiner.mu
	lead  chan []*waiter // the group it is to lead
	done  chan error     // its outcome, when another led its group
}

// admit decides it, alone or in a group, and returns its outcome (it.res, it.err) or an error
// for the whole transaction.
func (a *Admitter) admit(ctx context.Context, it *item, cfg config.Config) error {
	c := &a.combine
	w := &waiter{it: it}
	c.mu.Lock()
	// A free lane is taken at once, unless another lane holds the tenant: a group just handed
	// a lane (handOff) may hold it before its leader's transaction has begun, and two
	// transactions on one tenant would wait on its row lock (a group's, which does not wait,
	// would fall apart). The admission queues instead, and the hand-off of the lane holding the
	// tenant takes it.
	if c.running < c.open() && c.held[it.req.Tenant] == 0 {
		c.running++
		c.hold([]*waiter{w}, 1)
		c.mu.Unlock()
		return a.lead(ctx, []*waiter{w}, cfg)
	}
	w.lead, w.done = make(chan []*waiter, 1), make(chan error, 1)
	w.since = time.Now()
	c.queue = append(c.queue, w)
	c.arm(a)
	c.mu.Unlock()
	select {
	case g := <-w.lead:
		return a.lead(ctx, g, cfg)
	case err := <-w.done:
		if errors.Is(err, errRunAlone) {
			return c.run(ctx, []*item{it}, cfg, false, nil)
		}
		return err
	case <-ctx.Done():
	}
	c.mu.Lock()
	if !w.taken {
		for i, q := range c.queue {
			if q == w {
				c.queue = append(c.queue[:i], c.queue[i+1:]...)
				break
			}
		}
		c.mu.Unlock()
		return unavailable(ctx.Err()) // nothing was written
	}
	c.mu.Unlock()
	// Already in a group that is being decided: its outcome is this admission's.
	select {
	case g := <-w.lead:
		return a.lead(context.WithoutCancel(ctx), g, cfg)
	case err := <-w.done:
		if errors.Is(err, errRunAlone) {
			return unavailable(ctx.Err()) // its group wrote nothing
		}
		return err
	}
}

// lead runs group g (g[0] is the caller's own admission), hands the slot to the next group and
// delivers every other member's outcome.
func (a *Admitter) lead(ctx context.Context, g []*waiter, cfg config.Config) error {
	own := ctx
	if len(g) > 1 {
		// The members' requests must not fail because the leader's client went away.
		ctx = context.WithoutCancel(ctx)
	}
	items := make([]*item, len(g))
	for i, w := range g {
		items[i] = w.it
	}
	err := a.combine.run(ctx, items, cfg, len(g) > 1, a.overlap)
	a.handOff(g)
	if errors.Is(err, errGroupLocked) {
		for _, w := range g[1:] {
			w.done <- errRunAlone
		}
		return a.combine.run(own, items[:1], cfg, false, nil)
	}
	for _, w := range g[1:] {
		w.done <- memberErr(err, w.it)
	}
	return memberErr(err, g[0].it)
}

// open is how many lanes an arriving admission may take: all of them without stallAfter, else
// one (more open only in unstall). c.mu is held.
func (c *combiner) open() int {
	if c.stallAfter <= 0 {
		return c.lanes
	}
	return 1
}

// arm makes sure a timer will look at the queue once its oldest admission has waited
// stallAfter (unstall). Host time, not Config.Clock: it paces a wait, like a timeout. c.mu is
// held.
func (c *combiner) arm(a *Admitter) {
	if c.stallAfter <= 0 || c.armed || len(c.queue) == 0 || c.running >= c.lanes {
		return
	}
	c.armed = true
	time.AfterFunc(max(c.stallAfter-time.Since(c.queue[0].since), 0), a.unstall)
}

// unstall opens another lane for the admissions queued when the oldest has waited stallAfter
// and a lane is free, or arms the timer again for the oldest one's turn.
func (a *Admitter) unstall() {
	c := &a.combine
	c.mu.Lock()
	c.armed = false
	if len(c.queue) == 0 || c.running >= c.lanes {
		c.mu.Unlock()
		return
	}
	if time.Since(c.queue[0].since) < c.stallAfter {
		c.arm(a)
		c.mu.Unlock()
		return
	}
	c.running++
	a.leadNext() // unlocks c.mu
}

// overlap opens another lane, once a lane's transaction has read its state, for the admissions
// that queued meanwhile: their lock and read run during the first lane's inserts and COMMIT,
// instead of after them. Their tenants differ (the first lane holds its own until its hand-off),
// so neither waits for the other's locks. The first lane's hand-off closes it again while the
// admissions waiting are younger than stallAfter, so at most two lanes overlap this way.
func (a *Admitter) overlap() {
	c := &a.combine
	c.mu.Lock()
	if len(c.queue) == 0 || c.running >= c.lanes {
		c.mu.Unlock()
		return
	}
	c.running++
	a.leadNext() // unlocks c.mu
}

// handOff gives the lane of finished group done to the admissions that queued meanwhile, or
// frees it. Admissions of a tenant that the other lanes hold wait for the next hand-off. A lane
// that unstall opened closes while the admissions waiting are younger than stallAfter: the
// other lane's hand-off takes them.
func (a *Admitter) handOff(done []*waiter) {
	c := &a.combine
	c.mu.Lock()
	c.hold(done, -1)
	if c.running > c.open() && (len(c.queue) == 0 || time.Since(c.queue[0].since) < c.stallAfter) {
		c.running--
		c.arm(a)
		c.mu.Unlock()
		return
	}
	a.leadNext()
}

// leadNext gives a lane the caller holds (counted in c.running) to the next group of the queue,
// or frees it. c.mu is held, and unlocked on return.
func (a *Admitter) leadNext() {
	c := &a.combine
	var g, rest []*waiter
	keys := map[string]bool{}
	for _, w := range c.queue {
		k := ""
		if w.it.req.IdempotencyKey != nil {
			k = keyOf(w.it.req.Tenant, *w.it.req.IdempotencyKey)
		}
		if len(g) == maxGroup || (k != "" && keys[k]) || c.held[w.it.req.Tenant] > 0 {
			rest = append(rest, w)
			continue
		}
		if k != "" {
			keys[k] = true
		}
		w.taken = true
		g = append(g, w)
	}
	c.queue = rest
	if len(g) == 0 {
		// Whoever waits is of a tenant another lane holds: that lane's hand-off takes it.
		c.running--
		c.mu.Unlock()
		return
	}
	c.hold(g, 1)
	c.arm(a)
	c.mu.Unlock()
	g[0].lead <- g
}

// hold counts the tenants of g as held by a lane (by +1) or no longer (by -1). c.mu is held.
func (c *combiner) hold(g []*waiter, by int) {
	if c.held == nil {
		c.held = map[string]int{}
	}
	for _, w := range g {
		if c.held[w.it.req.Tenant] += by; c.held[w.it.req.Tenant] <= 0 {
			delete(c.held, w.it.req.Tenant)
		}
	}
}

// memberErr is one member's view of a group's error: an unknown COMMIT outcome is retryable for
// a keyed request only and names the member's own row.
func memberErr(err error, it *item) error {
	var je *job.Error
	if !errors.As(err, &je) || je.Code != job.CodeOutcomeUnknown {
		return err
	}
	d := map[string]any{"retryable": it.req.IdempotencyKey != nil || it.retryOf != nil}
	if it.id != 0 {
		d["id"] = it.id
	}
	return &job.Error{Code: je.Code, Err: je.Err, Message: je.Message, Detail: d}
}

// Waiting returns how many single admissions are waiting for a transaction lane.
func (a *Admitter) Waiting() int {
	a.combine.mu.Lock()
	defer a.combine.mu.Unlock()
	return len(a.combine.queue)
}
