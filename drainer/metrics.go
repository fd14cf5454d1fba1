package drainer

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/drainer/store"
	"github.com/sluicehq/sluice/gate/job"
)

// Metrics are the drainer's Prometheus collectors (SPEC §10).
type Metrics struct {
	Finished        *prometheus.CounterVec
	DispatchWait    prometheus.Histogram
	Execution       prometheus.Histogram
	LastPoll        prometheus.Gauge
	Passes          prometheus.Counter
	Claimed         prometheus.Counter
	Recovered       prometheus.Counter
	Pokes           prometheus.Counter
	GateUnavailable prometheus.Counter
}

// Buckets resolve 1 ms to 5 min.
var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// NewMetrics creates the drainer's collectors and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Finished: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_jobs_finished_total",
			Help: "Jobs that reached a terminal state or were requeued by the drainer, by state."}, []string{"state"}),
		DispatchWait: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_dispatch_wait_seconds",
			Help: "Time from admission to dispatch.", Buckets: latencyBuckets}),
		Execution: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_execution_seconds",
			Help: "Time from dispatch to outcome.", Buckets: latencyBuckets}),
		LastPoll: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_drainer_last_poll_timestamp_seconds",
			Help: "Unix time of the drainer's last completed pass."}),
		Passes: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_drainer_passes_total",
			Help: "Drain passes run (pokes coalesce into passes)."}),
		Claimed: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_jobs_claimed_total",
			Help: "Jobs claimed and dispatched."}),
		Recovered: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_jobs_recovered_total",
			Help: "In-flight jobs recovered after their lease expired."}),
		Pokes: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_pokes_received_total",
			Help: "Pokes received from NATS."}),
		GateUnavailable: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_gate_unavailable_total",
			Help: "Gate store lookups that failed open."}),
	}
	reg.MustRegister(m.Finished, m.DispatchWait, m.Execution, m.LastPoll, m.Passes, m.Claimed, m.Recovered, m.Pokes, m.GateUnavailable)
	return m
}

func (m *Metrics) observePass(p Pass) {
	m.LastPoll.SetToCurrentTime()
	m.Passes.Inc()
	m.Claimed.Add(float64(p.Claimed))
	m.Recovered.Add(float64(p.Recovered))
}

func (m *Metrics) observeOutcome(r store.Row, to job.Status, now time.Time) {
	m.Finished.WithLabelValues(string(to)).Inc()
	if r.DispatchedAt != nil {
		m.DispatchWait.Observe(r.DispatchedAt.Sub(r.QueuedAt).Seconds())
		m.Execution.Observe(now.Sub(*r.DispatchedAt).Seconds())
	}
}
