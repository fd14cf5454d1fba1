package store_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/testdb"
)

// dispatched inserts a job already dispatched at version 1 under nonce, and returns it as read.
func dispatched(t *testing.T, db *testdb.DB, now time.Time, tenant, nonce string) store.Row {
	t.Helper()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "INSERT IGNORE INTO tenants (tenant, created_at) VALUES (?, ?)", tenant, now); err != nil {
		t.Fatal(err)
	}
	res, err := db.ExecContext(ctx, `INSERT INTO jobs (tenant, status, version, attempt, queued_at, claimed_at,
		dispatched_at, lease_until, drainer_id, nonce_sha256, nonce_expires_at)
		VALUES (?, 'dispatched', 1, 1, ?, ?, ?, ?, 'd', ?, ?)`,
		tenant, now, now, now, now.Add(10*time.Second), store.HashNonce(nonce), now.Add(5*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	id, _ := res.LastInsertId()
	r, err := store.Get(ctx, db, id, false)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// finishTx is a transaction that applies outcomes: FinishMany in a database/sql transaction,
// or FinishManyConn in a ConnTx.
type finishTx struct {
	finish   func(items []store.Finishing) ([]job.Status, error)
	commit   func() error
	rollback func()
}

func sqlFinish(ctx context.Context, tx *sql.Tx, now time.Time) finishTx {
	return finishTx{
		finish: func(items []store.Finishing) ([]job.Status, error) {
			return (&store.Store{}).FinishMany(ctx, tx, now, items)
		},
		commit:   tx.Commit,
		rollback: func() { _ = tx.Rollback() },
	}
}

func connFinish(ctx context.Context, tx *store.ConnTx, now time.Time) finishTx {
	return finishTx{
		finish: func(items []store.Finishing) ([]job.Status, error) {
			return (&store.Store{}).FinishManyConn(ctx, tx, now, items)
		},
		commit:   tx.Commit,
		rollback: tx.Close,
	}
}

// beginConn takes a ConnTx, closed when the test ends.
func beginConn(ctx context.Context, t *testing.T, db *testdb.DB) *store.ConnTx {
	t.Helper()
	tx, err := store.BeginConnTx(ctx, db.DB)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tx.Close)
	return tx
}

// TestFinishManyFences checks, for both ways of applying outcomes, that a batch whose rows moved
// on is refused as a whole (and the caller's rollback leaves everything as it was), and that a
// fresh batch writes every row and one release poke per job. The ConnTx form is tried both as
// the transaction's first statements and after a locking read, as the drainer runs it.
func TestFinishManyFences(t *testing.T) {
	begins := map[string]func(ctx context.Context, t *testing.T, db *testdb.DB, now time.Time) finishTx{
		"sql": func(ctx context.Context, t *testing.T, db *testdb.DB, now time.Time) finishTx {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tx.Rollback() })
			return sqlFinish(ctx, tx, now)
		},
		"conn": func(ctx context.Context, t *testing.T, db *testdb.DB, now time.Time) finishTx {
			return connFinish(ctx, beginConn(ctx, t, db), now)
		},
		"conn_after_lock": func(ctx context.Context, t *testing.T, db *testdb.DB, now time.Time) finishTx {
			tx := beginConn(ctx, t, db)
			res, err := tx.Query(ctx, []string{"SELECT id FROM jobs ORDER BY id FOR UPDATE"})
			if err == nil {
				err = res.Close()
			}
			if err != nil {
				t.Fatal(err)
			}
			return connFinish(ctx, tx, now)
		},
	}
	for name, begin := range begins {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testFinishManyFences(t, begin)
		})
	}
}

func testFinishManyFences(t *testing.T, begin func(ctx context.Context, t *testing.T, db *testdb.DB, now time.Time) finishTx) {
	ctx := context.Background()
	db := testdb.New(t)
	now := clock.Trunc(time.Now())
	a := dispatched(t, db, now, "t", "na")
	b := dispatched(t, db, now, "t", "nb")

	// The stale row is the second kind of transition, so the first kind's UPDATE has already
	// changed a row when the fence fails.
	stale := b
	stale.Version = 0
	tx := begin(ctx, t, db, now)
	_, err := tx.finish([]store.Finishing{
		{Row: a, Outcome: store.Outcome{Status: job.Succeeded}},
		{Row: stale, Outcome: store.Outcome{Status: job.Queued}},
	})
	if !errors.Is(err, store.ErrFenced) {
		t.Fatalf("batch with a stale row: %v, want ErrFenced", err)
	}
	tx.rollback()
	if r, _ := store.Get(ctx, db, a.ID, false); r.Status != job.Dispatched || r.Version != 1 {
		t.Fatalf("after the refused batch job %d is %s version %d, want dispatched version 1", a.ID, r.Status, r.Version)
	}
	var pokes int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox").Scan(&pokes); err != nil {
		t.Fatal(err)
	}
	if pokes != 0 {
		t.Fatalf("the refused batch left %d outbox rows", pokes)
	}

	tx = begin(ctx, t, db, now)
	to, err := tx.finish([]store.Finishing{
		{Row: a, Outcome: store.Outcome{Status: job.Succeeded, Result: []byte(`{"ok":true}`)}},
		{Row: b, Outcome: store.Outcome{Status: job.Queued, CountFailure: true, Budget: 3}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.commit(); err != nil {
		t.Fatal(err)
	}
	tx.rollback() // after a commit: nothing to undo, and the connection goes back
	if to[0] != job.Succeeded || to[1] != job.Queued {
		t.Errorf("ended as %v", to)
	}
	ra, _ := store.Get(ctx, db, a.ID, false)
	rb, _ := store.Get(ctx, db, b.ID, false)
	if ra.Status != job.Succeeded || ra.Version != 2 || ra.StartedAt == nil || string(ra.Result) != `{"ok":true}` {
		t.Errorf("succeeded job: %+v", ra.Job)
	}
	if rb.Status != job.Queued || rb.Version != 2 || rb.DispatchFailures != 1 || rb.NonceSHA256 != nil || rb.VoidedNonce == nil {
		t.Errorf("requeued job: status %s version %d failures %d nonce %x voided %x", rb.Status, rb.Version, rb.DispatchFailures, rb.NonceSHA256, rb.VoidedNonce)
	}
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox").Scan(&pokes); err != nil {
		t.Fatal(err)
	}
	if pokes != 3 { // two releases and the requeued job's enqueue
		t.Errorf("%d outbox rows, want 3", pokes)
	}

	// The voided nonce now answers dispatch_void, a foreign one on a queued job too.
	stx, _ := db.BeginTx(ctx, nil)
	_, err = (&store.Store{}).ConfirmStart(ctx, stx, now, b.ID, "nb", "")
	_ = stx.Rollback()
	if job.ErrorCode(err) != job.CodeDispatchVoid {
		t.Errorf("confirming a voided dispatch: %v, want dispatch_void", err)
	}
}

// TestFinishManyCommit: FinishManyCommit writes and commits in one call (another connection
// sees the outcome at once, and closing the transaction undoes nothing), and a row that moved
// anyway is reported as ErrFencedCommitted, an ErrFenced, with the rest of the batch committed.
func TestFinishManyCommit(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t)
	now := clock.Trunc(time.Now())
	a := dispatched(t, db, now, "t", "na")
	b := dispatched(t, db, now, "t", "nb")
	st := &store.Store{}

	tx := beginConn(ctx, t, db)
	if _, err := store.LockJobs(ctx, tx, []int64{a.ID}); err != nil {
		t.Fatal(err)
	}
	to, err := st.FinishManyCommit(ctx, tx, now, []store.Finishing{{Row: a, Outcome: store.Outcome{Status: job.Succeeded}}})
	if err != nil || len(to) != 1 || to[0] != job.Succeeded {
		t.Fatalf("finish and commit: %v, %v", to, err)
	}
	tx.Close()
	if r, _ := store.Get(ctx, db, a.ID, false); r.Status != job.Succeeded || r.Version != 2 {
		t.Fatalf("after FinishManyCommit and Close job %d is %s version %d, want succeeded version 2", a.ID, r.Status, r.Version)
	}

	stale := b
	stale.Version = 0
	c := dispatched(t, db, now, "t", "nc")
	tx = beginConn(ctx, t, db)
	_, err = st.FinishManyCommit(ctx, tx, now, []store.Finishing{
		{Row: c, Outcome: store.Outcome{Status: job.Succeeded}},
		{Row: stale, Outcome: store.Outcome{Status: job.Queued}},
	})
	if !errors.Is(err, store.ErrFencedCommitted) || !errors.Is(err, store.ErrFenced) {
		t.Fatalf("batch with a stale row: %v, want ErrFencedCommitted", err)
	}
	tx.Close()
	if r, _ := store.Get(ctx, db, c.ID, false); r.Status != job.Succeeded {
		t.Errorf("the batch's fresh job is %s after ErrFencedCommitted, want succeeded (committed)", r.Status)
	}
	if r, _ := store.Get(ctx, db, b.ID, false); r.Status != job.Dispatched || r.Version != 1 {
		t.Errorf("the stale job is %s version %d, want dispatched version 1, untouched", r.Status, r.Version)
	}
}

// TestFinishManyOwnValues: a batch whose jobs end with different values (results, states,
// error codes, not-befores, counts) writes each job its own, and one whose jobs all end alike
// writes them all the same (the UPDATE binds one value instead of a branch per job).
func TestFinishManyOwnValues(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t)
	now := clock.Trunc(time.Now())
	var rows []store.Row
	for i := range 7 {
		rows = append(rows, dispatched(t, db, now, "t", fmt.Sprint("n", i)))
	}
	soon, later := now.Add(time.Minute), now.Add(time.Hour)
	items := []store.Finishing{
		{Row: rows[0], Outcome: store.Outcome{Status: job.Succeeded, Result: []byte(`{"a":1}`)}},
		{Row: rows[1], Outcome: store.Outcome{Status: job.Succeeded, Result: []byte(`{"b":2}`)}},
		{Row: rows[2], Outcome: store.Outcome{Status: job.Failed, Reported: true, ErrorCode: "boom", ErrorMessage: "it broke"}},
		{Row: rows[3], Outcome: store.Outcome{Status: job.Queued, CountFailure: true, Budget: 5, NotBefore: &soon}},
		{Row: rows[4], Outcome: store.Outcome{Status: job.Queued, CountRefusal: true, NotBefore: &later}},
		{Row: rows[5], Outcome: store.Outcome{Status: job.Lost, ErrorCode: "outcome_unknown", ErrorMessage: "same"}},
		{Row: rows[6], Outcome: store.Outcome{Status: job.Lost, ErrorCode: "outcome_unknown", ErrorMessage: "same"}},
	}
	tx := beginConn(ctx, t, db)
	if _, err := store.LockJobs(ctx, tx, []int64{rows[0].ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := (&store.Store{}).FinishManyCommit(ctx, tx, now, items); err != nil {
		t.Fatal(err)
	}
	type want struct {
		status           job.Status
		result, code     string
		failures, refuse int
		notBefore        *time.Time
	}
	wants := []want{
		{status: job.Succeeded, result: `{"a":1}`},
		{status: job.Succeeded, result: `{"b":2}`},
		{status: job.Failed, code: "boom"},
		{status: job.Queued, failures: 1, notBefore: &soon},
		{status: job.Queued, refuse: 1, notBefore: &later},
		{status: job.Lost, code: "outcome_unknown"},
		{status: job.Lost, code: "outcome_unknown"},
	}
	for i, w := range wants {
		r, err := store.Get(ctx, db, rows[i].ID, false)
		if err != nil {
			t.Fatal(err)
		}
		code := ""
		if r.ErrorCode != nil {
			code = *r.ErrorCode
		}
		nbOK := (w.notBefore == nil) == (r.NotBefore == nil) && (w.notBefore == nil || r.NotBefore.Equal(*w.notBefore))
		if r.Status != w.status || string(r.Result) != w.result || code != w.code || r.DispatchFailures != w.failures ||
			r.Refusals != w.refuse || !nbOK {
			t.Errorf("job %d: %s result %q code %q failures %d refusals %d not_before %v; want %+v", i, r.Status, r.Result, code,
				r.DispatchFailures, r.Refusals, r.NotBefore, w)
		}
	}
}

// TestFinishBudget: a requeue that would spend past the dispatch budget fails the job with
// dispatch_failed and no start.
func TestFinishBudget(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t)
	now := clock.Trunc(time.Now())
	r := dispatched(t, db, now, "t", "n")
	r.DispatchFailures = 2
	if _, err := db.ExecContext(ctx, "UPDATE jobs SET dispatch_failures = 2 WHERE id = ?", r.ID); err != nil {
		t.Fatal(err)
	}
	tx, _ := db.BeginTx(ctx, nil)
	to, err := (&store.Store{}).Finish(ctx, tx, now, r, store.Outcome{Status: job.Queued, CountFailure: true, Budget: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	got, _ := store.Get(ctx, db, r.ID, false)
	if to != job.Failed || got.ErrorCode == nil || *got.ErrorCode != string(job.CodeDispatchFailed) || got.StartedAt != nil {
		t.Errorf("ended %s with %v, started %v; want failed dispatch_failed, never started", to, got.ErrorCode, got.StartedAt)
	}
}

// TestExecCommit: ExecCommit commits with its statements and reports their insert ids, not
// COMMIT's; a failing statement stops the round trip before COMMIT, and Close rolls back what the
// statements before it wrote.
func TestExecCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	insert := "INSERT INTO outbox (subject, payload, created_at) VALUES ('s', 'p', UTC_TIMESTAMP(6))"
	tx := beginConn(ctx, t, db)
	res, err := tx.Query(ctx, []string{"SELECT 1"}) // begins the transaction
	if err == nil {
		err = res.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	r, err := tx.ExecCommit(ctx, []string{insert, insert + ", ('s', 'p', UTC_TIMESTAMP(6))"})
	if err != nil {
		t.Fatal(err)
	}
	ids, affected := r.AllLastInsertIds(), r.AllRowsAffected()
	last, _ := r.LastInsertId()
	n, _ := r.RowsAffected()
	// The first id of each INSERT: the first and second rows (ids on the server's
	// auto_increment_increment, not always 1 and 2).
	var firstRow, secondRow int64
	if err := db.QueryRowContext(ctx, "SELECT MIN(id), (SELECT id FROM outbox ORDER BY id LIMIT 1 OFFSET 1) FROM outbox").
		Scan(&firstRow, &secondRow); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprint([]int64{firstRow, secondRow}, []int64{1, 2}, secondRow, 2); fmt.Sprint(ids, affected, last, n) != want {
		t.Errorf("ids %v, rows affected %v, last id %d, last rows %d; want %s", ids, affected, last, n, want)
	}
	tx.Close() // nothing to roll back
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox").Scan(&n); err != nil || n != 3 {
		t.Fatalf("%d outbox rows after the commit (%v), want 3", n, err)
	}

	tx = beginConn(ctx, t, db)
	if _, err := tx.ExecCommit(ctx, []string{insert, "INSERT INTO no_such_table VALUES (1)"}); err == nil {
		t.Fatal("a failing statement: no error")
	}
	tx.Close()
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox").Scan(&n); err != nil || n != 3 {
		t.Errorf("%d outbox rows after a round trip that failed before COMMIT (%v), want 3", n, err)
	}
}
