package store_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/testdb"
	"github.com/sluicehq/sluice/integration/wait"
	"github.com/sluicehq/sluice/migrations"
)

// queueState is a tenant's row of migrations/0010: its queued count, its oldest queued job and
// whether the work_tenant index lists it.
type queueState struct {
	queued int
	headID int64 // 0: none
	headAt string
	listed bool
}

func readQueueState(t *testing.T, db *sql.DB, tenant string) queueState {
	t.Helper()
	var s queueState
	var headID sql.NullInt64
	var headAt sql.NullString
	if err := db.QueryRowContext(context.Background(), `SELECT queued, head_id, CAST(head_at AS CHAR), work_tenant IS NOT NULL
		FROM tenants WHERE tenant = ?`, tenant).Scan(&s.queued, &headID, &headAt, &s.listed); err != nil {
		t.Fatal(err)
	}
	s.headID, s.headAt = headID.Int64, headAt.String
	return s
}

// TestTenantQueueState is the conformance test of the triggers of migrations/0010: what each kind
// of statement that moves a job into or out of queued does to its tenant's queue state, and that
// statements which do not (an outcome of a job in flight) leave it alone. Jobs inserted raw are
// counted by RecountQueues (admission counts its own: TestStateMachineProperties).
func TestTenantQueueState(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t)
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	want := func(step string, w queueState) {
		t.Helper()
		if got := readQueueState(t, db.DB, "acme"); got != w {
			t.Fatalf("%s: queue state %+v, want %+v", step, got, w)
		}
	}
	const t1, t2, t3 = "2026-01-01 00:00:01.000000", "2026-01-01 00:00:02.000000", "2026-01-01 00:00:03.000000"
	exec("INSERT INTO tenants (tenant, created_at) VALUES ('acme', UTC_TIMESTAMP(6)), ('other', UTC_TIMESTAMP(6))")
	want("a new tenant", queueState{})

	recount := func() {
		t.Helper()
		if err := store.RecountQueues(ctx, db); err != nil {
			t.Fatal(err)
		}
	}
	// Raw inserts are not counted until a recount: rows out of (queued_at, id) order, a
	// rejected row, a tie on queued_at.
	exec("INSERT INTO jobs (id, tenant, status, queued_at) VALUES (10, 'acme', 'queued', ?), (11, 'acme', 'queued', ?), (12, 'acme', 'queued', ?)", t2, t1, t3)
	want("three inserted raw", queueState{})
	recount()
	want("three recounted", queueState{3, 11, t1, true})
	exec("INSERT INTO jobs (id, tenant, status, queued_at) VALUES (13, 'acme', 'rejected', ?), (14, 'acme', 'queued', ?)", t1, t1)
	recount()
	want("a rejected row; a tie on queued_at goes by id", queueState{4, 11, t1, true})

	// Claim: the count drops and the head stays where it was (migration 0018), a lower bound of
	// the oldest queued job, until AdvanceHeads sets it forward to the next (queued_at, id).
	exec("UPDATE jobs SET status = 'dispatched', version = version + 1 WHERE id IN (11, 12)")
	want("head and tail claimed", queueState{2, 11, t1, true})
	advance := func(tenants ...string) {
		t.Helper()
		if skipped, err := store.AdvanceHeads(ctx, db.DB, tenants); err != nil || len(skipped) > 0 {
			t.Fatalf("advance: skipped %v, %v", skipped, err)
		}
	}
	advance("acme", "acme", "nobody", "other")
	want("the head set forward", queueState{2, 14, t1, true})
	advance("acme")
	want("the head set forward again", queueState{2, 14, t1, true})
	exec("UPDATE jobs SET status = 'queued', not_before = ?, refusals = refusals + 1 WHERE id = 14", t3)
	want("a queued job's other columns change", queueState{2, 14, t1, true})

	// Outcomes of jobs in flight do not touch the tenant.
	exec("UPDATE jobs SET status = 'running' WHERE id = 12")
	exec("UPDATE jobs SET status = 'succeeded' WHERE id = 12")
	want("an outcome", queueState{2, 14, t1, true})

	// Requeue: a job back in queued keeps its queued_at and so may become the head again.
	exec("UPDATE jobs SET status = 'queued', version = version + 1 WHERE id = 11")
	want("the old head requeued", queueState{3, 11, t1, true})

	// Cancel, expiry and delete take jobs out; the head that leaves is followed by the next; with
	// none left, nothing is listed.
	exec("UPDATE jobs SET status = 'canceled' WHERE id = 11")
	exec("UPDATE jobs SET status = 'expired' WHERE id = 14")
	want("canceled and expired", queueState{1, 10, t2, true})
	exec("DELETE FROM jobs WHERE id = 10")
	want("the last queued job deleted", queueState{})

	// A head left behind by a claim stays while other jobs leave, keeps its time once its job is
	// purged, and goes with the tenant's last queued job whichever way that leaves.
	exec("INSERT INTO jobs (id, tenant, status, queued_at) VALUES (15, 'acme', 'queued', ?), (16, 'acme', 'queued', ?)", t1, t2)
	recount()
	want("two more", queueState{2, 15, t1, true})
	exec("UPDATE jobs SET status = 'dispatched' WHERE id = 15")
	want("the head claimed", queueState{1, 15, t1, true})
	exec("DELETE FROM jobs WHERE id = 15")
	want("the claimed head's row purged", queueState{1, 15, t1, true})
	exec("UPDATE jobs SET not_before = ? WHERE id = 16", t3)
	want("a queued job's not-before set", queueState{1, 15, t1, true})
	exec("UPDATE jobs SET status = 'canceled' WHERE id = 16")
	want("the last queued job canceled behind the head", queueState{})
	exec("UPDATE jobs SET status = 'queued' WHERE id IN (14, 16)")
	want("two requeued", queueState{2, 14, t1, true})
	exec("UPDATE jobs SET status = 'dispatched' WHERE id = 14")
	want("a claim", queueState{1, 14, t1, true})
	exec("DELETE FROM jobs WHERE id = 16")
	want("the last queued job deleted behind the head", queueState{})
	exec("UPDATE jobs SET status = 'queued' WHERE id = 14")
	exec("UPDATE jobs SET status = 'dispatched' WHERE id = 14")
	want("the last queued job claimed", queueState{})
	advance("acme")
	want("nothing to set forward", queueState{})
	exec("DELETE FROM jobs WHERE id = 12")
	want("a finished job deleted", queueState{})

	// Migration 0025: a job that enters dispatched stamped with the session's @sluice_claim_stamp
	// is the claim's to count (store.ClaimJobs), and the trigger leaves it alone; one stamped
	// otherwise, or claimed by a session that never set the stamp (a binary older than 0025), is
	// counted by the trigger as before. Each SET and its UPDATE share a round trip, so a session.
	exec("UPDATE jobs SET status = 'queued' WHERE id = 14")
	exec("INSERT INTO jobs (id, tenant, status, queued_at) VALUES (17, 'acme', 'queued', ?)", t2)
	recount()
	want("two queued again", queueState{2, 14, t1, true})
	exec("SET @sluice_claim_stamp = CAST(? AS DATETIME(6)); UPDATE jobs SET status = 'dispatched', claimed_at = ? WHERE id = 14", t3, t3)
	want("a claim's own job, left to the claim", queueState{2, 14, t1, true})
	exec("SET @sluice_claim_stamp = CAST(? AS DATETIME(6)); UPDATE jobs SET status = 'dispatched', claimed_at = ? WHERE id = 17", t3, t2)
	want("a job stamped otherwise", queueState{1, 14, t1, true})
	exec("UPDATE jobs SET status = 'queued' WHERE id = 17")
	want("requeued", queueState{2, 14, t1, true})
	exec("SET @sluice_claim_stamp = NULL; UPDATE jobs SET status = 'dispatched', claimed_at = ? WHERE id = 17", t3)
	want("a session without a stamp", queueState{1, 14, t1, true})
	if got := readQueueState(t, db.DB, "other"); got != (queueState{}) {
		t.Fatalf("another tenant's queue state changed: %+v", got)
	}
}

// TestTenantQueueStateLocks: a statement that moves a job into or out of queued holds its
// tenant's row until it commits (the queue state is exact under concurrency, and a claim waits
// for an admission of the same tenant), while an outcome of a job in flight does not touch the
// tenant's row at all, so recording outcomes never waits for admissions.
func TestTenantQueueStateLocks(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t)
	if _, err := db.ExecContext(ctx, `INSERT INTO tenants (tenant, created_at) VALUES ('acme', UTC_TIMESTAMP(6))`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO jobs (id, tenant, status, queued_at) VALUES
		(1, 'acme', 'queued', UTC_TIMESTAMP(6)), (2, 'acme', 'dispatched', UTC_TIMESTAMP(6))`); err != nil {
		t.Fatal(err)
	}
	if err := store.RecountQueues(ctx, db); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		stmt   string
		locked bool
	}{
		{"a claim", "UPDATE jobs SET status = 'dispatched' WHERE id = 1", true},
		{"an outcome", "UPDATE jobs SET status = 'succeeded' WHERE id = 2", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if _, err := tx.ExecContext(ctx, c.stmt); err != nil {
				t.Fatal(err)
			}
			var one int
			err = db.QueryRowContext(ctx, "SELECT 1 FROM tenants WHERE tenant = 'acme' FOR UPDATE NOWAIT").Scan(&one)
			var me *mysql.MySQLError
			held := errors.As(err, &me) && (me.Number == 1205 || me.Number == 3572)
			if err != nil && !held {
				t.Fatal(err)
			}
			if held != c.locked {
				t.Fatalf("%s: the tenant's row locked %v, want %v", c.stmt, held, c.locked)
			}
		})
	}
}

// TestAdvanceHeadsSkipsLockedTenants: AdvanceHeads never waits for a tenant's row that another
// transaction holds: it returns that tenant skipped, its head untouched, and sets the others
// forward; once the lock is gone, the skipped one goes forward too.
func TestAdvanceHeadsSkipsLockedTenants(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t)
	if _, err := db.ExecContext(ctx, `INSERT INTO tenants (tenant, created_at) VALUES
		('a', UTC_TIMESTAMP(6)), ('b', UTC_TIMESTAMP(6))`); err != nil {
		t.Fatal(err)
	}
	const t1, t2 = "2026-01-01 00:00:01.000000", "2026-01-01 00:00:02.000000"
	if _, err := db.ExecContext(ctx, `INSERT INTO jobs (id, tenant, status, queued_at) VALUES
		(1, 'a', 'queued', ?), (2, 'a', 'queued', ?), (3, 'b', 'queued', ?), (4, 'b', 'queued', ?)`, t1, t2, t1, t2); err != nil {
		t.Fatal(err)
	}
	if err := store.RecountQueues(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "UPDATE jobs SET status = 'dispatched' WHERE id IN (1, 3)"); err != nil {
		t.Fatal(err)
	}
	hold, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	if _, err := hold.ExecContext(ctx, "SELECT 1 FROM tenants WHERE tenant = 'b' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	skipped, err := store.AdvanceHeads(ctx, db.DB, []string{"b", "a"})
	if err != nil || len(skipped) != 1 || skipped[0] != "b" {
		t.Fatalf("advance with b locked: skipped %v, %v; want [b]", skipped, err)
	}
	if got := readQueueState(t, db.DB, "a"); got != (queueState{1, 2, t2, true}) {
		t.Errorf("a: %+v", got)
	}
	if got := readQueueState(t, db.DB, "b"); got != (queueState{1, 3, t1, true}) {
		t.Errorf("b, locked: %+v", got)
	}
	if err := hold.Rollback(); err != nil {
		t.Fatal(err)
	}
	if skipped, err := store.AdvanceHeads(ctx, db.DB, skipped); err != nil || len(skipped) > 0 {
		t.Fatalf("advance of b: skipped %v, %v", skipped, err)
	}
	if got := readQueueState(t, db.DB, "b"); got != (queueState{1, 4, t2, true}) {
		t.Errorf("b: %+v", got)
	}
}

// TestRecountIsTheBackfill: RecountQueues recomputes every tenant's queue state from its jobs,
// and is the statement migration 0010 ran for the jobs queued before it.
func TestRecountIsTheBackfill(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t)
	if _, err := db.ExecContext(ctx, `INSERT INTO tenants (tenant, created_at) VALUES ('acme', UTC_TIMESTAMP(6))`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO jobs (id, tenant, status, queued_at) VALUES
		(5, 'acme', 'queued', '2026-01-01 00:00:02'), (6, 'acme', 'queued', '2026-01-01 00:00:01'),
		(7, 'acme', 'running', '2026-01-01 00:00:00')`); err != nil {
		t.Fatal(err)
	}
	// A count that drifted, as a raw INSERT nobody recounted leaves it.
	if _, err := db.ExecContext(ctx, `UPDATE tenants SET queued = -3, head_id = 7, head_at = '2026-01-01 00:00:00'`); err != nil {
		t.Fatal(err)
	}
	all, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}
	var backfill string
	for _, m := range all {
		if m.Version == 10 {
			stmts := migrations.Statements(m.SQL)
			backfill = stmts[len(stmts)-1]
		}
	}
	if strings.Join(strings.Fields(backfill), " ") != strings.Join(strings.Fields(store.RecountSQL), " ") {
		t.Fatalf("migration 0010's last statement is not RecountQueues' statement:\n%s", backfill)
	}
	if err := store.RecountQueues(ctx, db); err != nil {
		t.Fatal(err)
	}
	if got, want := readQueueState(t, db.DB, "acme"), (queueState{2, 6, "2026-01-01 00:00:01.000000", true}); got != want {
		t.Fatalf("after a recount: %+v, want %+v", got, want)
	}
}

// TestRequeueBatchesTakeTenantsInOrder: two transactions that requeue jobs of the same two
// tenants, each naming them in the other's order, do not deadlock. The triggers of migration 0010
// lock a tenant's row as each job moves back to queued, so without an order, batch A (jobs 1 of
// t1, 2 of t2) holding t1 and batch B (jobs 3 of t2, 4 of t1) holding t2 would each wait for the
// other. A third transaction holding job 2 stops batch A after its first row; B runs until it
// finishes or holds t2; the hold is released and both batches must commit.
func TestRequeueBatchesTakeTenantsInOrder(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t)
	now := time.Now().UTC().Truncate(time.Microsecond)
	var rows []store.Row
	for i, tenant := range []string{"t1", "t2", "t2", "t1"} {
		rows = append(rows, dispatched(t, db, now, tenant, fmt.Sprintf("n%d", i)))
	}
	hold, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	if _, err := hold.ExecContext(ctx, "SELECT id FROM jobs WHERE id = ? FOR UPDATE", rows[1].ID); err != nil {
		t.Fatal(err)
	}
	st := &store.Store{}
	requeue := func(rs ...store.Row) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		items := make([]store.Finishing, len(rs))
		for i, r := range rs {
			items[i] = store.Finishing{Row: r, Outcome: store.Outcome{Status: job.Queued}}
		}
		if _, err := st.FinishMany(ctx, tx, now, items); err != nil {
			return err
		}
		return tx.Commit()
	}
	held := func(q string, arg any) func() (bool, error) {
		return func() (bool, error) { return db.HeldElsewhere(ctx, q, arg) }
	}
	errA, errB := make(chan error, 1), make(chan error, 1)
	go func() { errA <- requeue(rows[0], rows[1]) }()
	wait.For(t, 10*time.Second, "batch A to hold job 1", held("SELECT 1 FROM jobs WHERE id = ?", rows[0].ID))
	go func() { errB <- requeue(rows[2], rows[3]) }()
	wait.For(t, 10*time.Second, "batch B to finish or hold t2", func() (bool, error) {
		select {
		case err := <-errB:
			errB <- err
			return true, nil
		default:
		}
		return held("SELECT 1 FROM tenants WHERE tenant = ?", "t2")()
	})
	if err := hold.Rollback(); err != nil {
		t.Fatal(err)
	}
	for _, b := range []struct {
		name string
		ch   chan error
	}{{"A", errA}, {"B", errB}} {
		if err := <-b.ch; err != nil {
			t.Errorf("batch %s: %v", b.name, err)
		}
	}
	for _, tenant := range []string{"t1", "t2"} {
		if got := readQueueState(t, db.DB, tenant); got.queued != 2 {
			t.Errorf("tenant %s has %d queued, want 2", tenant, got.queued)
		}
	}
}
