package drainer_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/testdb"
	"github.com/sluicehq/sluice/integration/wait"
)

// TestStopKeepsLeases proves that a stopping drainer renews the leases of the dispatches it
// waits for (SPEC §11: on SIGTERM it waits for in-flight dispatches up to a grace period, by
// default 30 s against a 10 s lease). Without it another drainer would recover a running job as
// lost while its executor was still about to answer. The dispatch is held open by the test; the
// fake clock moves past a third of the lease while Stop waits, and the lease must follow it.
func TestStopKeepsLeases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, clk, t0 := drainertest.NewDB(t, func(c *config.Config) { c.LeaseSeconds = 3 })
	drainertest.QueueOneJob(t, db, t0)
	sender := drainertest.NewHeld()
	d, err := drainer.New(drainer.Config{DB: db.DB, Executor: sender, Clock: clk, ID: "stopping",
		PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	dispatch := sender.Next(t)

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		d.Stop(sctx)
	}()
	clk.Advance(2 * time.Second)
	want := t0.Add(2*time.Second + 3*time.Second)
	wait.For(t, 10*time.Second, "the stopping drainer to renew the lease", func() (bool, error) {
		return leaseUntil(t, db, dispatch.JobID).Equal(want), nil
	})
	sender.Replies <- executor.Answer{Kind: executor.Done, Status: "succeeded"}
	<-stopped
	if s := drainertest.ReadJob(t, db.DB, dispatch.JobID).Status; s != "succeeded" {
		t.Fatalf("job %s after the answer in the grace period, want succeeded", s)
	}
}

// TestAcceptedJobOutlivesItsDrainer proves SPEC §8's 202 row: a job the executor accepted stays
// dispatched or running until its /complete or the wall, whatever becomes of the drainer that
// sent it. The 202 moves the lease to the wall at once; the drainer then stops, and another
// drainer long past the normal lease leaves the job alone, takes it back only after the wall,
// and the sender holds nothing after the 202.
func TestAcceptedJobOutlivesItsDrainer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, clk, t0 := drainertest.NewDB(t, func(c *config.Config) { c.LeaseSeconds, c.ExecutionWallSeconds = 3, 60 })
	id := drainertest.QueueOneJob(t, db, t0)
	recorded := make(chan int64, 1)
	sender := &drainertest.Executor{Answer: func(context.Context, int, executor.Dispatch) executor.Answer {
		return executor.Answer{Kind: executor.Accepted, HTTPStatus: 202}
	}}
	first, err := drainer.New(drainer.Config{DB: db.DB, Executor: sender, Clock: clk, ID: "sender",
		Observer: drainer.ObserverFuncs{OnRecorded: func(id int64) { recorded <- id }}})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := first.RunOnce(ctx); err != nil || p.Claimed != 1 {
		t.Fatalf("first pass: %+v, %v", p, err)
	}
	drainertest.AwaitRecorded(t, recorded, 1)
	if lease, want := leaseUntil(t, db, id), t0.Add(time.Minute); !lease.Equal(want) {
		t.Errorf("lease after the 202 ends %s, want the wall %s", lease, want)
	}
	if n := first.InFlight(); n != 0 {
		t.Errorf("the sending drainer still holds %d job(s) after the 202, want none", n)
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	first.Stop(stopCtx)
	cancel()

	resender := &drainertest.Executor{Record: true}
	second, err := drainer.New(drainer.Config{DB: db.DB, Executor: resender, Clock: clk, ID: "survivor"})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Stop(ctx)
	status := func() string { return drainertest.ReadJob(t, db.DB, id).Status }
	clk.Advance(30 * time.Second) // ten leases later, within the wall
	if p, err := second.RunOnce(ctx); err != nil || p.Recovered != 0 || len(resender.Dispatches()) != 0 || status() != "dispatched" {
		t.Fatalf("within the wall: pass %+v, %v; job %s; want it left dispatched", p, err, status())
	}
	// Past the wall, with dispatch paused so that the recovered job is not sent again.
	testdb.SetLimits(t, db.DB, func(c *config.Config) { c.GlobalInFlight = 0 })
	clk.Advance(31 * time.Second)
	if p, err := second.RunOnce(ctx); err != nil || p.Recovered != 1 || status() != "queued" {
		t.Fatalf("past the wall: pass %+v, %v; job %s, want it recovered to queued (its start was never confirmed)", p, err, status())
	}
}

// TestRenewalNeverShortensALease: a renewal that reaches the database after a 202 moved the
// job's lease to its wall must not cut it back to one lease, or the job, no longer renewed once
// its drainer lets go of it, would be recovered long before its wall. The race is made
// deterministic by holding the dispatch open and writing the wall lease by hand, as the 202's
// record does, before the next renewal.
func TestRenewalNeverShortensALease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, clk, t0 := drainertest.NewDB(t, func(c *config.Config) { c.LeaseSeconds = 3 })
	drainertest.QueueOneJob(t, db, t0)
	sender := drainertest.NewHeld()
	d := drainertest.NewDrainer(t, drainer.Config{DB: db.DB, Executor: sender, Clock: clk, ID: "renewer"}, 10*time.Second)
	if _, err := d.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	dispatch := sender.Next(t)
	wall := t0.Add(time.Minute)
	if _, err := db.ExecContext(ctx, "UPDATE jobs SET lease_until = ? WHERE id = ?", wall, dispatch.JobID); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Second) // a renewal is due
	if p, err := d.RunOnce(ctx); err != nil || p.Renewed != 1 {
		t.Fatalf("pass %+v, %v; want one lease renewed", p, err)
	}
	if lease := leaseUntil(t, db, dispatch.JobID); !lease.Equal(wall) {
		t.Errorf("renewal left the lease at %s, want the later %s kept", lease, wall)
	}
	sender.Replies <- executor.Answer{Kind: executor.Done, Status: "succeeded"}
}

// TestLeasesRenewedDuringAStuckClaim: a pass whose claim waits for the claim lock (another
// process holds it; a claim may wait the whole 10 s lock wait, as long as a lease) still renews
// the leases of the jobs its drainer is running, once a poll period, so that no other drainer
// recovers them as lost meanwhile.
func TestLeasesRenewedDuringAStuckClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, clk, t0 := drainertest.NewDB(t, func(c *config.Config) { c.LeaseSeconds = 3 })
	running := drainertest.QueueOneJob(t, db, t0)
	sender := drainertest.NewHeld()
	d := drainertest.NewDrainer(t, drainer.Config{DB: db.DB, Executor: sender, Clock: clk, ID: "patient",
		PollInterval: 20 * time.Millisecond}, 10*time.Second)
	if p, err := d.RunOnce(ctx); err != nil || p.Claimed != 1 {
		t.Fatalf("first pass: %+v, %v", p, err)
	}
	sender.Next(t)
	drainertest.QueueOneJob(t, db, t0) // something for the next pass to claim, so that it takes the claim lock

	holder, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.ExecContext(ctx, "SELECT id FROM claim_lock WHERE id = 1 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Second) // a renewal is due
	passed := make(chan error, 1)
	go func() {
		_, err := d.RunOnce(ctx)
		passed <- err
	}()
	want := t0.Add(2*time.Second + 3*time.Second)
	wait.For(t, 5*time.Second, "the lease renewed while the claim waits for the lock", func() (bool, error) {
		return leaseUntil(t, db, running).Equal(want), nil
	})
	select {
	case err := <-passed:
		t.Fatalf("the pass ended (%v) while the claim lock was held; the test proves nothing", err)
	default:
	}
	if err := holder.Rollback(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-passed:
	case <-time.After(15 * time.Second):
		t.Fatal("the pass did not end once the claim lock was free")
	}
	sender.Replies <- executor.Answer{Kind: executor.Done, Status: "succeeded"}
	sender.Replies <- executor.Answer{Kind: executor.Done, Status: "succeeded"}
}

// leaseUntil reads job id's lease.
func leaseUntil(t *testing.T, db *testdb.DB, id int64) time.Time {
	t.Helper()
	var lease time.Time
	if err := db.QueryRowContext(context.Background(), "SELECT lease_until FROM jobs WHERE id = ?", id).Scan(&lease); err != nil {
		t.Fatal(err)
	}
	return lease
}

// TestStopHandsBackClaimedJobs proves SPEC §11's "on SIGTERM a process stops claiming, returns
// jobs it claimed but has not sent to queued": a pass whose context is cancelled (what SIGTERM
// does to the drainer's loop) after its claim was sent lets the claim commit and hands the jobs
// back, sending none, on both claim paths. Nothing is left dispatched for lease recovery to
// charge to the dispatch budget or, with unconfirmed starts, to call lost.
func TestStopHandsBackClaimedJobs(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		jobs  int
		poked bool // the lone-job path: one job after a pass over the empty queue, then a Poke
	}{
		{"cancelled with the claim's commit", 2, false},
		{"lone job, cancelled with the claim's commit", 1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db, clk, t0 := drainertest.NewDB(t, func(*config.Config) {})
			counted, log := drainertest.CountedPool(t, db)
			sender := &drainertest.Executor{Record: true}
			d := drainertest.NewDrainer(t, drainer.Config{DB: counted, Executor: sender, Clock: clk, ID: "stopping"}, 10*time.Second)
			if c.poked {
				if _, err := d.RunOnce(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			var ids []int64
			for range c.jobs {
				ids = append(ids, drainertest.QueueOneJob(t, db, t0))
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var claimSent atomic.Bool
			log.BeforeSending(func(q string) {
				isClaim := strings.Contains(q, "UPDATE jobs FORCE INDEX (PRIMARY) SET status = 'dispatched'") && store.EndsWithCommit(q)
				if isClaim {
					claimSent.Store(true)
					cancel()
				}
			})
			if c.poked {
				d.Poke()
			}
			p, _ := d.RunOnce(ctx)
			log.BeforeSending(nil)
			if !claimSent.Load() {
				t.Fatalf("the pass sent no claim (pass %+v); statements:\n%s", p, strings.Join(log.Take(), "\n---\n"))
			}
			if n := len(sender.Dispatches()); n != 0 || p.Claimed != 0 {
				t.Errorf("the cancelled pass sent %d dispatches and reports %d claimed, want none", n, p.Claimed)
			}
			for _, id := range ids {
				var status, msg string
				var version int
				if err := db.QueryRow("SELECT status, version, COALESCE(error_message, '') FROM jobs WHERE id = ?", id).
					Scan(&status, &version, &msg); err != nil {
					t.Fatal(err)
				}
				if why := "the drainer stopped before sending it"; status != "queued" || version != 2 || msg != why {
					t.Errorf("job %d: %s, version %d, %q; want queued again after its claim (version 2), %q", id, status, version, msg, why)
				}
			}
		})
	}
}
