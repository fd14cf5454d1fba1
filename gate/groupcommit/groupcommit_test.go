package groupcommit

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/integration/wait"
)

// recorder is a run function that records its batches and blocks each until released.
type recorder struct {
	mu      sync.Mutex
	batches [][]int
	entered chan []int
	release chan error
}

func newRecorder() *recorder {
	return &recorder{entered: make(chan []int, 100), release: make(chan error)}
}

func (r *recorder) run(ctx context.Context, batch []int) error {
	r.mu.Lock()
	r.batches = append(r.batches, slices.Clone(batch))
	r.mu.Unlock()
	r.entered <- slices.Clone(batch)
	err := <-r.release
	if err == nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// TestGroups: a request that finds the lane free runs at once, alone; those that arrive while
// it runs share the next transaction, at most max to a group, in arrival order; each member
// gets its group's error.
func TestGroups(t *testing.T) {
	rec := newRecorder()
	g := New(1, 3, rec.run)
	ctx := context.Background()
	errs := make(chan error, 10)
	go func() { errs <- g.Do(ctx, 0) }()
	if got := <-rec.entered; !slices.Equal(got, []int{0}) {
		t.Fatalf("first batch %v, want [0] at once", got)
	}
	for i := 1; i <= 4; i++ {
		go func() { errs <- g.Do(ctx, i) }()
		wait.Until(t, 10*time.Second, "the request to queue", func() bool { return g.Waiting() == i })
	}
	failed := errors.New("commit failed")
	rec.release <- nil
	if got := <-rec.entered; !slices.Equal(got, []int{1, 2, 3}) {
		t.Fatalf("second batch %v, want the first three waiters", got)
	}
	rec.release <- failed
	if got := <-rec.entered; !slices.Equal(got, []int{4}) {
		t.Fatalf("third batch %v, want the last waiter", got)
	}
	rec.release <- nil
	var nils, fails int
	for range 5 {
		switch err := <-errs; {
		case err == nil:
			nils++
		case errors.Is(err, failed):
			fails++
		default:
			t.Errorf("unexpected error %v", err)
		}
	}
	if nils != 2 || fails != 3 {
		t.Errorf("%d succeeded, %d failed; want the failed group's three members to fail", nils, fails)
	}
	if g.Waiting() != 0 || g.running != 0 {
		t.Errorf("after all: %d waiting, %d running", g.Waiting(), g.running)
	}
}

// TestCanceledWhileWaiting: a request whose context ends before a group takes it returns the
// context's error and is never run.
func TestCanceledWhileWaiting(t *testing.T) {
	rec := newRecorder()
	g := New(1, 8, rec.run)
	done := make(chan error, 1)
	go func() { done <- g.Do(context.Background(), 1) }()
	<-rec.entered
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() { gone <- g.Do(ctx, 2) }()
	wait.Until(t, 10*time.Second, "the request to queue", func() bool { return g.Waiting() == 1 })
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Errorf("canceled waiter: %v, want context.Canceled", err)
	}
	rec.release <- nil
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(rec.batches) != 1 {
		t.Errorf("batches %v: the canceled request ran", rec.batches)
	}
}

// TestLeaderCanceled: a group runs to its end for its members even when its leader's client
// went away.
func TestLeaderCanceled(t *testing.T) {
	rec := newRecorder()
	g := New(1, 8, rec.run)
	first := make(chan error, 1)
	go func() { first <- g.Do(context.Background(), 0) }()
	<-rec.entered
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 2)
	go func() { errs <- g.Do(ctx, 1) }()
	wait.Until(t, 10*time.Second, "the leader to queue", func() bool { return g.Waiting() == 1 })
	go func() { errs <- g.Do(context.Background(), 2) }()
	wait.Until(t, 10*time.Second, "the member to queue", func() bool { return g.Waiting() == 2 })
	rec.release <- nil
	if got := <-rec.entered; !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("batch %v, want [1 2]", got)
	}
	cancel()
	rec.release <- nil
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("a member of a group whose leader's context ended: %v", err)
		}
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}
