package store

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/recent"
)

// Metrics are the job-lifecycle collectors of SPEC §10 that several roles update: jobs end in
// the drainer (dispatch outcomes, lease recovery, expiry) and in the API (/complete, cancel,
// admissions refused into rejected rows), and a process running both must register each name
// once. So one Metrics is made per process and handed to every Store that writes transitions.
//
// The Store's methods never count: they write inside their caller's transaction, which may yet
// roll back, and a job counted then would be counted again when it really ends. Their callers
// count, once the transaction has committed. Safe for concurrent use; a nil *Metrics counts
// nothing.
type Metrics struct {
	// finished holds the counter of each terminal state, looked up without hashing label values
	// on the drainer's outcome path.
	finished     map[job.Status]prometheus.Counter
	dispatchWait prometheus.Histogram
	execution    prometheus.Histogram
	// recent keeps the last minutes of the same counts for GET /v1/status (the console's
	// charts).
	recent *recent.Window
}

// NewMetrics creates the collectors and registers them on reg. Every terminal state's series is
// created at zero, so that a fresh process exports them before the first job ends (a rate or an
// absent() over them then means something). It fails if reg already holds one of the names.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_jobs_finished_total",
		Help: "Jobs that reached a terminal state (succeeded, failed, canceled, rejected, lost, expired, replaced), " +
			"counted by the process that wrote the transition, once it committed."}, []string{"state"})
	// The buckets resolve 1 ms to 5 min.
	buckets := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	terminal := job.TerminalStates()
	m := &Metrics{
		finished: make(map[job.Status]prometheus.Counter, len(terminal)),
		dispatchWait: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_dispatch_wait_seconds",
			Help: "Time from admission to dispatch, observed once per dispatch.", Buckets: buckets}),
		execution: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_execution_seconds",
			Help: "Time from dispatch to the terminal state, for jobs that were dispatched.", Buckets: buckets}),
		recent: recent.New(recent.Config{}),
	}
	for _, s := range terminal {
		m.finished[s] = vec.WithLabelValues(string(s))
	}
	for _, c := range []prometheus.Collector{vec, m.dispatchWait, m.execution} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register job metrics: %w", err)
		}
	}
	return m, nil
}

// Finished counts one job's committed move into state to at now. A job that was dispatched
// (dispatchedAt not nil) also has its execution time observed. A state that is not terminal
// (a requeue) is not an end and counts nothing, so callers may hand over whatever FinishMany
// returned.
func (m *Metrics) Finished(to job.Status, dispatchedAt *time.Time, now time.Time) {
	if m == nil {
		return
	}
	c, ok := m.finished[to]
	if !ok {
		return
	}
	c.Inc()
	m.recent.Finished(now)
	if dispatchedAt != nil {
		m.execution.Observe(now.Sub(*dispatchedAt).Seconds())
	}
}

// Dispatched observes one committed dispatch's wait: from its admission (queuedAt, kept across
// requeues) to dispatchedAt.
func (m *Metrics) Dispatched(queuedAt, dispatchedAt time.Time) {
	if m == nil {
		return
	}
	wait := dispatchedAt.Sub(queuedAt)
	m.dispatchWait.Observe(wait.Seconds())
	m.recent.Dispatched(wait, dispatchedAt)
}

// Recent returns the last minutes of the job ends and dispatches counted here, per step; nil
// for a nil *Metrics (whose Series is empty).
func (m *Metrics) Recent() *recent.Window {
	if m == nil {
		return nil
	}
	return m.recent
}
