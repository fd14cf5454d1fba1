// Package groupcommit runs concurrent small writes in shared transactions: a request that
// arrives while the write lanes are busy waits, and when a transaction ends, the requests that
// waited meanwhile share the next one. One caller pays no added latency; many callers pay one
// BEGIN and one COMMIT (one log flush) per group instead of one per request.
//
// It has no goroutine of its own: the request that leads a group runs it on its own goroutine
// and, when done, hands the lane to the first waiter, which leads the next group. The admission
// combiner (gate/combine.go) is the same idea with tenant locks and idempotency keys to respect
// (its waiting, cancelling and hand-off follow the same protocol: a fix to one belongs in both);
// this one is for writes that never wait for a lock inside their transaction (the caller's run
// must make sure of that, say with SKIP LOCKED), so a group cannot stall behind another
// transaction and needs nothing more than a queue.
package groupcommit

import (
	"context"
	"sync"
)

// Group runs the requests of type T given to Do in shared calls of its run function.
type Group[T any] struct {
	lanes int
	max   int
	// run writes batch in one transaction and records each member's own outcome in it; its error
	// is every member's (the transaction as a whole failed).
	run func(ctx context.Context, batch []T) error

	mu      sync.Mutex
	running int
	queue   []*waiter[T]
}

// waiter is a request waiting in the queue.
type waiter[T any] struct {
	it    T
	taken bool              // in a group; guarded by Group.mu
	lead  chan []*waiter[T] // the group it is to lead
	done  chan error        // its group's outcome, when another led it
}

// New returns a Group that runs at most lanes transactions at once, each of at most size
// requests, through run.
func New[T any](lanes, size int, run func(ctx context.Context, batch []T) error) *Group[T] {
	return &Group[T]{lanes: max(lanes, 1), max: max(size, 1), run: run}
}

// Do runs it, alone when a lane is free, else in the next group, and returns its group's error.
// A request whose ctx ends while it waits, before a group took it, is dropped with ctx's error
// and nothing of it was written; once taken, its group's outcome is its own.
func (g *Group[T]) Do(ctx context.Context, it T) error {
	w := &waiter[T]{it: it}
	g.mu.Lock()
	if g.running < g.lanes {
		g.running++
		g.mu.Unlock()
		return g.lead(ctx, []*waiter[T]{w})
	}
	w.lead, w.done = make(chan []*waiter[T], 1), make(chan error, 1)
	g.queue = append(g.queue, w)
	g.mu.Unlock()
	select {
	case batch := <-w.lead:
		return g.lead(ctx, batch)
	case err := <-w.done:
		return err
	case <-ctx.Done():
	}
	g.mu.Lock()
	if !w.taken {
		for i, q := range g.queue {
			if q == w {
				g.queue = append(g.queue[:i], g.queue[i+1:]...)
				break
			}
		}
		g.mu.Unlock()
		return ctx.Err()
	}
	g.mu.Unlock()
	select {
	case batch := <-w.lead:
		return g.lead(context.WithoutCancel(ctx), batch)
	case err := <-w.done:
		return err
	}
}

// lead runs batch (batch[0] is the caller's own request), hands the lane on and delivers the
// outcome to the other members.
func (g *Group[T]) lead(ctx context.Context, batch []*waiter[T]) error {
	if len(batch) > 1 {
		// The members' requests must not fail because the leader's client went away.
		ctx = context.WithoutCancel(ctx)
	}
	items := make([]T, len(batch))
	for i, w := range batch {
		items[i] = w.it
	}
	err := g.run(ctx, items)
	g.handOff()
	for _, w := range batch[1:] {
		w.done <- err
	}
	return err
}

// handOff gives the caller's lane to the requests that queued meanwhile, or frees it.
func (g *Group[T]) handOff() {
	g.mu.Lock()
	if len(g.queue) == 0 {
		g.running--
		g.mu.Unlock()
		return
	}
	n := min(len(g.queue), g.max)
	batch := g.queue[:n:n]
	g.queue = g.queue[n:]
	for _, w := range batch {
		w.taken = true
	}
	g.mu.Unlock()
	batch[0].lead <- batch
}

// Waiting returns how many requests wait for a lane.
func (g *Group[T]) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.queue)
}
