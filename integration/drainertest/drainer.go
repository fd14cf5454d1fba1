package drainertest

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer"
)

// NewDrainer returns a drainer of cfg, stopped when the test ends with grace for its dispatches
// still open, so that no test leaves one running. The test drives its passes itself (RunOnce) or
// runs its loop with Run.
func NewDrainer(t testing.TB, cfg drainer.Config, grace time.Duration) *drainer.Drainer {
	t.Helper()
	d, err := drainer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		d.Stop(ctx)
	})
	return d
}

// Run runs d's pass loop (Run) in a goroutine of its own until stop is called or the test ends,
// for a test that lets a drainer work as it would in a process; stop waits for Run to return,
// and may be called more than once.
func Run(tb testing.TB, d *drainer.Drainer) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		d.Run(ctx)
	}()
	stop = func() {
		cancel()
		<-ran
	}
	tb.Cleanup(stop)
	return stop
}

// AwaitRecorded waits for a drainer's Recorded callback (ObserverFuncs.OnRecorded sending to
// recorded) n times, at most 10 s each, and returns the jobs it named in order: a test's way to
// know that the outcomes of the dispatches it answered are written, without polling the table.
func AwaitRecorded(t *testing.T, recorded <-chan int64, n int) []int64 {
	t.Helper()
	ids := make([]int64, 0, n)
	for range n {
		select {
		case id := <-recorded:
			ids = append(ids, id)
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d dispatch answers recorded within 10 s", len(ids), n)
		}
	}
	return ids
}
