package integration_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/integration/harness"
)

// TestFrontDoorInTheApp: the process `sluice serve --api` runs exports the admission metrics on
// /metrics (no token) and answers refusals with their metric.
func TestFrontDoorInTheApp(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{API: true})
	env.Admit(t, "acme", map[string]any{"n": 1})
	if r := env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, map[string]any{"tenant": "acme", "queue": false}); r.Status != 429 {
		t.Fatalf("queue=false behind a queued job: %d %s", r.Status, r.Raw)
	}
	r := env.Do(t, http.MethodGet, "/metrics", "", nil)
	for _, want := range []string{
		`sluice_jobs_admitted_total{outcome="admitted"} 1`,
		`sluice_jobs_admitted_total{outcome="capacity_exceeded"} 1`,
	} {
		if !strings.Contains(string(r.Raw), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
