package integration_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/memcachedtest"
)

// TestWaitingOn: GET /v1/jobs/{id} of a queued job says what holds it and when it should start,
// from the real database, gate store and configuration: nothing (next), its tenant's cap with an
// estimate from the tenant's recent service time, its rate key's gate, its not-before, a paused
// cap; a job that is not queued says nothing of the kind. The API runs alone, so nothing is
// claimed while the test looks.
func TestWaitingOn(t *testing.T) {
	t.Parallel()
	addr := memcachedtest.Shared(t)
	env := harness.Start(t, harness.Options{API: true, Memcached: []string{addr}, GateTimeout: time.Second})
	ctx := context.Background()
	// Through the API, whose process applies its own change at once (SetConfig would leave the
	// API on its cached configuration for up to config.ReloadEvery).
	patchConfig(t, env, map[string]any{
		"global_in_flight": 4, "tenant_in_flight": 2, "tenant_in_flight_overrides": map[string]int{"paused-tenant": 0}})
	get := func(id int64) map[string]any {
		t.Helper()
		r := env.Do(t, http.MethodGet, "/v1/jobs/"+strconv.FormatInt(id, 10), harness.ProducerToken, nil)
		if r.Status != http.StatusOK {
			t.Fatalf("GET job %d: HTTP %d: %s", id, r.Status, r.Raw)
		}
		return r.Body
	}
	instant := func(body map[string]any, field string) time.Time {
		t.Helper()
		s, ok := body[field].(string)
		if !ok {
			t.Fatalf("job %v: no %s in %v", body["id"], field, body)
		}
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	within := func(what string, got, want time.Time, tol time.Duration) {
		t.Helper()
		if d := got.Sub(want); d < -tol || d > tol {
			t.Errorf("%s: %s, want %s ± %s", what, got.Format(time.RFC3339Nano), want.Format(time.RFC3339Nano), tol)
		}
	}

	first := env.Admit(t, "acme", map[string]any{})
	j := get(first)
	if j["waiting_on"] != "next" {
		t.Errorf("a job with room: waiting_on %v, want next", j["waiting_on"])
	}
	within("a job with room: estimated_start", instant(j, "estimated_start"), time.Now(), 5*time.Second)

	// Two of acme's jobs in flight fill its cap of 2; its last ten jobs took 10 s each, so the
	// first in line starts in about half a service time (2 units free per 10 s).
	if _, err := env.DB.ExecContext(ctx, `INSERT INTO jobs (tenant, status, queued_at, dispatched_at, started_at, finished_at)
		SELECT 'acme', 'succeeded', UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, UTC_TIMESTAMP(6) - INTERVAL 1 HOUR,
			UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, UTC_TIMESTAMP(6) - INTERVAL 1 HOUR + INTERVAL 10 SECOND FROM seq_1_to_10`); err != nil {
		t.Fatal(err)
	}
	if _, err := env.DB.ExecContext(ctx, `INSERT INTO jobs (tenant, status, queued_at, claimed_at, dispatched_at, drainer_id, lease_until)
		SELECT 'acme', 'dispatched', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 'elsewhere', UTC_TIMESTAMP(6) + INTERVAL 1 HOUR FROM seq_1_to_2`); err != nil {
		t.Fatal(err)
	}
	second := env.Admit(t, "acme", map[string]any{})
	asked := time.Now()
	j = get(second)
	if j["waiting_on"] != "tenant_cap" || j["position"] != 2.0 {
		t.Errorf("acme at its cap, one job ahead: waiting_on %v position %v, want tenant_cap 2", j["waiting_on"], j["position"])
	}
	// Two jobs need a unit to free (the one ahead and this one): one service time.
	within("acme's second job: estimated_start", instant(j, "estimated_start"), asked.Add(10*time.Second), 3*time.Second)

	// A gated rate key: the gate holds it, until the gate's end.
	gated := env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, map[string]any{"tenant": "globex", "rate_key": "upstream-1", "payload": map[string]any{}})
	if gated.Status != http.StatusAccepted {
		t.Fatalf("admit: HTTP %d: %s", gated.Status, gated.Raw)
	}
	g := env.Do(t, http.MethodPost, "/v1/gates", harness.ExecutorToken, map[string]any{"rate_key": "upstream-1", "retry_after": 60})
	if g.Status != http.StatusOK {
		t.Fatalf("gate: HTTP %d: %s", g.Status, g.Raw)
	}
	j = get(int64(gated.Body["id"].(float64)))
	if j["waiting_on"] != "rate_key" {
		t.Errorf("a gated key's job: waiting_on %v, want rate_key", j["waiting_on"])
	}
	notBefore, err := time.Parse(time.RFC3339Nano, g.Body["not_before"].(string))
	if err != nil {
		t.Fatal(err)
	}
	within("a gated key's job: waiting_until", instant(j, "waiting_until"), notBefore, time.Millisecond)
	within("a gated key's job: estimated_start", instant(j, "estimated_start"), notBefore, time.Millisecond)

	// Run later: held by its not-before.
	later := env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, map[string]any{"tenant": "initech", "delay_seconds": 600, "payload": map[string]any{}})
	if later.Status != http.StatusAccepted {
		t.Fatalf("admit: HTTP %d: %s", later.Status, later.Raw)
	}
	j = get(int64(later.Body["id"].(float64)))
	if j["waiting_on"] != "not_before" || j["waiting_until"] != j["not_before"] {
		t.Errorf("a job delayed 600 s: waiting_on %v until %v, want not_before until %v", j["waiting_on"], j["waiting_until"], j["not_before"])
	}
	within("a delayed job: estimated_start", instant(j, "estimated_start"), time.Now().Add(10*time.Minute), 30*time.Second)

	// A cap of 0: paused, and no estimate.
	j = get(env.Admit(t, "paused-tenant", map[string]any{}))
	if _, has := j["estimated_start"]; j["waiting_on"] != "paused" || has {
		t.Errorf("a paused tenant's job: waiting_on %v, estimated_start %v; want paused and none", j["waiting_on"], j["estimated_start"])
	}

	// Not queued: none of it.
	var running int64
	if err := env.DB.QueryRowContext(ctx, "SELECT id FROM jobs WHERE status = 'dispatched' LIMIT 1").Scan(&running); err != nil {
		t.Fatal(err)
	}
	j = get(running)
	for _, f := range []string{"waiting_on", "waiting_until", "estimated_start"} {
		if _, has := j[f]; has {
			t.Errorf("a dispatched job has %s: %v", f, j)
		}
	}
}
