package drainer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
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

var errBatch = errors.New("the batch's transaction failed")
