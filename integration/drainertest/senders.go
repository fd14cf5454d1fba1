package drainertest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer/executor"
)

// HeldSender is an executor that hands each dispatch to the test and answers only what the test
// tells it to (or Unknown when the drainer gives up): jobs stay in flight for exactly as long as
// the test wants.
type HeldSender struct {
	got chan executor.Dispatch
	// Answer takes the test's answers, one per dispatch, in the order the dispatches are sent; it
	// holds 16.
	Answer chan executor.Answer
}

// NewHeldSender returns a HeldSender with room for 16 dispatches and 16 answers.
func NewHeldSender() *HeldSender {
	return &HeldSender{got: make(chan executor.Dispatch, 16), Answer: make(chan executor.Answer, 16)}
}

// Send hands d to the test and waits for an answer on Answer, or for ctx to end.
func (s *HeldSender) Send(ctx context.Context, d executor.Dispatch) executor.Answer {
	s.got <- d
	select {
	case a := <-s.Answer:
		return a
	case <-ctx.Done():
		return executor.Answer{Kind: executor.Unknown, Err: ctx.Err()}
	}
}

// Next returns the next dispatch sent, failing t if none comes within 10 s.
func (s *HeldSender) Next(t *testing.T) executor.Dispatch {
	t.Helper()
	select {
	case d := <-s.got:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no dispatch arrived")
		return executor.Dispatch{}
	}
}

// ScriptedSender is an executor that keeps every dispatch it is sent and answers the nth (from
// 1) with Answer(n) at once; a nil Answer finishes every job "succeeded". A test scripts with it
// what the executor says without holding the drainer up.
type ScriptedSender struct {
	// Answer is called with the sender's lock held, so it may read Sent (which already holds the
	// nth dispatch) but must not call Dispatches.
	Answer func(n int) executor.Answer
	mu     sync.Mutex
	// Sent is every dispatch sent so far, guarded by the sender's lock: outside Answer, read it
	// with Dispatches.
	Sent []executor.Dispatch
}

// Send records d and returns the answer for it.
func (s *ScriptedSender) Send(_ context.Context, d executor.Dispatch) executor.Answer {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Sent = append(s.Sent, d)
	if s.Answer != nil {
		return s.Answer(len(s.Sent))
	}
	return executor.Answer{Kind: executor.Done, Status: "succeeded"}
}

// Dispatches returns a copy of every dispatch sent so far, in order.
func (s *ScriptedSender) Dispatches() []executor.Dispatch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]executor.Dispatch(nil), s.Sent...)
}

// NoopSender is an executor that finishes every job at once ("succeeded") and counts them: a
// benchmark measures sluice, not the executor, and a test that needs no answers of its own
// keeps its drainer moving.
type NoopSender struct{ n atomic.Int64 }

// Send counts d and finishes it.
func (s *NoopSender) Send(context.Context, executor.Dispatch) executor.Answer {
	s.n.Add(1)
	return executor.Answer{Kind: executor.Done, Status: "succeeded"}
}

// Answered returns how many dispatches the sender has answered.
func (s *NoopSender) Answered() int64 { return s.n.Load() }
