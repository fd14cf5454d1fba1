package drainer

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the drainer's own Prometheus collectors (SPEC §10). The job-lifecycle ones
// (sluice_jobs_finished_total, sluice_dispatch_wait_seconds, sluice_execution_seconds) are
// store.Metrics, which the API updates too: see Config.JobMetrics.
type Metrics struct {
	LastPoll        prometheus.Gauge
	Passes          prometheus.Counter
	Claimed         prometheus.Counter
	Recovered       prometheus.Counter
	Pokes           prometheus.Counter
	GateUnavailable prometheus.Counter
	// SlotsLost counts slots whose lease ran out without a release, as the upkeep swept them.
	SlotsLost prometheus.Counter
}

// NewMetrics creates the drainer's collectors and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
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
		SlotsLost: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_slots_lost_total",
			Help: "Slots whose lease ran out without a release (deleted by a drainer's upkeep)."}),
	}
	reg.MustRegister(m.LastPoll, m.Passes, m.Claimed, m.Recovered, m.Pokes, m.GateUnavailable, m.SlotsLost)
	return m
}

func (m *Metrics) observePass(p Pass) {
	m.LastPoll.SetToCurrentTime()
	m.Passes.Inc()
	m.Claimed.Add(float64(p.Claimed))
	m.Recovered.Add(float64(p.Recovered))
}
