package drainer_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/testdb"
)

// TestQueuedJobsExpire proves max_queue_age_seconds (SPEC §4, §9): off by default; when set,
// the drainer's upkeep moves every queued job older than it to expired (version + 1,
// finished_at, never dispatched: dispatch is paused and the executor refuses everything),
// counts it in sluice_jobs_finished_total{state="expired"}, and touches nothing younger and
// nothing that is not queued. More old jobs than one expiring transaction holds all go in one
// upkeep. Passes are driven on a fake clock.
func TestQueuedJobsExpire(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	clk := clock.NewFake(time.Now())
	t0, _ := clk.Now(ctx)
	patch := func(changes map[string]any) {
		t.Helper()
		raw := map[string]json.RawMessage{}
		for k, v := range changes {
			raw[k], _ = json.Marshal(v)
		}
		if _, _, err := config.Patch(ctx, db.DB, nil, "test", raw, "expiry test"); err != nil {
			t.Fatal(err)
		}
	}
	patch(map[string]any{"global_in_flight": 0}) // paused: nothing may leave the queue but by expiry

	if _, err := db.ExecContext(ctx, "INSERT INTO tenants (tenant, created_at) VALUES ('acme', ?), ('globex', ?)", t0, t0); err != nil {
		t.Fatal(err)
	}
	insert := func(n int, tenant, status string, queuedAt time.Time) {
		t.Helper()
		q := "INSERT INTO jobs (tenant, status, queued_at, finished_at) VALUES " +
			strings.TrimSuffix(strings.Repeat("(?, ?, ?, IF(? = 'queued', NULL, ?)),", n), ",")
		var args []any
		for range n {
			args = append(args, tenant, status, queuedAt, status, queuedAt)
		}
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
		db.RecountQueues(t, tenant)
	}
	const old = 1100 // more than two expiring transactions' worth
	insert(old-100, "acme", "queued", t0.Add(-2*time.Minute))
	insert(100, "globex", "queued", t0.Add(-61*time.Second))
	insert(7, "acme", "queued", t0.Add(-30*time.Second))
	insert(3, "globex", "canceled", t0.Add(-time.Hour))
	count := func(status string) (n int) {
		t.Helper()
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE status = ?", status).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	reg := prometheus.NewRegistry()
	jobMetrics, err := store.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	d, err := drainer.New(drainer.Config{DB: db.DB, Executor: refusing(), Clock: clk, ID: "expiry",
		Metrics: drainer.NewMetrics(reg), JobMetrics: jobMetrics})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop(ctx)
	expired := func() float64 {
		t.Helper()
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if f.GetName() == "sluice_jobs_finished_total" && l.GetName() == "state" && l.GetValue() == "expired" {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
		return 0
	}

	// Off by default: a pass expires nothing.
	if p, err := d.RunOnce(ctx); err != nil || p.Expired != 0 || count("expired") != 0 {
		t.Fatalf("with max_queue_age_seconds 0: pass %+v, %v; %d expired", p, err, count("expired"))
	}

	patch(map[string]any{"max_queue_age_seconds": 60})
	clk.Advance(time.Second) // the next pass's upkeep reads the new config and applies it
	p, err := d.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p.Expired != old || count("expired") != old || count("queued") != 7 || count("canceled") != 3 {
		t.Fatalf("pass expired %d; now %d expired, %d queued, %d canceled; want %d, %d, 7, 3",
			p.Expired, count("expired"), count("queued"), count("canceled"), old, old)
	}
	if got := expired(); got != old {
		t.Errorf(`sluice_jobs_finished_total{state="expired"} = %v, want %d`, got, old)
	}
	var badRows int
	err = db.QueryRowContext(ctx, `SELECT COUNT(*) FROM jobs WHERE status = 'expired' AND NOT (version = 1
		AND finished_at = ? AND error_code = 'max_queue_age' AND dispatched_at IS NULL AND claimed_at IS NULL)`, t0.Add(time.Second)).Scan(&badRows)
	if err != nil || badRows != 0 {
		t.Fatalf("%d expired rows without version 1, finished_at the pass's time and error_code max_queue_age (%v)", badRows, err)
	}

	// The young jobs expire once they pass the age, at the next upkeep.
	clk.Advance(30 * time.Second)
	if p, err := d.RunOnce(ctx); err != nil || p.Expired != 7 || count("queued") != 0 {
		t.Fatalf("at 61 s old: pass %+v, %v; %d still queued", p, err, count("queued"))
	}
	if got := expired(); got != old+7 {
		t.Errorf(`sluice_jobs_finished_total{state="expired"} = %v, want %d`, got, old+7)
	}
}
