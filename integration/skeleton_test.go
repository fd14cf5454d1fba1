package integration_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/publishertest"
	"github.com/sluicehq/sluice/outbox"
)

// TestWalkingSkeleton admits 100 jobs across 3 tenants through the HTTP API and follows them
// through outbox, relay, NATS, drainer and executor: every job succeeds, starts exactly once,
// the caps held at the executor, and every outbox row reached the stream exactly once.
func TestWalkingSkeleton(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	received := map[int64]time.Time{}
	env := harness.Start(t, harness.Options{OnReceive: func(id int64, _ string, at time.Time) {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := received[id]; !ok {
			received[id] = at
		}
	}})
	ctx := context.Background()

	tenants := []string{"acme", "globex", "initech.*> x"} // the last one is no valid subject token
	admitted := map[int64]time.Time{}
	var wg sync.WaitGroup
	ids := make(chan [2]int64, 100)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < 100; i += 4 {
				id := env.Admit(t, tenants[i%3], map[string]any{"sleep_ms": 20, "n": i})
				ids <- [2]int64{id, time.Now().UnixNano()}
			}
		}(w)
	}
	wg.Wait()
	close(ids)
	for p := range ids {
		admitted[p[0]] = time.Unix(0, p[1])
	}
	if len(admitted) != 100 {
		t.Fatalf("admitted %d distinct jobs, want 100", len(admitted))
	}

	harness.WaitFor(t, 60*time.Second, "all 100 jobs to succeed", func() (bool, error) {
		c, err := env.CountJobs(ctx)
		return c["succeeded"] == 100, err
	})
	c, err := env.CountJobs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(c) != 1 {
		t.Errorf("job states = %v, want only 100 succeeded", c)
	}

	st := env.Exec.Stats()
	if st.TotalStarts != 100 || st.DuplicateStarts != 0 {
		t.Errorf("executor saw %d starts, %d duplicates; want 100 and 0", st.TotalStarts, st.DuplicateStarts)
	}
	for id := range admitted {
		if n := st.Starts[strconv.FormatInt(id, 10)]; n != 1 {
			t.Errorf("job %d started %d times, want 1", id, n)
		}
	}
	if st.MaxInFlight > 4 {
		t.Errorf("executor saw %d jobs in flight at once, global cap is 4", st.MaxInFlight)
	}
	if st.MaxInFlight < 2 {
		t.Errorf("executor never saw more than %d jobs at once: the drainer is not using the caps", st.MaxInFlight)
	}
	for tenant, n := range st.MaxInFlightByTenant {
		if n > 2 {
			t.Errorf("executor saw %d jobs of tenant %q in flight at once, tenant cap is 2", n, tenant)
		}
	}

	// Every outbox row (100 enqueue + 100 release pokes) is published, and the stream holds each
	// one once although the fast path and the relay may both have sent it.
	harness.WaitFor(t, 30*time.Second, "the outbox to be fully published", func() (bool, error) {
		var n int
		err := env.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox WHERE published_at = "+outbox.Unpublished).Scan(&n)
		return n == 0, err
	})
	var rows int
	if err := env.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 200 {
		t.Errorf("outbox has %d rows, want 200 (an enqueue and a release poke per job)", rows)
	}
	if msgs := publishertest.StreamMessages(t, env.NATS.URL()); msgs != uint64(rows) {
		t.Errorf("stream holds %d messages, want one per outbox row (%d)", msgs, rows)
	}

	// Dispatch latency, admission response to executor receipt. Reported, not asserted: speed is
	// the benchmark's business (see `make bench`).
	var lat []time.Duration
	mu.Lock()
	for id, at := range admitted {
		if r, ok := received[id]; ok {
			lat = append(lat, r.Sub(at))
		}
	}
	mu.Unlock()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if len(lat) > 0 {
		t.Logf("admission response to executor receipt over %d jobs: p50 %s (includes queueing behind the caps)", len(lat), fmt.Sprint(lat[len(lat)/2]))
	}
}
