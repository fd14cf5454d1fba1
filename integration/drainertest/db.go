package drainertest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/testdb"
)

// NewDB returns a test database of its own (testdb.New) whose runtime config edit changed, a
// fake clock and the clock's time: the start of a test that drives a drainer's passes itself, on
// a clock it advances.
func NewDB(t *testing.T, edit func(*config.Config)) (*testdb.DB, *clock.Fake, time.Time) {
	t.Helper()
	db := testdb.New(t)
	clk := clock.NewFake(time.Now())
	now, _ := clk.Now(context.Background())
	testdb.SetLimits(t, db.DB, edit)
	return db, clk, now
}

// QueueJobs creates tenants tenants (t0, t1, ...) and jobs queued jobs spread evenly over them,
// in multi-row INSERTs of at most 100,000 rows, the oldest job first in each tenant, and recounts
// the queues (a raw INSERT is not counted as admission counts its jobs): a backlog for a drainer
// to drain, in seconds even when it is large.
func QueueJobs(tb testing.TB, db *testdb.DB, tenants, jobs int) {
	tb.Helper()
	ctx := context.Background()
	for off := 0; off < tenants; off += 100_000 {
		if _, err := db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO tenants (tenant, created_at)
			SELECT CONCAT('t', seq), UTC_TIMESTAMP(6) FROM seq_%d_to_%d`, off, min(off+100_000, tenants)-1)); err != nil {
			tb.Fatal(err)
		}
	}
	for off := 0; off < jobs; off += 100_000 {
		if _, err := db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO jobs (tenant, status, queued_at)
			SELECT CONCAT('t', seq %% %d), 'queued', UTC_TIMESTAMP(6) FROM seq_%d_to_%d`, tenants, off, min(off+100_000, jobs)-1)); err != nil {
			tb.Fatal(err)
		}
	}
	db.RecountQueues(tb)
}

// PeakInFlight replays the audit trail's transitions (SPEC §10) in the order they were written
// and returns the most jobs it ever had in flight, so that a test can check a drain kept to its
// cap. Every claim and every outcome is counted, after the drain, so the check is exact and
// costs the drain nothing. (A sampler that counted the jobs in flight every 5 ms during the
// drain read about 50 pages per drained job, a quarter of the server's page reads, walking the
// claim index entries that the drain delete-marks.) Each row is stamped with its statement's
// time on the database clock: a claim that counted a slot freed by an outcome read the counts
// after that outcome committed, so its rows come after the outcome's, and a replay can only
// count too few in flight when it errs, never too many.
func PeakInFlight(tb testing.TB, db *testdb.DB) int64 {
	tb.Helper()
	var peak int64
	if err := db.QueryRowContext(context.Background(), `SELECT COALESCE(MAX(n), 0) FROM (
		SELECT SUM(CASE WHEN from_status = 'queued' AND to_status IN ('claimed','dispatched','running') THEN 1
			WHEN from_status IN ('claimed','dispatched','running') AND to_status NOT IN ('claimed','dispatched','running') THEN -1
			ELSE 0 END) OVER (ORDER BY at, id) AS n
		FROM audit_events WHERE event = 'transition') replay`).Scan(&peak); err != nil {
		tb.Fatal(err)
	}
	return peak
}
