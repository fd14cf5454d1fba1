package drainer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/testdb"
	"github.com/sluicehq/sluice/integration/wait"
)

// TestFullDrainerSkipsItsClaim: a pass of a drainer whose unanswered dispatches fill the global
// cap asks the database nothing (a woken full drainer used to read the in-flight counts only to
// find no room), and raising the cap still starts the next job: the upkeep's config read sees
// the new cap and the following pass claims.
func TestFullDrainerSkipsItsClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	testdb.SetLimits(t, db.DB, func(c *config.Config) { c.GlobalInFlight, c.TenantInFlight = 2, 3 })
	if _, err := db.ExecContext(ctx, "INSERT INTO tenants (tenant, created_at) VALUES ('t', UTC_TIMESTAMP(6))"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO jobs (tenant, status, queued_at)
		SELECT 't', 'queued', UTC_TIMESTAMP(6) FROM seq_1_to_3`); err != nil {
		t.Fatal(err)
	}
	db.RecountQueues(t, "t")
	counted, log := drainertest.CountedPool(t, db)
	clk := clock.NewFake(time.Now())
	exec := drainertest.NewHeld()
	d := drainertest.NewDrainer(t, drainer.Config{DB: counted, Executor: exec, Clock: clk, ID: "full"}, 10*time.Second)

	if p, err := d.RunOnce(ctx); err != nil || p.Claimed != 2 {
		t.Fatalf("first pass: claimed %d (%v), want the global cap of 2", p.Claimed, err)
	}
	exec.Next(t)
	exec.Next(t)

	log.Reset()
	if p, err := d.RunOnce(ctx); err != nil || p.Claimed != 0 {
		t.Fatalf("full pass: claimed %d (%v), want none", p.Claimed, err)
	}
	if got := log.Take(); len(got) != 0 {
		t.Errorf("a pass with the cap filled by unanswered dispatches sent %d round trips, want none:\n%s",
			len(got), strings.Join(got, "\n---\n"))
	}

	testdb.SetLimits(t, db.DB, func(c *config.Config) { c.GlobalInFlight, c.TenantInFlight = 3, 3 })
	clk.Advance(time.Second) // the upkeep's turn: it re-reads the config while jobs are held
	if _, err := d.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if p, err := d.RunOnce(ctx); err != nil || p.Claimed != 1 {
		t.Fatalf("pass after the cap was raised to 3: claimed %d (%v), want the third job", p.Claimed, err)
	}
	exec.Next(t)
	for range 3 {
		exec.Replies <- executor.Answer{Kind: executor.Done, Status: "succeeded"}
	}
	wait.For(t, 10*time.Second, "the three outcomes to be recorded", func() (bool, error) {
		var n int
		err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE status = 'succeeded'").Scan(&n)
		return n == 3, err
	})
}
