package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer/store"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/integration/testdb"
)

// complete runs Complete of id in a transaction of its own, committed if it succeeded.
func complete(t *testing.T, db *testdb.DB, now time.Time, id int64, c store.Completion) (store.Row, error) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, _, err := (&store.Store{}).Complete(ctx, tx, now, id, c)
	if err != nil {
		_ = tx.Rollback()
		return r, err
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return r, nil
}

// queuedAt inserts a queued job of tenant queued at at.
func queuedAt(t *testing.T, db *testdb.DB, tenant string, at time.Time) int64 {
	t.Helper()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "INSERT IGNORE INTO tenants (tenant, created_at) VALUES (?, ?)", tenant, at); err != nil {
		t.Fatal(err)
	}
	res, err := db.ExecContext(ctx, "INSERT INTO jobs (tenant, status, queued_at) VALUES (?, 'queued', ?)", tenant, at)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := res.LastInsertId()
	return id
}

// TestCompleteNotStartedPosition: a job that not_started puts back in the queue is returned with
// its position among its tenant's queued jobs, which it keeps by its original queued_at.
func TestCompleteNotStartedPosition(t *testing.T) {
	db := testdb.New(t)
	now := clock.Trunc(time.Now())
	r := dispatched(t, db, now.Add(-time.Minute), "t", "n") // queued a minute ago
	queuedAt(t, db, "t", now.Add(-2*time.Minute))
	queuedAt(t, db, "t", now.Add(-time.Second))
	queuedAt(t, db, "other", now.Add(-time.Hour))
	got, err := complete(t, db, now, r.ID, store.Completion{Nonce: "n", Status: "not_started"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != job.Queued || got.Position == nil || *got.Position != 2 {
		t.Errorf("not_started: status %s, position %v; want queued at position 2", got.Status, got.Position)
	}
}
