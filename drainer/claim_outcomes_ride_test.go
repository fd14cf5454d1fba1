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
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/testdb"
	"github.com/sluicehq/sluice/integration/wait"
)

// TestOutcomesRideTheNextClaim drains a backlog through a running drainer whose executor answers
// at once: the outcomes of one claim's jobs are written in the next claim's transaction, in the
// round trip of its UPDATE, and the caps stay exact (the audit trail's replay never counts more
// in flight than the global cap). A batch holding a requeue (a 503) is written on its own, never
// with a claim, and the job it requeued is claimed again and finishes.
func TestOutcomesRideTheNextClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	testdb.SetLimits(t, db.DB, func(c *config.Config) { c.GlobalInFlight, c.TenantInFlight = 4, 4 })
	drainertest.QueueJobs(t, db, 3, 60)
	counted, log := drainertest.CountedPool(t, db)
	sender := &drainertest.Executor{Answer: func(_ context.Context, n int, _ executor.Dispatch) executor.Answer {
		if n == 9 {
			return executor.Answer{Kind: executor.Refused, RetryAfter: 1}
		}
		return executor.Answer{Kind: executor.Done, Status: "succeeded"}
	}}
	d := drainertest.NewDrainer(t, drainer.Config{DB: counted, Executor: sender, ID: "rider", PollInterval: 100 * time.Millisecond}, 10*time.Second)
	drainertest.Run(t, d)
	wait.For(t, time.Minute, "every job to succeed", func() (bool, error) {
		var left int
		err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE status <> 'succeeded'").Scan(&left)
		return left == 0, err
	})
	if peak := drainertest.PeakInFlight(t, db); peak > 4 {
		t.Errorf("the audit trail had %d jobs in flight at once; cap 4", peak)
	}
	var refused int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE refusals = 1").Scan(&refused); err != nil || refused != 1 {
		t.Errorf("%d jobs refused once (%v); want the one the executor refused", refused, err)
	}
	const outcome, claim, requeue = "UPDATE jobs SET version = version + 1, started_at = COALESCE",
		"UPDATE jobs FORCE INDEX (PRIMARY) SET status = 'dispatched'", "UPDATE jobs SET status = 'queued'"
	rode, requeued := 0, 0
	for _, q := range log.Take() {
		if strings.Contains(q, requeue) {
			requeued++
			if strings.Contains(q, claim) {
				t.Errorf("a requeue rode a claim: %.300s", q)
			}
		}
		if strings.Contains(q, outcome) && strings.Contains(q, claim) {
			rode++
		}
	}
	if rode == 0 || requeued != 1 {
		t.Errorf("%d claims carried outcomes, %d round trips requeued; want outcomes riding claims and the one requeue", rode, requeued)
	}
}

// TestRiddenOutcomeOfAMovedJob: an answer for a job that moved on while it was dispatched (here
// marked lost, as lease recovery would) is dropped by the claim that carries it, which claims the
// next job all the same; the moved job keeps the state it was moved to.
func TestRiddenOutcomeOfAMovedJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	testdb.SetLimits(t, db.DB, func(c *config.Config) { c.GlobalInFlight, c.TenantInFlight = 1, 1 })
	drainertest.QueueJobs(t, db, 1, 3)
	var moved atomic.Int64
	sender := &drainertest.Executor{Answer: func(_ context.Context, n int, d executor.Dispatch) executor.Answer {
		if n == 1 {
			if _, err := db.ExecContext(ctx, "UPDATE jobs SET status = 'lost', version = version + 1, lease_until = NULL WHERE id = ?", d.JobID); err != nil {
				t.Error(err)
			}
			moved.Store(d.JobID)
		}
		return executor.Answer{Kind: executor.Done, Status: "succeeded"}
	}}
	d := drainertest.NewDrainer(t, drainer.Config{DB: db.DB, Executor: sender, ID: "rider", PollInterval: 100 * time.Millisecond}, 10*time.Second)
	drainertest.Run(t, d)
	wait.For(t, time.Minute, "the other jobs to succeed", func() (bool, error) {
		var done int
		err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE status = 'succeeded'").Scan(&done)
		return done == 2, err
	})
	var status string
	if err := db.QueryRowContext(ctx, "SELECT status FROM jobs WHERE id = ?", moved.Load()).Scan(&status); err != nil || status != "lost" {
		t.Errorf("the moved job is %q (%v); want it left lost", status, err)
	}
}
