package drainertest

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/testdb"
)

// QueueOneJob writes one queued job of tenant acme, queued at, as admission would, and returns
// its id.
func QueueOneJob(t *testing.T, db *testdb.DB, at time.Time) int64 {
	t.Helper()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "INSERT IGNORE INTO tenants (tenant, created_at) VALUES ('acme', ?)", at); err != nil {
		t.Fatal(err)
	}
	res, err := db.ExecContext(ctx, "INSERT INTO jobs (tenant, status, queued_at) VALUES ('acme', 'queued', ?)", at)
	if err != nil {
		t.Fatal(err)
	}
	db.RecountQueues(t, "acme")
	id, err := res.LastInsertId()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// QueryIDs returns the ids that q (a SELECT of one integer column) reads, in its order.
func QueryIDs(tb testing.TB, db *sql.DB, q string, args ...any) []int64 {
	tb.Helper()
	rows, err := db.QueryContext(context.Background(), q, args...)
	if err != nil {
		tb.Fatal(err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			tb.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	return ids
}

// JobTimes is a job's status and the times of its way through the queue, as ReadJob reads them.
type JobTimes struct {
	Status     string
	Queued     time.Time
	Dispatched sql.NullTime
	Started    sql.NullTime
}

// ReadJob reads job id's status, queued_at, dispatched_at and started_at.
func ReadJob(t *testing.T, db *sql.DB, id int64) JobTimes {
	t.Helper()
	var j JobTimes
	if err := db.QueryRow("SELECT status, queued_at, dispatched_at, started_at FROM jobs WHERE id = ?", id).
		Scan(&j.Status, &j.Queued, &j.Dispatched, &j.Started); err != nil {
		t.Fatal(err)
	}
	return j
}

// JobStatus reads job id's status.
func JobStatus(t *testing.T, db *testdb.DB, id int64) string {
	t.Helper()
	var s string
	if err := db.QueryRowContext(context.Background(), "SELECT status FROM jobs WHERE id = ?", id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// CheckTenantQueueState fails unless every tenant's queue state (migrations/0010: queued count
// and oldest queued job, kept by triggers) agrees with what its jobs say: the head no later
// than the oldest queued job, and that job itself once the heads are set forward, which it does.
func CheckTenantQueueState(t *testing.T, ctx context.Context, db *sql.DB, when string) {
	t.Helper()
	tenants := CheckQueueState(t, ctx, db, when, false)
	// Claims leave their tenants' heads behind (migration 0018) until an advance sets them
	// forward: then they are exact.
	if skipped, err := store.AdvanceHeads(ctx, db, tenants); err != nil || len(skipped) > 0 {
		t.Fatalf("%s: advance: skipped %v, %v", when, skipped, err)
	}
	CheckQueueState(t, ctx, db, when+", heads set forward", true)
}

// CheckQueueState checks every tenant's queue state against its jobs: the count exact, listed
// exactly when it has queued jobs, its head NULL exactly then, and otherwise no later than its
// oldest queued job in (queued_at, id) order, or that job itself when exact. It returns the
// tenants.
func CheckQueueState(t *testing.T, ctx context.Context, db *sql.DB, when string, exact bool) []string {
	t.Helper()
	rows, err := db.QueryContext(ctx, `SELECT t.tenant, t.queued, COALESCE(t.head_id, 0), COALESCE(t.head_at, ''),
		(SELECT COUNT(*) FROM jobs j WHERE j.tenant = t.tenant AND j.status = 'queued'),
		COALESCE((SELECT j.id FROM jobs j WHERE j.tenant = t.tenant AND j.status = 'queued' ORDER BY j.queued_at, j.id LIMIT 1), 0),
		COALESCE((SELECT j.queued_at FROM jobs j WHERE j.tenant = t.tenant AND j.status = 'queued' ORDER BY j.queued_at, j.id LIMIT 1), ''),
		COALESCE(t.work_tenant = t.tenant, 0)
		FROM tenants t`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var tenants []string
	for rows.Next() {
		var tenant, headAt, wantAt string
		var queued, want, headID, wantID int64
		var listed bool
		if err := rows.Scan(&tenant, &queued, &headID, &headAt, &want, &wantID, &wantAt, &listed); err != nil {
			t.Fatal(err)
		}
		tenants = append(tenants, tenant)
		// DATETIME(6) as text: fixed width, so its order is the time's.
		behind := headAt < wantAt || (headAt == wantAt && headID <= wantID)
		ok := (headID == 0) == (want == 0) && (headAt == "") == (want == 0) && behind
		if exact {
			ok = headID == wantID && headAt == wantAt
		}
		if !ok || queued != want || listed != (want > 0) {
			t.Fatalf("%s: tenant %q's queue state is queued=%d head=%d@%s listed=%v; its jobs say queued=%d head=%d@%s",
				when, tenant, queued, headID, headAt, listed, want, wantID, wantAt)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return tenants
}
