package drainer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/drainertest"
)

// TestPageGivesTenantsOnlyJobs: a pass takes the one queued job of a tenant that has one from
// its page of tenants, and reads queue heads only for the tenants with more; a tenant's only job
// whose not-before has not come is not claimed.
func TestPageGivesTenantsOnlyJobs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, clk, t0 := drainertest.NewDB(t, func(*config.Config) {})
	later := t0.Add(time.Hour)
	insert := func(tenant string, at time.Time, notBefore *time.Time) int64 {
		t.Helper()
		if _, err := db.ExecContext(ctx, "INSERT IGNORE INTO tenants (tenant, created_at) VALUES (?, ?)", tenant, at); err != nil {
			t.Fatal(err)
		}
		res, err := db.ExecContext(ctx, "INSERT INTO jobs (tenant, status, queued_at, not_before) VALUES (?, 'queued', ?, ?)", tenant, at, notBefore)
		if err != nil {
			t.Fatal(err)
		}
		id, err := res.LastInsertId()
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	deferred := insert("x", t0, &later)
	only := insert("y", t0.Add(time.Millisecond), nil)
	first := insert("z", t0.Add(2*time.Millisecond), nil)
	second := insert("z", t0.Add(3*time.Millisecond), nil)
	db.RecountQueues(t, "x", "y", "z")
	counted, log := drainertest.CountedPool(t, db)
	sender := &drainertest.Executor{Record: true}
	d := drainertest.NewDrainer(t, drainer.Config{DB: counted, Executor: sender, Clock: clk, ID: "pager"}, 10*time.Second)
	if _, err := d.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	sent := map[int64]bool{}
	for _, s := range sender.Dispatches() {
		sent[s.JobID] = true
	}
	if len(sent) != 3 || !sent[only] || !sent[first] || !sent[second] || sent[deferred] {
		t.Errorf("dispatched %v; want y's only job and z's two (cap 2), not x's deferred one", sent)
	}
	reads := 0
	for _, q := range log.Take() {
		n := strings.Count(q, "FORCE INDEX (claim) WHERE status = 'queued' AND tenant = ?")
		if n > 1 {
			t.Errorf("a heads read of %d tenants; only z needs one: %.200s", n, q)
		}
		reads += n
	}
	if reads == 0 {
		t.Error("no heads read seen; z needs one (has the read's text changed?)")
	}
}
