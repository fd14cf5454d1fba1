package gate

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// FailOpenMetrics count the limiter-side failures admission survives by failing open (SPEC §5:
// counted, logged sparingly, never blocking an admission).
type FailOpenMetrics struct {
	// RateLimiterErrors counts admission rate-limit reservations that failed (memcached
	// unreachable); those admissions went ahead without the limit.
	RateLimiterErrors prometheus.Counter
	// GateLookupErrors counts rate-gate lookups of queue=false admissions that failed; those
	// keys were treated as not gated.
	GateLookupErrors prometheus.Counter
}

// NewFailOpenMetrics creates the collectors and registers them on reg.
func NewFailOpenMetrics(reg prometheus.Registerer) (*FailOpenMetrics, error) {
	m := &FailOpenMetrics{
		RateLimiterErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_admission_rate_limiter_errors_total",
			Help: "Admission rate-limit reservations that failed (memcached unreachable); admission failed open.",
		}),
		GateLookupErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_admission_gate_lookup_errors_total",
			Help: "Rate-gate lookups for queue=false admissions that failed; admission treated the keys as not gated.",
		}),
	}
	for _, c := range []prometheus.Collector{m.RateLimiterErrors, m.GateLookupErrors} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register admission fail-open metrics: %w", err)
		}
	}
	return m, nil
}

func (m *FailOpenMetrics) limiterFailed() {
	if m != nil {
		m.RateLimiterErrors.Inc()
	}
}

func (m *FailOpenMetrics) gateLookupFailed() {
	if m != nil {
		m.GateLookupErrors.Inc()
	}
}
