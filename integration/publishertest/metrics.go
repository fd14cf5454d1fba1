package publishertest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/publisher"
)

// RegistryMetrics is a relay's collectors on a registry of the test's own.
type RegistryMetrics struct {
	Registry *prometheus.Registry
	// Metrics goes in a RelayConfig.
	Metrics *publisher.RelayMetrics
}

// NewRegistryMetrics returns a relay's collectors registered on a new registry.
func NewRegistryMetrics() RegistryMetrics {
	reg := prometheus.NewRegistry()
	return RegistryMetrics{Registry: reg, Metrics: publisher.NewRelayMetrics(reg)}
}

// Counter returns the value of counter name, or of its series with kind=label.
func (r RegistryMetrics) Counter(t testing.TB, name, label string) float64 {
	t.Helper()
	if label == "" {
		return harness.Counter(t, r.Registry, name)
	}
	return harness.Counter(t, r.Registry, name, "kind", label)
}
