package drainertest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer/executor"
)

// Executor is the tests' one fake executor (drainer.Config.Executor): a test scripts what each
// dispatch is answered, and when, without an HTTP executor that could give only the answers it
// was written for. Safe for concurrent use; set its fields before the first dispatch and leave
// them alone after.
//
// The zero value finishes every job at once ("succeeded") and only counts them (Answered): a
// benchmark measures sluice, not the executor, so that path costs one atomic add.
type Executor struct {
	// Answer answers the nth dispatch (n from 1, in the order they reach the executor). It may be
	// called from several goroutines at once, and may block to hold a job in flight. Nil: every
	// job finishes "succeeded".
	Answer func(ctx context.Context, n int, d executor.Dispatch) executor.Answer
	// Hold, when set, puts the executor in hold mode, for a test that decides each answer itself
	// while the job is in flight: each dispatch is handed to the test on Hold (blocking until
	// there is room) and waits for its Held.Reply, an answer on Replies, or its context to end
	// (Unknown, as when the drainer gives up). Answer is not called. Several executors may share
	// one Hold. NewHeld makes one.
	Hold chan *Held
	// Replies answers held dispatches in turn, whichever takes an answer first: a test that does
	// not care which job gets which answer can send them before it has taken the dispatches.
	Replies chan executor.Answer
	// Record keeps every dispatch for Dispatches and Sent. It is off by default so that the
	// benchmarks' executor takes no lock.
	Record bool

	n        atomic.Int64 // dispatches numbered (Answer's n)
	answered atomic.Int64
	mu       sync.Mutex
	sent     []executor.Dispatch // guarded by mu
}

// Held is a dispatch an executor in hold mode has handed to the test, in flight until it is
// answered.
type Held struct {
	executor.Dispatch
	N     int // the dispatch's number, from 1
	reply chan executor.Answer
}

// Reply answers the held dispatch; it never blocks. Answer each dispatch once.
func (h *Held) Reply(a executor.Answer) { h.reply <- a }

// NewHeld returns an executor in hold mode with room for 16 held dispatches and 16 Replies.
func NewHeld() *Executor {
	return &Executor{Hold: make(chan *Held, 16), Replies: make(chan executor.Answer, 16)}
}

// Send answers d as scripted.
func (e *Executor) Send(ctx context.Context, d executor.Dispatch) executor.Answer {
	if e.Answer == nil && e.Hold == nil && !e.Record { // the zero value: kept apart, and cheap
		e.answered.Add(1)
		return executor.Answer{Kind: executor.Done, Status: "succeeded"}
	}
	a := e.script(ctx, d)
	e.answered.Add(1)
	return a
}

// script numbers (and records) d, then answers it in hold mode or with Answer.
func (e *Executor) script(ctx context.Context, d executor.Dispatch) executor.Answer {
	n := e.number(d)
	switch {
	case e.Hold != nil:
		h := &Held{Dispatch: d, N: n, reply: make(chan executor.Answer, 1)}
		e.Hold <- h
		select {
		case a := <-h.reply:
			return a
		case a := <-e.Replies:
			return a
		case <-ctx.Done():
			return executor.Answer{Kind: executor.Unknown, Err: ctx.Err()}
		}
	case e.Answer != nil:
		return e.Answer(ctx, n, d)
	}
	return executor.Answer{Kind: executor.Done, Status: "succeeded"}
}

// number numbers d and records it if asked; recording numbers under the lock, so that the nth
// dispatch recorded is the one answered as the nth.
func (e *Executor) number(d executor.Dispatch) int {
	if !e.Record {
		return int(e.n.Add(1))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sent = append(e.sent, d)
	return int(e.n.Add(1))
}

// Next takes the next dispatch held (in hold mode), failing t if none comes within 10 s.
func (e *Executor) Next(t *testing.T) *Held {
	t.Helper()
	select {
	case h := <-e.Hold:
		return h
	case <-time.After(10 * time.Second):
		t.Fatal("no dispatch arrived")
		return nil
	}
}

// Dispatches returns a copy of every dispatch sent so far, in order. It panics unless Record is
// set: an empty record that was never kept would pass a check that nothing was dispatched.
func (e *Executor) Dispatches() []executor.Dispatch {
	if !e.Record {
		panic("drainertest: Dispatches of an Executor without Record")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]executor.Dispatch(nil), e.sent...)
}

// Sent returns the dispatches of job id sent so far, in order. It panics unless Record is set.
func (e *Executor) Sent(id int64) []executor.Dispatch {
	var got []executor.Dispatch
	for _, d := range e.Dispatches() {
		if d.JobID == id {
			got = append(got, d)
		}
	}
	return got
}

// Answered returns how many dispatches the executor has answered.
func (e *Executor) Answered() int64 { return e.answered.Load() }
