package integration_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/gate/status"
	"github.com/sluicehq/sluice/integration/harness"
)

// TestOpsStatus follows one drainer through idle, active and gated as a running sluice sees it
// (SPEC §13 scenario 8), and checks the SPEC §6 shape of GET /v1/status.
func TestOpsStatus(t *testing.T) {
	t.Parallel()
	env := startOps(t, opsOptions{Memcached: []string{"127.0.0.1:11211"}})
	ctx := context.Background()
	cl := client.New(env.URL, harness.AdminToken)
	drainerState := func() (status.Status, string, error) {
		st, err := cl.Status(ctx)
		if err != nil || len(st.Drainers) != 1 {
			return st, "", err
		}
		return st, st.Drainers[0].State, nil
	}

	// The raw shape: every SPEC §6 field is present under its name.
	r := env.Do(t, http.MethodGet, "/v1/status", harness.AdminToken, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET /v1/status: HTTP %d %s", r.Status, r.Raw)
	}
	for _, path := range []string{"queue.depth", "queue.oldest_age_seconds", "in_flight", "tenants", "gates", "drainers",
		"outbox.unpublished", "outbox.oldest_unpublished_age_seconds", "broker.connected", "memcached.reachable",
		"config.version", "config.stale", "slots.total", "slots.by_tier", "slots.by_lane"} {
		var v any = r.Body
		for _, p := range strings.Split(path, ".") {
			m, _ := v.(map[string]any)
			v = m[p]
		}
		if v == nil {
			t.Errorf("GET /v1/status lacks %s: %s", path, r.Raw)
		}
	}
	if r := env.Do(t, http.MethodGet, "/v1/status", harness.ProducerToken, nil); r.Status != http.StatusForbidden {
		t.Errorf("GET /v1/status as producer: HTTP %d, want 403", r.Status)
	}

	harness.WaitFor(t, 10*time.Second, "the drainer to report idle", func() (bool, error) {
		st, s, err := drainerState()
		if err != nil {
			return false, err
		}
		return s == status.Idle && st.Broker.Connected && st.Memcached.Reachable, nil
	})

	// Active: three 3 s jobs of one tenant (cap 2): two in flight, one queued.
	for i := 0; i < 3; i++ {
		env.Admit(t, "acme", map[string]any{"sleep_ms": 3000})
	}
	harness.WaitFor(t, 10*time.Second, "the drainer to be active with 2 in flight", func() (bool, error) {
		st, s, err := drainerState()
		if err != nil {
			return false, err
		}
		return s == status.Active && st.InFlight == 2 && st.Queue.Depth == 1 && len(st.Tenants) == 1 &&
			st.Tenants[0] == status.Tenant{Tenant: "acme", Depth: 1, OldestAgeSeconds: st.Tenants[0].OldestAgeSeconds, InFlight: 2, Cap: 2, Tier: "default", Weight: 1}, nil
	})

	// Gated: a job whose executor answers 429 Retry-After 120 is requeued, not before two
	// minutes; once acme's jobs are done, all queued work is held back.
	env.Admit(t, "globex", map[string]any{"retry_after": 120})
	harness.WaitFor(t, 20*time.Second, "the drainer to report gated", func() (bool, error) {
		st, s, err := drainerState()
		if err != nil {
			return false, err
		}
		return s == status.Gated && st.Queue.Depth == 1 && st.InFlight == 0, nil
	})
	if c, err := env.CountJobs(ctx); err != nil || c["succeeded"] != 3 || c["queued"] != 1 {
		t.Errorf("jobs %v (%v), want 3 succeeded and the rate-limited one queued", c, err)
	}
}

// TestOpsMetrics checks the SPEC §10 metrics on /metrics after real traffic, and that per-tenant
// series are bounded to the 20 deepest tenants plus "other".
func TestOpsMetrics(t *testing.T) {
	t.Parallel()
	env := startOps(t, opsOptions{})
	ctx := context.Background()

	// Some jobs run to completion (histograms, finished, pokes, relay).
	for i := 0; i < 5; i++ {
		env.Admit(t, "runner", map[string]any{"sleep_ms": 5})
	}
	harness.WaitFor(t, 20*time.Second, "5 jobs to succeed and be counted", func() (bool, error) {
		c, err := env.CountJobs(ctx)
		if err != nil || c["succeeded"] != 5 {
			return false, err
		}
		// Outcomes are counted just after their commit.
		v, _ := metricValue(scrape(t, env.URL), "sluice_execution_seconds_count")
		return v == 5, nil
	})
	// Then pause dispatch and queue tenant tNN with NN+1 jobs, 25 tenants: 325 queued.
	if r := env.Do(t, http.MethodPatch, "/v1/config", harness.AdminToken, map[string]any{
		"changes": map[string]any{"global_in_flight": 0, "tenant_queue_depth": 25}}); r.Status != http.StatusOK {
		t.Fatalf("PATCH: HTTP %d %s", r.Status, r.Raw)
	}
	total := 0
	for n := 0; n < 25; n++ {
		for i := 0; i <= n; i++ {
			env.Admit(t, fmt.Sprintf("t%02d", n), nil)
			total++
		}
	}
	// t24 holds 25 = its depth cap: one more is refused and counted.
	if r := env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, map[string]any{"tenant": "t24"}); r.Status != http.StatusTooManyRequests {
		t.Fatalf("admission over the depth cap: HTTP %d %s, want 429", r.Status, r.Raw)
	}
	// The status gauges come from a read that serves scrapes for up to 2 s (opsmetrics
	// CacheFor): wait for one taken after the admissions, as well as for the relay.
	harness.WaitFor(t, 10*time.Second, "the relay to publish everything and the status gauges to show the admissions", func() (bool, error) {
		m := scrape(t, env.URL)
		v, ok := metricValue(m, "sluice_outbox_unpublished")
		d, dok := metricValue(m, "sluice_queue_depth")
		return ok && v == 0 && dok && d == float64(total), nil
	})
	m := scrape(t, env.URL)
	want := map[string]float64{
		"sluice_queue_depth": float64(total),
		"sluice_in_flight":   0,
		"sluice_gated_keys":  0,
		`sluice_jobs_admitted_total{outcome="admitted"}`:   float64(5 + total),
		`sluice_jobs_admitted_total{outcome="queue_full"}`: 1,
		`sluice_depth_cap_refusals_total{scope="tenant"}`:  1,
		`sluice_depth_cap_refusals_total{scope="global"}`:  0,
		`sluice_jobs_finished_total{state="succeeded"}`:    5,
		`sluice_tenant_queue_depth{tenant="t24"}`:          25,
		`sluice_tenant_queue_depth{tenant="t05"}`:          6,
		`sluice_tenant_queue_depth{tenant="other"}`:        1 + 2 + 3 + 4 + 5 + 0, // t00..t04 and the finished runner
		`sluice_tenant_in_flight{tenant="other"}`:          0,
		"sluice_dispatch_wait_seconds_count":               5,
		"sluice_execution_seconds_count":                   5,
		"sluice_outbox_oldest_unpublished_age_seconds":     0,
		"sluice_broker_connected":                          1,
		"sluice_config_version":                            1,
		"sluice_config_stale":                              0,
		"sluice_status_read_success":                       1,
		`sluice_drainers{state="stalled"}`:                 0,
	}
	for series, v := range want {
		got, ok := metricValue(m, series)
		if !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, v)
		}
	}
	for _, series := range []string{`sluice_tenant_queue_depth{tenant="t04"}`, `sluice_tenant_queue_depth{tenant="runner"}`} {
		if _, ok := metricValue(m, series); ok {
			t.Errorf("%s is exposed: only the 20 deepest tenants get their own series", series)
		}
	}
	if n := strings.Count(m, "\nsluice_tenant_queue_depth{"); n != 21 {
		t.Errorf("%d sluice_tenant_queue_depth series, want 21 (20 tenants + other)", n)
	}
	for _, series := range []string{"sluice_pokes_received_total", "sluice_relay_published_total", "sluice_drainer_last_poll_timestamp_seconds",
		"sluice_queue_oldest_age_seconds", "go_goroutines", "process_resident_memory_bytes"} {
		if v, ok := metricValue(m, series); !ok || v <= 0 {
			t.Errorf("%s = %v (present %v), want > 0", series, v, ok)
		}
	}
	// Histograms resolve 1 ms to 5 min.
	for _, le := range []string{"0.001", "300"} {
		if _, ok := metricValue(m, `sluice_execution_seconds_bucket{le="`+le+`"}`); !ok {
			t.Errorf("sluice_execution_seconds has no %s s bucket", le)
		}
	}
	// Types and units as Prometheus reads them.
	for _, typ := range []string{"# TYPE sluice_queue_depth gauge", "# TYPE sluice_jobs_admitted_total counter",
		"# TYPE sluice_dispatch_wait_seconds histogram", "# TYPE sluice_execution_seconds histogram",
		"# TYPE sluice_relay_published_total counter", "# TYPE sluice_drainer_last_poll_timestamp_seconds gauge"} {
		if !strings.Contains(m, typ) {
			t.Errorf("/metrics lacks %q", typ)
		}
	}
}
