// Package recent keeps the last minutes of what one process saw jobs do: how many jobs ended and
// were dispatched, and how long dispatched jobs had waited, in fixed steps. GET /v1/status
// serves it so that the console can chart throughput and dispatch wait without a metrics
// server. It is the in-process twin of sluice_jobs_finished_total and
// sluice_dispatch_wait_seconds, fed by the same calls (store.Metrics), so it sees only this
// process's work. It sits apart because both the job store (which feeds it) and the status
// reader (which serves it) need it, and neither may import the other.
package recent

import (
	"math"
	"sync"
	"time"
)

// Defaults of Config.
const (
	DefaultStep  = 5 * time.Second
	DefaultSteps = 72 // six minutes
)

// waitBounds are the upper bounds, in seconds, of the dispatch-wait buckets: from 0.5 ms,
// each 1.5 times the one before, up to about 20 minutes; a quantile is read to within that
// ratio, which is what a chart needs.
var waitBounds = func() []float64 {
	var b []float64
	for v := 0.0005; v < 1500; v *= 1.5 {
		b = append(b, v)
	}
	return b
}()

// Config configures a Window. Zero values take the defaults.
type Config struct {
	// Step is the width of one point of the series. Default DefaultStep.
	Step time.Duration
	// Steps is how many completed steps Series returns. Default DefaultSteps.
	Steps int
}

// Window counts job ends and dispatches per step. Times are the ones the caller's transition
// was written at (the database's clock), and Series is read at that clock too, so the steps of
// every caller line up. Safe for concurrent use; a nil *Window counts nothing.
type Window struct {
	step    time.Duration
	mu      sync.Mutex
	buckets []bucket // ring: step index modulo len
}

type bucket struct {
	index      int64 // the step this bucket holds: unix nanoseconds / step
	finished   int
	dispatched int
	waits      []uint32 // per waitBounds entry, plus one past the last
}

// New returns a Window.
func New(cfg Config) *Window {
	if cfg.Step <= 0 {
		cfg.Step = DefaultStep
	}
	if cfg.Steps <= 0 {
		cfg.Steps = DefaultSteps
	}
	// One bucket more than Series returns: the step in progress.
	w := &Window{step: cfg.Step, buckets: make([]bucket, cfg.Steps+1)}
	for i := range w.buckets {
		w.buckets[i].index = -1
		w.buckets[i].waits = make([]uint32, len(waitBounds)+1)
	}
	return w
}

// at returns the bucket of t's step, emptied if it held an older step; nil for a time older
// than the window. Called with mu held.
func (w *Window) at(t time.Time) *bucket {
	idx := t.UnixNano() / int64(w.step)
	b := &w.buckets[idx%int64(len(w.buckets))]
	switch {
	case b.index == idx:
		return b
	case b.index > idx:
		return nil // a late report of a step already recycled
	}
	b.index, b.finished, b.dispatched = idx, 0, 0
	clear(b.waits)
	return b
}

// Finished counts one job that reached a terminal state at t.
func (w *Window) Finished(t time.Time) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if b := w.at(t); b != nil {
		b.finished++
	}
}

// Dispatched counts one job dispatched at t after waiting wait since its admission.
func (w *Window) Dispatched(wait time.Duration, t time.Time) {
	if w == nil {
		return
	}
	s := wait.Seconds()
	i := 0
	for i < len(waitBounds) && s > waitBounds[i] {
		i++
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if b := w.at(t); b != nil {
		b.dispatched++
		b.waits[i]++
	}
}

// Series is the window as GET /v1/status serves it (field "recent").
type Series struct {
	// StepSeconds is the width of each point.
	StepSeconds float64 `json:"step_seconds"`
	// Points are the completed steps before now, oldest first, one per step, empty steps
	// included.
	Points []Point `json:"points"`
}

// Point is one step of a Series.
type Point struct {
	// At is the start of the step.
	At time.Time `json:"at"`
	// Finished counts jobs that reached a terminal state in the step (every terminal state, as
	// sluice_jobs_finished_total does).
	Finished int `json:"finished"`
	// Dispatched counts jobs dispatched in the step.
	Dispatched int `json:"dispatched"`
	// DispatchWaitP50Seconds and DispatchWaitP99Seconds are the median and 99th percentile of
	// the dispatched jobs' waits from admission, estimated from buckets 1.5 times apart; null
	// when nothing was dispatched in the step.
	DispatchWaitP50Seconds *float64 `json:"dispatch_wait_p50_seconds"`
	DispatchWaitP99Seconds *float64 `json:"dispatch_wait_p99_seconds"`
}

// Series returns the completed steps before now's, oldest first. A nil *Window returns an
// empty series.
func (w *Window) Series(now time.Time) Series {
	if w == nil {
		return Series{StepSeconds: DefaultStep.Seconds(), Points: []Point{}}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	cur := now.UnixNano() / int64(w.step)
	n := int64(len(w.buckets) - 1)
	s := Series{StepSeconds: w.step.Seconds(), Points: make([]Point, 0, n)}
	for idx := cur - n; idx < cur; idx++ {
		p := Point{At: time.Unix(0, idx*int64(w.step)).UTC()}
		if b := &w.buckets[idx%int64(len(w.buckets))]; idx >= 0 && b.index == idx {
			p.Finished, p.Dispatched = b.finished, b.dispatched
			p.DispatchWaitP50Seconds = quantile(b.waits, b.dispatched, 0.5)
			p.DispatchWaitP99Seconds = quantile(b.waits, b.dispatched, 0.99)
		}
		s.Points = append(s.Points, p)
	}
	return s
}

// quantile estimates the q-quantile of total observations counted in waits, interpolating
// linearly inside the bucket the rank falls in (as Prometheus's histogram_quantile does); nil
// for no observations.
func quantile(waits []uint32, total int, q float64) *float64 {
	if total == 0 {
		return nil
	}
	rank := q * float64(total)
	seen := 0.0
	for i, c := range waits {
		if c == 0 {
			continue
		}
		if seen+float64(c) >= rank {
			lo := 0.0
			if i > 0 {
				lo = waitBounds[i-1]
			}
			hi := lo // past the last bound: report the last bound
			if i < len(waitBounds) {
				hi = waitBounds[i]
			}
			v := lo + (hi-lo)*(rank-seen)/float64(c)
			v = math.Round(v*1e6) / 1e6
			return &v
		}
		seen += float64(c)
	}
	v := waitBounds[len(waitBounds)-1]
	return &v
}
