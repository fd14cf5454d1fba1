package gate

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the admission collectors of SPEC §10.
type metrics struct {
	admitted     *prometheus.CounterVec
	depthRefused *prometheus.CounterVec
	limiterErrs  prometheus.Counter
	gateErrs     prometheus.Counter
}

// newMetrics builds the collectors and registers them on reg (nil: unregistered, still
// counted, which keeps tests that build several Admitters simple).
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		admitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_jobs_admitted_total",
			Help: "Admission attempts by outcome: admitted, shadow_refused (admitted although enforce mode would have refused), replayed (idempotent replay), or the refusal's error_code.",
		}, []string{"outcome"}),
		depthRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_depth_cap_refusals_total",
			Help: "Admissions refused because a queued-depth cap was reached, by scope (tenant or global). Any increase is a defect signal.",
		}, []string{"scope"}),
		limiterErrs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_admission_rate_limiter_errors_total",
			Help: "Admission rate-limit reservations that failed (memcached unreachable); admission failed open.",
		}),
		gateErrs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_admission_gate_lookup_errors_total",
			Help: "Rate-gate lookups for queue=false admissions that failed; admission treated the key as not gated.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.admitted, m.depthRefused, m.limiterErrs, m.gateErrs} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register admission metrics: %w", err)
		}
	}
	return m, nil
}
