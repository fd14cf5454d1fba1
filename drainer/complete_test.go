package drainer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestBatchCompleterAnswersEveryCaller records answers arriving together from many goroutines:
// each is written exactly once, no batch is larger than max, and each caller gets the error of
// the batch that held its answer.
func TestBatchCompleterAnswersEveryCaller(t *testing.T) {
	const callers, max = 40, 6
	var mu sync.Mutex
	written := map[int64]int{}
	failed := map[int64]bool{}
	batches := 0
	b := &batchCompleter{max: max, write: func(_ context.Context, batch []*outcomeReq) error {
		mu.Lock()
		defer mu.Unlock()
		if len(batch) == 0 || len(batch) > max {
			t.Errorf("batch of %d answers; want 1 to %d", len(batch), max)
		}
		batches++
		fail := batches%2 == 0
		for _, r := range batch {
			written[r.c.row.ID]++
			failed[r.c.row.ID] = fail
		}
		if fail {
			return fmt.Errorf("batch %d: %w", batches, errBatch)
		}
		return nil
	}}
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			req := &outcomeReq{}
			req.c.row.ID = int64(i)
			errs[i] = b.record(context.Background(), req)
		})
	}
	wg.Wait()
	for i, err := range errs {
		id := int64(i)
		if written[id] != 1 {
			t.Errorf("answer %d written %d times, want once", id, written[id])
		}
		if got := errors.Is(err, errBatch); got != failed[id] {
			t.Errorf("answer %d: caller got %v, its batch failed: %v", id, err, failed[id])
		}
	}
	if b.busy || len(b.queue) > 0 {
		t.Errorf("after every caller returned: busy %v, %d queued", b.busy, len(b.queue))
	}
}

func TestRefusalDelay(t *testing.T) {
	cases := []struct {
		retryAfter, refusal int
		want                time.Duration
	}{
		{7, 1, 7 * time.Second},
		{0, 1, time.Second},
		{0, 2, 2 * time.Second},
		{0, 4, 8 * time.Second},
		{0, 30, time.Minute},
	}
	for _, c := range cases {
		if got := refusalDelay(c.retryAfter, c.refusal); got != c.want {
			t.Errorf("refusalDelay(%d, %d) = %s, want %s", c.retryAfter, c.refusal, got, c.want)
		}
	}
}

var errBatch = errors.New("the batch's transaction failed")

// TestOutcomeHandoff: while Run schedules passes, a batch waits for a pass, which answers it (and
// says whether it claimed what the batch freed); without Run, or once Run stops before a pass
// takes it, the writer writes the batch itself.
func TestOutcomeHandoff(t *testing.T) {
	var direct [][]*outcomeReq
	woken := make(chan struct{}, 1)
	h := &outcomeHandoff{
		direct: func(_ context.Context, batch []*outcomeReq) error { direct = append(direct, batch); return nil },
		wake:   func() { woken <- struct{}{} },
	}
	batch := func() []*outcomeReq { return []*outcomeReq{{}, {}} }
	if h.take() != nil {
		t.Fatal("a batch to take before any was handed over")
	}
	if err := h.write(context.Background(), batch()); err != nil || len(direct) != 1 {
		t.Fatalf("without Run: %v, %d direct writes; want the writer to write it", err, len(direct))
	}

	h.setRunning(true)
	reqs := batch()
	done := make(chan error, 1)
	go func() { done <- h.write(context.Background(), reqs) }()
	within(t, woken, "the writer to wake a pass")
	b := h.take()
	if b.size() != 2 || h.take() != nil {
		t.Fatalf("the pass took %d outcomes, and then another batch; want the one batch of 2", b.size())
	}
	b.answer(errBatch, true)
	b.answer(nil, false) // only the first answer counts
	if err := within(t, done, "the writer to return"); !errors.Is(err, errBatch) || len(direct) != 1 {
		t.Fatalf("the writer got %v after %d direct writes; want the pass's answer", err, len(direct))
	}
	if !reqs[0].reclaimed || !reqs[1].reclaimed || b.pending() {
		t.Error("the pass's answer did not reach every outcome")
	}

	go func() { done <- h.write(context.Background(), batch()) }()
	within(t, woken, "the writer to wake a pass")
	h.setRunning(false)
	if err := within(t, done, "the writer to return"); err != nil || len(direct) != 2 {
		t.Fatalf("Run stopped before a pass took the batch: %v, %d direct writes; want the writer to write it", err, len(direct))
	}
	var none *outcomeHandoff // OutcomeBatch 1: no handoff at all
	none.setRunning(true)
	if none.take() != nil || (*outcomeBatch)(nil).pending() {
		t.Error("a nil handoff handed something over")
	}
}

// within receives from ch, failing the test if nothing comes within 10 s.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("waited 10 s for %s", what)
		var zero T
		return zero
	}
}
