package drainer_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/testdb"
	"github.com/sluicehq/sluice/integration/wait"
)

// TestClaimAndRequeueTakeTenantsInOrder: a claim and a batch of requeues that move jobs of the
// same two tenants do not deadlock. The claim takes jobs a (tenant t2) and b (t1); the requeue
// takes c (t1) and d (t2). Migration 0010's triggers lock a tenant's row as each job moves, so a
// claim writing a then b takes t2 and then waits for t1. A third transaction holds t1: the
// requeue, which locks its tenants in key order, waits for t1 first; the claim then locks its
// jobs and waits too. Released, the requeue takes t1 and wants t2: had the claim taken t2 while
// writing a, each would wait for the other. Both must commit.
func TestClaimAndRequeueTakeTenantsInOrder(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t)
	testdb.SetLimits(t, db.DB, func(c *config.Config) { c.GlobalInFlight, c.TenantInFlight = 4, 2 })
	exec := func(q string, args ...any) int64 {
		t.Helper()
		r, err := db.ExecContext(ctx, q, args...)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		id, _ := r.LastInsertId()
		return id
	}
	exec("INSERT INTO tenants (tenant, created_at) VALUES ('t1', UTC_TIMESTAMP(6)), ('t2', UTC_TIMESTAMP(6))")
	a := exec("INSERT INTO jobs (tenant, status, queued_at) VALUES ('t2', 'queued', UTC_TIMESTAMP(6))")
	b := exec("INSERT INTO jobs (tenant, status, queued_at) VALUES ('t1', 'queued', UTC_TIMESTAMP(6))")
	inFlight := func(tenant string) int64 {
		return exec(`INSERT INTO jobs (tenant, status, version, attempt, queued_at, claimed_at, dispatched_at, lease_until, drainer_id)
			VALUES (?, 'dispatched', 1, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, 'other')`, tenant)
	}
	c, d := inFlight("t1"), inFlight("t2")
	db.RecountQueues(t)

	hold, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	if _, err := hold.ExecContext(ctx, "SELECT tenant FROM tenants WHERE tenant = 't1' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	held := func(q string, arg any) func() (bool, error) {
		return func() (bool, error) { return db.HeldElsewhere(ctx, q, arg) }
	}

	requeued := make(chan error, 1)
	go func() {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			requeued <- err
			return
		}
		defer tx.Rollback()
		var items []store.Finishing
		for _, id := range []int64{c, d} {
			r, err := store.Get(ctx, tx, id, false)
			if err != nil {
				requeued <- err
				return
			}
			items = append(items, store.Finishing{Row: r, Outcome: store.Outcome{Status: job.Queued}})
		}
		if _, err := (&store.Store{}).FinishMany(ctx, tx, time.Now(), items); err != nil {
			requeued <- err
			return
		}
		requeued <- tx.Commit()
	}()
	wait.For(t, 10*time.Second, "the requeue to lock job d", func() (bool, error) {
		return held("SELECT 1 FROM jobs WHERE id = ?", d)()
	})
	dr := drainertest.NewDrainer(t, drainer.Config{DB: db.DB, Executor: &drainertest.Executor{}, ID: "claimer"}, 10*time.Second)
	claimed := make(chan drainer.Pass, 1)
	claimErr := make(chan error, 1)
	go func() {
		p, err := dr.RunOnce(ctx)
		claimed <- p
		claimErr <- err
	}()
	wait.For(t, 10*time.Second, "the claim to lock jobs a and b", func() (bool, error) {
		ha, err := held("SELECT 1 FROM jobs WHERE id = ?", a)()
		if err != nil || !ha {
			return false, err
		}
		return held("SELECT 1 FROM jobs WHERE id = ?", b)()
	})

	if err := hold.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := <-requeued; err != nil {
		t.Errorf("requeue: %v", err)
	}
	p := <-claimed
	if err := <-claimErr; err != nil {
		t.Errorf("claim: %v", err)
	}
	if p.Claimed != 2 {
		t.Errorf("the pass claimed %d jobs, want a and b", p.Claimed)
	}
	drainertest.CheckTenantQueueState(t, ctx, db.DB, "after the claim and the requeue")
}
