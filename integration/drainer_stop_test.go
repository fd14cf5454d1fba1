package integration_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/limits"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/testdb"
)

// TestStopKeepsLeases proves that a stopping drainer renews the leases of the dispatches it
// waits for (SPEC §11: on SIGTERM it waits for in-flight dispatches up to a grace period, by
// default 30 s against a 10 s lease). Without it another drainer would recover a running job as
// lost while its executor was still about to answer. The dispatch is held open by the test; the
// fake clock moves past a third of the lease while Stop waits, and the lease must follow it.
func TestStopKeepsLeases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	clk := clock.NewFake(time.Now())
	t0, _ := clk.Now(ctx)
	setLimits(t, db, func(c *limits.Config) { c.LeaseSeconds = 3 })
	if _, err := db.ExecContext(ctx, "INSERT INTO tenants (tenant, created_at) VALUES ('acme', ?)", t0); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO jobs (tenant, status, queued_at) VALUES ('acme', 'queued', ?)", t0); err != nil {
		t.Fatal(err)
	}
	sender := newHeldSender()
	d, err := drainer.New(drainer.Config{DB: db.DB, Executor: sender, Clock: clk, ID: "stopping",
		PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	dispatch := sender.next(t)

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		d.Stop(sctx)
	}()
	clk.Advance(2 * time.Second)
	want := t0.Add(2*time.Second + 3*time.Second)
	harness.WaitFor(t, 10*time.Second, "the stopping drainer to renew the lease", func() (bool, error) {
		var lease time.Time
		err := db.QueryRowContext(ctx, "SELECT lease_until FROM jobs WHERE id = ?", dispatch.JobID).Scan(&lease)
		return lease.Equal(want), err
	})
	sender.answer <- executor.Answer{Kind: executor.Done, Status: "succeeded"}
	<-stopped
	var status string
	if err := db.QueryRowContext(ctx, "SELECT status FROM jobs WHERE id = ?", dispatch.JobID).Scan(&status); err != nil || status != "succeeded" {
		t.Fatalf("job %s after the answer in the grace period (%v), want succeeded", status, err)
	}
}
