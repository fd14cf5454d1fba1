package waiters

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// fakeStates is the jobs' states as the backstop reads them, and the reads it was asked for.
type fakeStates struct {
	states map[int64]State
	reads  [][]int64
	err    error
}

func (f *fakeStates) read(_ context.Context, ids []int64) (map[int64]State, error) {
	f.reads = append(f.reads, slices.Clone(ids))
	if f.err != nil {
		return nil, f.err
	}
	out := map[int64]State{}
	for _, id := range ids {
		if s, ok := f.states[id]; ok {
			out[id] = s
		}
	}
	return out, nil
}

func newHub(t *testing.T, f *fakeStates, cfg Config) *Hub {
	t.Helper()
	cfg.Read = f.read
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// woken reports whether w has a wake pending, and takes it.
func woken(w *Waiter) bool {
	select {
	case <-w.C():
		return true
	default:
		return false
	}
}

func TestNewRequiresRead(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Fatal("New without Read: no error")
	}
}

func TestWakeWakesTheJobsWaitersOnly(t *testing.T) {
	h := newHub(t, &fakeStates{}, Config{})
	a1, _ := h.Add("p", 1)
	a2, _ := h.Add("q", 1)
	b, _ := h.Add("p", 2)
	h.Wake(1)
	h.Wake(1) // a second wake before the first is taken is the same wake, not counted
	if !woken(a1) || !woken(a2) {
		t.Fatal("a waiter of job 1 was not woken")
	}
	if woken(a1) || woken(b) {
		t.Fatal("a waiter was woken twice, or a waiter of job 2 was woken")
	}
	if poke, backstop := h.Wakes(); poke != 2 || backstop != 0 {
		t.Fatalf("Wakes() = %d, %d; want 2, 0", poke, backstop)
	}
	h.Wake(3, 2) // several jobs at once
	if !woken(b) {
		t.Fatal("a waiter of job 2 was not woken by a wake of jobs 3 and 2")
	}
}

func TestBounds(t *testing.T) {
	h := newHub(t, &fakeStates{}, Config{Max: 3, MaxPerCaller: 2})
	p1, err := h.Add("p", 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Add("p", 2); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Add("p", 3); !errors.Is(err, ErrBusy) {
		t.Fatalf("a caller's third waiter past MaxPerCaller 2: %v, want ErrBusy", err)
	}
	if _, err := h.Add("q", 3); err != nil {
		t.Fatalf("another caller under both bounds: %v", err)
	}
	if _, err := h.Add("r", 4); !errors.Is(err, ErrBusy) {
		t.Fatalf("a fourth waiter past Max 3: %v, want ErrBusy", err)
	}
	p1.Close()
	p1.Close() // again: nothing more is given back
	if h.Len() != 2 {
		t.Fatalf("Len() = %d after a Close; want 2", h.Len())
	}
	if _, err := h.Add("p", 3); err != nil {
		t.Fatalf("after a Close the caller may wait again: %v", err)
	}
	if _, err := h.Add("r", 4); !errors.Is(err, ErrBusy) {
		t.Fatalf("the bound counts once per Close: %v, want ErrBusy", err)
	}
}

// TestTickWakesOnChange: the backstop wakes a waiter whose job's state differs from what it saw,
// or whose job is gone, and no other: not one that saw the current state, not one that has not
// read yet (it is about to).
func TestTickWakesOnChange(t *testing.T) {
	f := &fakeStates{states: map[int64]State{
		1: {Status: "running", Version: 2},
		2: {Status: "succeeded", Version: 3},
		3: {Status: "queued", Version: 0},
	}}
	h := newHub(t, f, Config{})
	same, _ := h.Add("p", 1)
	same.Saw(State{Status: "running", Version: 2})
	started, _ := h.Add("p", 1)
	started.Saw(State{Status: "dispatched", Version: 2}) // a start keeps the version
	ended, _ := h.Add("p", 2)
	ended.Saw(State{Status: "running", Version: 2})
	unread, _ := h.Add("p", 3)
	gone, _ := h.Add("p", 4)
	gone.Saw(State{Status: "succeeded", Version: 3})
	if err := h.Tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	if woken(same) || woken(unread) {
		t.Fatal("the backstop woke a waiter whose job had not changed, or one that had not read")
	}
	if !woken(started) || !woken(ended) || !woken(gone) {
		t.Fatal("the backstop left a waiter asleep whose job changed or is gone")
	}
	if len(f.reads) != 1 || !slices.Equal(f.reads[0], []int64{1, 2, 3, 4}) {
		t.Fatalf("backstop reads %v; want one read of each waited job once", f.reads)
	}
	if _, backstop := h.Wakes(); backstop != 3 {
		t.Fatalf("backstop wakes %d; want 3", backstop)
	}
}

func TestTickReadsInChunksAndNothingWithoutWaiters(t *testing.T) {
	f := &fakeStates{}
	h := newHub(t, f, Config{MaxPerCaller: readChunk + 1})
	if err := h.Tick(context.Background()); err != nil || len(f.reads) != 0 {
		t.Fatalf("a tick without waiters read %v (%v); want no read", f.reads, err)
	}
	for id := range int64(readChunk + 1) {
		if _, err := h.Add("p", id+1); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.Tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(f.reads) != 2 || len(f.reads[0]) != readChunk || len(f.reads[1]) != 1 {
		t.Fatalf("%d waited jobs read in %d reads; want %d and 1", readChunk+1, len(f.reads), readChunk)
	}
}

func TestTickError(t *testing.T) {
	f := &fakeStates{err: errors.New("connection refused")}
	h := newHub(t, f, Config{})
	w, _ := h.Add("p", 1)
	w.Saw(State{Status: "queued"})
	if err := h.Tick(context.Background()); err == nil || !errors.Is(err, f.err) {
		t.Fatalf("Tick with a failing read: %v; want it wrapped", err)
	}
	if woken(w) {
		t.Fatal("a failed read woke a waiter")
	}
}

func TestRunTicksUntilCanceled(t *testing.T) {
	f := &fakeStates{states: map[int64]State{1: {Status: "succeeded", Version: 1}}}
	h := newHub(t, f, Config{Interval: 1})
	w, _ := h.Add("p", 1)
	w.Saw(State{Status: "queued"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	select {
	case <-w.C():
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not wake the waiter of a changed job within 10 s")
	}
	cancel()
	<-done
}

func TestStop(t *testing.T) {
	h := newHub(t, &fakeStates{}, Config{})
	select {
	case <-h.Stopping():
		t.Fatal("Stopping closed before Stop")
	default:
	}
	h.Stop()
	h.Stop()
	<-h.Stopping()
}

// TestListenWhileWaited: the hub listens from its first waiter on, once, and stops once it has
// had none for IdleAfter; a listener that fails leaves the waiters to the backstop.
func TestListenWhileWaited(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	listens, stops := 0, 0
	var fail error
	h := newHub(t, &fakeStates{}, Config{IdleAfter: time.Minute, Now: func() time.Time { return now },
		Listen: func() (func(), error) {
			if fail != nil {
				return nil, fail
			}
			listens++
			return func() { stops++ }, nil
		}})
	tick := func() {
		t.Helper()
		if err := h.Tick(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := h.Add("p", 1)
	b, _ := h.Add("p", 2)
	if listens != 1 {
		t.Fatalf("listened %d times for two waiters; want once", listens)
	}
	a.Close()
	b.Close()
	now = now.Add(59 * time.Second)
	tick()
	if stops != 0 {
		t.Fatal("stopped listening before IdleAfter without a waiter")
	}
	now = now.Add(time.Second)
	tick()
	if stops != 1 {
		t.Fatalf("stops %d after IdleAfter without a waiter; want 1", stops)
	}
	tick()
	if stops != 1 {
		t.Fatal("stopped twice")
	}
	fail = errors.New("broker down")
	c, err := h.Add("p", 3)
	if err != nil {
		t.Fatalf("a waiter while the listener fails: %v; want it registered", err)
	}
	fail = nil
	c.Close()
	d, _ := h.Add("p", 4)
	if listens != 1 {
		t.Fatalf("listens %d: a failed try was retried within the backstop period", listens)
	}
	d.Close()
	now = now.Add(DefaultInterval)
	e, _ := h.Add("p", 5)
	defer e.Close()
	if listens != 2 {
		t.Fatalf("listens %d a backstop period after a failed try; want the next waiter to listen again", listens)
	}
}
