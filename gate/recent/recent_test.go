package recent

import (
	"math"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// TestSeriesCountsPerStep: ends and dispatches land in the step of their time; Series returns
// the completed steps before now, empty ones included, and leaves out the step in progress.
func TestSeriesCountsPerStep(t *testing.T) {
	w := New(Config{Step: 10 * time.Second, Steps: 3})
	w.Finished(t0.Add(1 * time.Second))
	w.Finished(t0.Add(9 * time.Second))
	w.Dispatched(20*time.Millisecond, t0.Add(2*time.Second))
	w.Finished(t0.Add(25 * time.Second))
	w.Finished(t0.Add(31 * time.Second)) // the step in progress at now
	s := w.Series(t0.Add(35 * time.Second))
	if s.StepSeconds != 10 || len(s.Points) != 3 {
		t.Fatalf("series %+v, want 3 points of 10 s", s)
	}
	want := []struct {
		at                   time.Time
		finished, dispatched int
	}{{t0, 2, 1}, {t0.Add(10 * time.Second), 0, 0}, {t0.Add(20 * time.Second), 1, 0}}
	for i, p := range s.Points {
		if !p.At.Equal(want[i].at) || p.Finished != want[i].finished || p.Dispatched != want[i].dispatched {
			t.Errorf("point %d: %+v, want %+v", i, p, want[i])
		}
	}
	if s.Points[1].DispatchWaitP50Seconds != nil || s.Points[0].DispatchWaitP50Seconds == nil {
		t.Errorf("a quantile is null exactly when nothing was dispatched: %+v", s.Points)
	}
}

// TestSeriesForgetsOldSteps: a step older than the window is reused for a new one, and a late
// report of a recycled step is dropped rather than counted in the new one.
func TestSeriesForgetsOldSteps(t *testing.T) {
	w := New(Config{Step: time.Second, Steps: 2})
	w.Finished(t0)
	w.Finished(t0.Add(3 * time.Second)) // same bucket as t0 (3 buckets)
	w.Finished(t0)                      // late: dropped
	s := w.Series(t0.Add(4 * time.Second))
	got := []int{s.Points[0].Finished, s.Points[1].Finished}
	if got[0] != 0 || got[1] != 1 {
		t.Errorf("points %v, want [0 1] (t0+2 s empty, t0+3 s one)", got)
	}
	if s := w.Series(t0.Add(10 * time.Second)); s.Points[0].Finished+s.Points[1].Finished != 0 {
		t.Errorf("a stale bucket was served: %+v", s.Points)
	}
}

// TestQuantiles: the median and p99 of known waits fall inside the bucket of the true value,
// which is within 1.5x of it.
func TestQuantiles(t *testing.T) {
	w := New(Config{Step: time.Minute, Steps: 1})
	for range 98 {
		w.Dispatched(10*time.Millisecond, t0)
	}
	w.Dispatched(2*time.Second, t0)
	w.Dispatched(2*time.Second, t0)
	p := w.Series(t0.Add(time.Minute)).Points[0]
	if p.Dispatched != 100 {
		t.Fatalf("dispatched %d, want 100", p.Dispatched)
	}
	within := func(name string, got *float64, want float64) {
		if got == nil || *got > want*1.5 || *got < want/1.5 {
			t.Errorf("%s: %v, want within 1.5x of %v", name, got, want)
		}
	}
	within("p50", p.DispatchWaitP50Seconds, 0.010)
	within("p99", p.DispatchWaitP99Seconds, 2)
	w.Dispatched(time.Hour, t0.Add(time.Minute)) // past the last bound
	if q := w.Series(t0.Add(2 * time.Minute)).Points[0].DispatchWaitP99Seconds; q == nil || math.Abs(*q-waitBounds[len(waitBounds)-1]) > 1e-6 {
		t.Errorf("a wait past the last bound reads as the last bound, got %v", q)
	}
}

// TestNilWindow: a process without the window serves an empty series and counts nothing.
func TestNilWindow(t *testing.T) {
	var w *Window
	w.Finished(t0)
	w.Dispatched(time.Second, t0)
	if s := w.Series(t0); s.Points == nil || len(s.Points) != 0 {
		t.Errorf("nil window: %+v, want no points (an empty list)", s)
	}
}

// TestConcurrentUse runs reports and reads at once (meaningful under -race).
func TestConcurrentUse(t *testing.T) {
	w := New(Config{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				at := t0.Add(time.Duration(g*1000+i) * time.Millisecond)
				w.Finished(at)
				w.Dispatched(time.Millisecond, at)
				_ = w.Series(at)
			}
		}()
	}
	wg.Wait()
	total := 0
	for _, p := range w.Series(t0.Add(time.Minute)).Points {
		total += p.Finished
	}
	if total != 4000 {
		t.Errorf("counted %d ends, want 4000", total)
	}
}
