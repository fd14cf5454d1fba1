package drainer_test

import (
	"context"
	"database/sql"
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

// TestOutcomesBesideTheNextClaim drains a backlog through a running drainer whose executor answers
// at once: the outcomes of one claim's jobs are written in a transaction of their own beside the
// next claim, which counts them out of flight and commits only after them, so the caps stay exact
// at every commit (checked as each such claim's COMMIT goes out: what is committed in flight plus
// the claim's jobs is within the global cap) and in the audit trail's order (its replay never
// counts more in flight than the cap). A batch holding a requeue (a 503) is written on its own,
// never beside a claim, and the job it requeued is claimed again and finishes.
func TestOutcomesBesideTheNextClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	const limit = 4
	testdb.SetLimits(t, db.DB, func(c *config.Config) { c.GlobalInFlight, c.TenantInFlight = limit, limit })
	drainertest.QueueJobs(t, db, 3, 60)
	counted, log := drainertest.CountedPool(t, db)
	var checked atomic.Int64
	log.BeforeSending(func(q string) {
		// A claim that waited for outcomes commits in a round trip of its own: its audit rows
		// (the only statement that names the claim's nonces without its UPDATE) and COMMIT.
		if strings.Contains(q, "UPDATE jobs") || !store.EndsWithCommit(q) {
			return
		}
		_, in, ok := strings.Cut(q, "nonce_sha256 IN (")
		if !ok {
			return
		}
		in, _, _ = strings.Cut(in, ")")
		claiming := int64(strings.Count(in, "?"))
		var inFlight int64
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE status IN ('claimed','dispatched','running')").Scan(&inFlight); err != nil {
			t.Error(err)
			return
		}
		checked.Add(1)
		if inFlight+claiming > limit {
			t.Errorf("a claim of %d job(s) commits with %d committed in flight; cap %d", claiming, inFlight, limit)
		}
	})
	sender := &drainertest.Executor{Answer: func(_ context.Context, n int, _ executor.Dispatch) executor.Answer {
		if n == 9 {
			return executor.Answer{Kind: executor.Refused, RetryAfter: 1}
		}
		return executor.Answer{Kind: executor.Done, Status: "succeeded"}
	}}
	drainAll(t, db, counted, sender)
	log.BeforeSending(nil)
	if peak := drainertest.PeakInFlight(t, db); peak > limit {
		t.Errorf("the audit trail had %d jobs in flight at once; cap %d", peak, limit)
	}
	var refused int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE refusals = 1").Scan(&refused); err != nil || refused != 1 {
		t.Errorf("%d jobs refused once (%v); want the one the executor refused", refused, err)
	}
	const claim, requeue = "UPDATE jobs FORCE INDEX (PRIMARY) SET status = 'dispatched'", "UPDATE jobs SET status = 'queued'"
	requeued := 0
	for _, q := range log.Take() {
		if strings.Contains(q, requeue) {
			requeued++
			if strings.Contains(q, claim) {
				t.Errorf("a requeue went with a claim: %.300s", q)
			}
		}
	}
	if checked.Load() == 0 || requeued != 1 {
		t.Errorf("%d claims committed after outcomes beside them, %d round trips requeued; want claims beside outcomes and the one requeue",
			checked.Load(), requeued)
	}
}

// TestOutcomeOfAMovedJobBesideAClaim: an answer for a job that moved on while it was dispatched
// (here marked lost, as lease recovery would) is dropped by the pass that brings it, which claims
// the next job all the same; the moved job keeps the state it was moved to.
func TestOutcomeOfAMovedJobBesideAClaim(t *testing.T) {
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

// TestClaimRollsBackWhenOutcomesBesideFail: the outcomes written beside a claim fail (a trigger
// refuses their UPDATE once), so the claim, which counted their jobs out of flight, rolls back
// rather than commit with them still in flight; the outcome is recorded by the pass that follows,
// and the job the failed claim took is claimed again then. Cap 1: a claim that committed anyway
// would show two jobs in flight in the audit trail's replay, and its job dispatched twice.
func TestClaimRollsBackWhenOutcomesBesideFail(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	testdb.SetLimits(t, db.DB, func(c *config.Config) { c.GlobalInFlight, c.TenantInFlight = 1, 1 })
	for _, q := range []string{"CREATE TABLE outcome_fault (fail BOOLEAN NOT NULL)", "INSERT INTO outcome_fault VALUES (TRUE)",
		`CREATE TRIGGER outcome_fault BEFORE UPDATE ON jobs FOR EACH ROW
			IF NEW.status = 'succeeded' AND (SELECT fail FROM outcome_fault) THEN
				SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'the test refuses this outcome';
			END IF`} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	drainertest.QueueJobs(t, db, 1, 3)
	counted, log := drainertest.CountedPool(t, db)
	var outcomes, opened, committed atomic.Int64
	log.BeforeSending(func(q string) {
		switch {
		case strings.Contains(q, "UPDATE jobs SET version = version + 1, started_at = COALESCE") && store.EndsWithCommit(q):
			if outcomes.Add(1) == 2 {
				// The first write failed; the second goes through.
				if _, err := db.ExecContext(ctx, "UPDATE outcome_fault SET fail = FALSE"); err != nil {
					t.Error(err)
				}
			}
		case strings.Contains(q, "SET status = 'dispatched'") && !store.EndsWithCommit(q):
			opened.Add(1) // a claim left open for the outcomes beside it
		case strings.Contains(q, "nonce_sha256 IN") && !strings.Contains(q, "UPDATE jobs") && store.EndsWithCommit(q):
			committed.Add(1) // its commit
		}
	})
	sender := &drainertest.Executor{Record: true}
	drainAll(t, db, counted, sender)
	log.BeforeSending(nil)
	if outcomes.Load() < 2 || opened.Load()-committed.Load() != 1 {
		t.Fatalf("%d outcome writes, %d claims left open, %d of them committed; want the first write refused and the claim beside it rolled back",
			outcomes.Load(), opened.Load(), committed.Load())
	}
	if peak := drainertest.PeakInFlight(t, db); peak > 1 {
		t.Errorf("the audit trail had %d jobs in flight at once; cap 1", peak)
	}
	var dispatches int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM audit_events WHERE to_status = 'dispatched'").Scan(&dispatches); err != nil || dispatches != 3 {
		t.Errorf("%d dispatches recorded (%v); want one a job", dispatches, err)
	}
	if n := len(sender.Dispatches()); n != 3 {
		t.Errorf("the executor received %d dispatches; want one a job", n)
	}
}

// drainAll runs a drainer over pool, sending to sender, until every job of db has succeeded.
func drainAll(t *testing.T, db *testdb.DB, pool *sql.DB, sender *drainertest.Executor) {
	t.Helper()
	d := drainertest.NewDrainer(t, drainer.Config{DB: pool, Executor: sender, ID: "beside", PollInterval: 100 * time.Millisecond}, 10*time.Second)
	drainertest.Run(t, d)
	wait.For(t, time.Minute, "every job to succeed", func() (bool, error) {
		var left int
		err := db.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM jobs WHERE status <> 'succeeded'").Scan(&left)
		return left == 0, err
	})
}
