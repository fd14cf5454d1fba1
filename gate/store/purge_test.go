package store_test

import (
	"context"
	"database/sql"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/testdb"
)

// TestFirstQueuedSince checks the bound PurgeSettled walks under against a brute-force query,
// for cutoffs before, among and after 600 jobs with gaps that deletes left, and on an empty table.
func TestFirstQueuedSince(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if got, err := store.FirstQueuedSince(ctx, db, start); err != nil || got != 0 {
		t.Fatalf("empty table: %d, %v; want 0", got, err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO tenants (tenant, created_at) VALUES ('acme', ?)", start); err != nil {
		t.Fatal(err)
	}
	q := "INSERT INTO jobs (tenant, status, queued_at) VALUES "
	var args []any
	for i := range 600 {
		if i > 0 {
			q += ","
		}
		q += "('acme', 'queued', ?)"
		args = append(args, start.Add(time.Duration(i)*time.Minute))
	}
	if _, err := db.ExecContext(ctx, q, args...); err != nil {
		t.Fatal(err)
	}
	// Gaps: a run at the start, one in the middle, one at the end, and every seventh job.
	if _, err := db.ExecContext(ctx, `DELETE FROM jobs WHERE queued_at < ? OR queued_at BETWEEN ? AND ?
		OR queued_at >= ? OR id % 7 = 0`, start.Add(40*time.Minute), start.Add(200*time.Minute),
		start.Add(330*time.Minute), start.Add(580*time.Minute)); err != nil {
		t.Fatal(err)
	}
	var maxID int64
	if err := db.QueryRowContext(ctx, "SELECT MAX(id) FROM jobs").Scan(&maxID); err != nil {
		t.Fatal(err)
	}
	for m := -5; m <= 610; m += 3 {
		cutoff := start.Add(time.Duration(m) * time.Minute)
		var want sql.NullInt64
		if err := db.QueryRowContext(ctx, "SELECT MIN(id) FROM jobs WHERE queued_at >= ?", cutoff).Scan(&want); err != nil {
			t.Fatal(err)
		}
		if !want.Valid {
			want.Int64 = maxID + 1
		}
		got, err := store.FirstQueuedSince(ctx, db, cutoff)
		if err != nil {
			t.Fatal(err)
		}
		// Any id between the true first one and the bound returned must be a gap.
		var between int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE id >= LEAST(?, ?) AND id < GREATEST(?, ?)",
			got, want.Int64, got, want.Int64).Scan(&between); err != nil {
			t.Fatal(err)
		}
		if between != 0 || got == 0 {
			t.Fatalf("cutoff at minute %d: bound %d, first job queued since %d, %d jobs between", m, got, want.Int64, between)
		}
	}
}

// TestPurgeSettledPrunesEmptiedTenants: a purge deletes the tenants row of a tenant whose last
// job it deleted, and keeps tenants that still have a job (queued, or finished after the cutoff).
func TestPurgeSettledPrunesEmptiedTenants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	old := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	cutoff := old.Add(24 * time.Hour)
	recent := cutoff.Add(time.Hour)
	if _, err := db.ExecContext(ctx, `INSERT INTO tenants (tenant, created_at) VALUES
		('gone', ?), ('waiting', ?), ('recent', ?), ('untouched', ?)`, old, old, old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO jobs (tenant, status, queued_at, finished_at) VALUES
		('gone', 'succeeded', ?, ?), ('gone', 'rejected', ?, ?),
		('waiting', 'succeeded', ?, ?), ('waiting', 'queued', ?, NULL),
		('recent', 'succeeded', ?, ?), ('recent', 'failed', ?, ?)`,
		old, old, old, old, old, old, old, old, old, old, recent); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO tenant_time (tenant, used, used_at) VALUES
		('gone', 1, ?), ('waiting', 1, ?), ('untouched', 1, ?)`, old, old, old); err != nil {
		t.Fatal(err)
	}
	n, err := store.PurgeSettled(ctx, db, cutoff, 100)
	if err != nil {
		t.Fatal(err)
	}
	if n != 4 {
		t.Fatalf("purged %d jobs, want 4", n)
	}
	rows, err := db.QueryContext(ctx, "SELECT tenant FROM tenants ORDER BY tenant")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var left []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		left = append(left, s)
	}
	// untouched has no job and none was purged: a purge looks only at the tenants of its batch.
	if want := []string{"recent", "untouched", "waiting"}; !slices.Equal(left, want) {
		t.Fatalf("tenants left %q, want %q", left, want)
	}
	// The time used (ordering fair_time) of the tenant purged goes with it.
	var charged int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM tenant_time WHERE tenant IN ('waiting', 'untouched')").Scan(&charged); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM tenant_time").Scan(&n); err != nil || n != 2 || charged != 2 {
		t.Errorf("tenant_time rows left %d (%v), want waiting's and untouched's", n, err)
	}
}

// TestPurgeSettledStepsOverScheduledJobs: a job scheduled for later, admitted before jobs that
// finished before the cutoff, does not stop the purge at its id (its queued_at is its due time).
func TestPurgeSettledStepsOverScheduledJobs(t *testing.T) {
	t.Parallel()
	ctx, db, old, cutoff := purgeAcme(t)
	due := cutoff.Add(30 * 24 * time.Hour)
	// Ids 1-3 and 5-7 finished, 4 scheduled: the search's first probe (id 4) meets it. The ids
	// are given, so that a server's id step (Galera) does not move the probe.
	for id := int64(1); id <= 7; id++ {
		q, args := `INSERT INTO jobs (id, tenant, status, queued_at, finished_at) VALUES (?, 'acme', 'succeeded', ?, ?)`, []any{id, old, old}
		if id == 4 {
			q, args = `INSERT INTO jobs (id, tenant, status, queued_at, not_before) VALUES (?, 'acme', 'queued', ?, ?)`, []any{id, due, due}
		}
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	// Replace keys: one names a finished job (purged with it), one the scheduled job (kept).
	key1, key2 := "k1", "k2"
	if err := store.RecordJobKeys(ctx, db, []store.JobKeys{{ID: 1, Tenant: "acme", ReplaceKey: &key1}, {ID: 4, Tenant: "acme", ReplaceKey: &key2}}); err != nil {
		t.Fatal(err)
	}
	if n, err := store.PurgeSettled(ctx, db, cutoff, 100); err != nil || n != 6 {
		t.Fatalf("purged %d (%v); want the 6 finished jobs, beyond the scheduled one", n, err)
	}
	var left []int64
	rows, err := db.QueryContext(ctx, "SELECT job_id FROM replace_keys")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		left = append(left, id)
	}
	if !slices.Equal(left, []int64{4}) {
		t.Fatalf("replace keys left %v; want only the scheduled job's (4)", left)
	}
}

// TestPurgeSettledTakesRedriveLinks: a redrive purged takes its link in job_redrives (migration
// 0027) with it; the link of a redrive still queued stays, though the job it redrove is gone.
func TestPurgeSettledTakesRedriveLinks(t *testing.T) {
	t.Parallel()
	ctx, db, old, cutoff := purgeAcme(t)
	// 1 failed and was redriven as 2, which failed and was redriven as 3, still queued.
	if _, err := db.ExecContext(ctx, `INSERT INTO jobs (id, tenant, status, queued_at, finished_at, retry_of) VALUES
		(1, 'acme', 'failed', ?, ?, NULL), (2, 'acme', 'failed', ?, ?, 1), (3, 'acme', 'queued', ?, NULL, 2)`,
		old, old, old, old, old); err != nil {
		t.Fatal(err)
	}
	one, two := int64(1), int64(2)
	if err := store.RecordJobKeys(ctx, db, []store.JobKeys{{ID: 2, Tenant: "acme", RetryOf: &one}, {ID: 3, Tenant: "acme", RetryOf: &two}}); err != nil {
		t.Fatal(err)
	}
	if n, err := store.PurgeSettled(ctx, db, cutoff, 100); err != nil || n != 2 {
		t.Fatalf("purged %d (%v); want the 2 failed jobs", n, err)
	}
	var retryOf, jobID int64
	if err := db.QueryRowContext(ctx, "SELECT retry_of, job_id FROM job_redrives").Scan(&retryOf, &jobID); err != nil {
		t.Fatalf("job_redrives: %v; want one link left", err)
	}
	if retryOf != 2 || jobID != 3 {
		t.Fatalf("link left %d → %d; want the queued redrive's, 2 → 3", retryOf, jobID)
	}
}

// purgeAcme is a database of its own with the tenant acme, created at old, a day before cutoff:
// jobs finished at old are past the purge's cutoff.
func purgeAcme(t *testing.T) (ctx context.Context, db *testdb.DB, old, cutoff time.Time) {
	t.Helper()
	ctx, db = context.Background(), testdb.New(t)
	old = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, err := db.ExecContext(ctx, `INSERT INTO tenants (tenant, created_at) VALUES ('acme', ?)`, old); err != nil {
		t.Fatal(err)
	}
	return ctx, db, old, old.Add(24 * time.Hour)
}
