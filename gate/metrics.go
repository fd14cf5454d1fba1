package gate

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/gate/job"
)

// Metrics are admission's Prometheus collectors (SPEC §10).
type Metrics struct {
	// Admitted counts admission answers by outcome: admitted, replayed, shadow_refused, or the
	// error_code of a refusal or failure (queue_full, capacity_exceeded, unavailable...).
	Admitted *prometheus.CounterVec
	// DepthCapRefusals counts queue_full refusals by scope (tenant, global): either cap firing
	// is a defect signal for the operator (SPEC §5).
	DepthCapRefusals *prometheus.CounterVec
	// SlotDecisions counts slot requests by decision (admitted, shadow-refused, refused, or off
	// with the rollout mode off) and scope (the refusing, else the fullest limit; "" when off).
	SlotDecisions *prometheus.CounterVec
}

// NewMetrics creates admission's collectors and registers them on reg. The label values an
// alert rule names are created at zero, so the series exist before the first event.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Admitted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_jobs_admitted_total",
			Help: "Admission answers, by outcome (admitted, replayed, shadow_refused or the error code)."}, []string{"outcome"}),
		DepthCapRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_depth_cap_refusals_total",
			Help: "Admissions refused with queue_full because a depth cap fired, by scope (tenant, global)."}, []string{"scope"}),
	}
	for _, o := range []string{"admitted", "replayed", string(job.CodeQueueFull), string(job.CodeUnavailable)} {
		m.Admitted.WithLabelValues(o)
	}
	m.DepthCapRefusals.WithLabelValues("tenant")
	m.DepthCapRefusals.WithLabelValues("global")
	m.SlotDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_slot_decisions_total",
		Help: "Slot requests, by decision (admitted, shadow-refused, refused, off) and scope."}, []string{"decision", "scope"})
	reg.MustRegister(m.Admitted, m.DepthCapRefusals, m.SlotDecisions)
	return m
}

// observe counts one admission's answer.
func (m *Metrics) observe(res Result, err error) {
	if m == nil {
		return
	}
	if err != nil {
		code := job.ErrorCode(err)
		m.Admitted.WithLabelValues(string(code)).Inc()
		var je *job.Error
		if code == job.CodeQueueFull && errors.As(err, &je) {
			if scope, ok := je.Detail["scope"].(string); ok {
				m.DepthCapRefusals.WithLabelValues(scope).Inc()
			}
		}
		return
	}
	switch {
	case res.Replayed:
		m.Admitted.WithLabelValues("replayed").Inc()
	case res.Decision == ShadowRefused:
		m.Admitted.WithLabelValues("shadow_refused").Inc()
	default:
		m.Admitted.WithLabelValues("admitted").Inc()
	}
}
