package publisher_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/testdb"
	"github.com/sluicehq/sluice/publisher"
)

// TestRetentionPurgesFinishedJobs proves retention_days (SPEC §9): jobs in a final state that
// finished before the retention are deleted in small batches, their idempotency keys with them;
// a job finished within it stays, however long ago it was queued; queued and in-flight jobs stay
// however old. The purger is the relay role's, driven one pass at a time on a fake clock.
func TestRetentionPurgesFinishedJobs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	now := time.Date(2030, 6, 1, 0, 0, 0, 0, time.UTC)
	old, recent := now.AddDate(0, 0, -100), now.AddDate(0, 0, -10)
	if _, err := db.ExecContext(ctx, "INSERT INTO tenants (tenant, created_at) VALUES ('acme', ?)", old); err != nil {
		t.Fatal(err)
	}
	insert := func(status string, queued time.Time, finished *time.Time, key *string) int64 {
		t.Helper()
		res, err := db.ExecContext(ctx, `INSERT INTO jobs (tenant, status, queued_at, finished_at, idempotency_key)
			VALUES ('acme', ?, ?, ?, ?)`, status, queued, finished, key)
		if err != nil {
			t.Fatal(err)
		}
		id, _ := res.LastInsertId()
		return id
	}
	key := "order-17"
	gone := map[int64]string{}
	for _, s := range []string{"succeeded", "failed", "canceled", "rejected", "lost", "expired", "succeeded"} {
		gone[insert(s, old, &old, nil)] = s
	}
	gone[insert("succeeded", old, &old, &key)] = "succeeded with a key"
	kept := map[int64]string{
		insert("queued", old, nil, nil):        "queued for 100 days",
		insert("running", old, nil, nil):       "running since 100 days",
		insert("succeeded", old, &recent, nil): "queued 100 days ago, finished 10 days ago",
		insert("failed", recent, &recent, nil): "finished 10 days ago",
		insert("succeeded", now, &now, nil):    "finished now",
		insert("dispatched", recent, nil, nil): "dispatched 10 days ago",
	}
	p, err := publisher.NewPurger(publisher.PurgerConfig{DB: db.DB, Clock: clock.NewFake(now), Batch: 3,
		Retention: func() time.Duration { return 90 * 24 * time.Hour }, Rows: "finished jobs",
		Purge: func(ctx context.Context, db *sql.DB, cutoff time.Time, limit int) (int64, error) {
			return store.PurgeSettled(ctx, db, cutoff, limit)
		}})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := p.RunOnce(ctx); err != nil || n != int64(len(gone)) {
		t.Fatalf("purged %d (%v), want the %d jobs finished 100 days ago", n, err, len(gone))
	}
	exists := func(id int64) bool {
		t.Helper()
		var n int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE id = ?", id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	for id, what := range gone {
		if exists(id) {
			t.Errorf("job %d (%s) was kept", id, what)
		}
	}
	for id, what := range kept {
		if !exists(id) {
			t.Errorf("job %d (%s) was purged", id, what)
		}
	}
	// The key is free again.
	insert("queued", now, nil, &key)
	if n, err := p.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("a second pass purged %d (%v), want nothing", n, err)
	}
}
