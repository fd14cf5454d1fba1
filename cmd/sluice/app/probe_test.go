package app

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/integration/wait"
)

// TestReadyProbeCaches: callers arriving while a reading is in progress wait for it, and those
// within a second of its start get it too; one check runs per second however many ask, and a
// reading is never older than that.
func TestReadyProbeCaches(t *testing.T) {
	var calls atomic.Int32
	release := make(chan struct{})
	sick := errors.New("sick")
	p := newProbe(func(context.Context) error {
		calls.Add(1)
		<-release
		return sick
	})
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	p.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }

	var callers sync.WaitGroup
	results := make(chan error, 10)
	for range 10 {
		callers.Add(1)
		go func() { // owned by the test: ends once release is closed
			defer callers.Done()
			results <- p.Read(context.Background())
		}()
	}
	wait.Until(t, 5*time.Second, "a reading in progress", func() bool { return calls.Load() == 1 })
	close(release)
	callers.Wait()
	close(results)
	for err := range results {
		if !errors.Is(err, sick) {
			t.Errorf("a caller got %v, want the reading's error", err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d checks for 10 callers at once, want 1", n)
	}
	mu.Lock()
	now = now.Add(probeMaxAge - time.Millisecond)
	mu.Unlock()
	if err := p.Read(context.Background()); !errors.Is(err, sick) || calls.Load() != 1 {
		t.Fatalf("within the second: %v after %d checks, want the kept reading", err, calls.Load())
	}
	mu.Lock()
	now = now.Add(time.Millisecond)
	mu.Unlock()
	_ = p.Read(context.Background())
	if n := calls.Load(); n != 2 {
		t.Fatalf("a second after the reading began: %d checks, want a new one", n)
	}
}
