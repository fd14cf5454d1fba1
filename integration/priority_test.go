package integration_test

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/apitest"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/harness"
)

// TestPriorities: one tenant's queued jobs start interactive first, then by priority, highest
// first, then by age, with its cap of 1 so that each claim takes one job; a job that waited
// longer than priority_aging_seconds (its row written an hour in the past) goes as if at the top
// and starts first of the non-interactive ones; bad priorities are refused and write nothing.
func TestPriorities(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{})
	ctx := context.Background()
	env.SetConfig(t, func(c *config.Config) { c.GlobalInFlight, c.TenantInFlight = 0, 1 })

	for _, bad := range []any{-1, 10, 4.5, "high"} {
		r := env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, map[string]any{"tenant": "acme", "priority": bad})
		if r.Status != http.StatusBadRequest || r.Body["field"] != "priority" {
			t.Errorf("priority %v: HTTP %d %s, want 400 naming priority", bad, r.Status, r.Raw)
		}
	}
	var n int
	if err := env.DB.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM jobs) + (SELECT COUNT(*) FROM job_priorities)").Scan(&n); err != nil || n != 0 {
		t.Fatalf("after the refusals: %d rows (%v), want none", n, err)
	}

	admit := func(body map[string]any) int64 {
		t.Helper()
		body["tenant"] = "acme"
		body["payload"] = map[string]any{}
		r := env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, body)
		if r.Status != http.StatusAccepted {
			t.Fatalf("admit %v: HTTP %d %s", body, r.Status, r.Raw)
		}
		return int64(r.Body["id"].(float64))
	}
	low := admit(map[string]any{"priority": 1})
	def := admit(map[string]any{})
	high := admit(map[string]any{"priority": 7})
	top := admit(map[string]any{"priority": 9})
	def2 := admit(map[string]any{"priority": 5})
	inter := admit(map[string]any{"priority": 0, "interactive": true})
	// A job of priority 0 that has waited an hour, past priority_aging_seconds (300).
	var aged int64
	if err := env.DB.QueryRowContext(ctx, `INSERT INTO jobs (tenant, status, queued_at, caller, priority)
		VALUES ('acme', 'queued', UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, 'test', 0) RETURNING id`).Scan(&aged); err != nil {
		t.Fatal(err)
	}
	if _, err := env.DB.ExecContext(ctx, `INSERT INTO job_priorities (job_id, tenant, priority, queued_at)
		SELECT id, tenant, priority, queued_at FROM jobs WHERE id = ?`, aged); err != nil {
		t.Fatal(err)
	}
	env.DB.RecountQueues(t)
	if r := env.Do(t, http.MethodGet, "/v1/jobs/"+strconv.FormatInt(high, 10), harness.ProducerToken, nil); r.Body["priority"] != 7.0 {
		t.Errorf("GET job: priority %v, want 7", r.Body["priority"])
	}

	env.SetConfig(t, func(c *config.Config) { c.GlobalInFlight = 1 })
	all := []int64{low, def, high, top, def2, inter, aged}
	harness.WaitFor(t, time.Minute, "the tenant's seven jobs to succeed", func() (bool, error) {
		c, err := env.CountJobs(ctx)
		return c["succeeded"] == len(all), err
	})
	got := drainertest.QueryIDs(t, env.DB.DB, "SELECT id FROM jobs ORDER BY dispatched_at, id")
	want := []int64{inter, aged, top, high, def, def2, low}
	if !slices.Equal(got, want) {
		t.Errorf("dispatch order %v, want %v (interactive, aged, 9, 7, 5, 5, 1)", got, want)
	}
	// The rows of the ended jobs leave job_priorities with the drainer's upkeep.
	harness.WaitFor(t, 30*time.Second, "job_priorities to empty", func() (bool, error) {
		err := env.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM job_priorities").Scan(&n)
		return n == 0, err
	})
}

// TestPriorityRowOfALongJobGoes: the one job of another priority than the default is held at the
// executor past an upkeep that follows its claim (the drainer's heartbeat, written by the upkeep,
// moves past the job's dispatch), and its tenant has no more work, so no page names the tenant
// again; its row in job_priorities still goes once it ends (the upkeep keeps deleting until the
// table is empty), and with it the dive that every tenants page makes while the table has rows.
func TestPriorityRowOfALongJobGoes(t *testing.T) {
	t.Parallel()
	h := newHolder(t)
	env := harness.Start(t, harness.Options{OnReceive: h.onReceive})
	ctx := context.Background()
	env.SetConfig(t, func(c *config.Config) { c.GlobalInFlight = 0 })
	r := env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, map[string]any{"tenant": "acme", "priority": 8,
		"payload": map[string]any{}})
	if r.Status != http.StatusAccepted {
		t.Fatalf("admit: HTTP %d %s", r.Status, r.Raw)
	}
	h.hold(apitest.JobID(t, r.Body))
	env.SetConfig(t, func(c *config.Config) { c.GlobalInFlight = 1 })
	harness.WaitFor(t, time.Minute, "an upkeep after the held job's dispatch", func() (bool, error) {
		var after bool
		err := env.DB.QueryRowContext(ctx, `SELECT COALESCE(MAX(d.heartbeat_at) > MAX(j.dispatched_at), FALSE)
			FROM drainers d, jobs j WHERE j.dispatched_at IS NOT NULL`).Scan(&after)
		return after, err
	})
	h.let()
	harness.WaitFor(t, time.Minute, "the job to succeed", func() (bool, error) {
		c, err := env.CountJobs(ctx)
		return c["succeeded"] == 1, err
	})
	harness.WaitFor(t, 30*time.Second, "its job_priorities row to go", func() (bool, error) {
		var n int
		err := env.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM job_priorities").Scan(&n)
		return n == 0, err
	})
}
