package store_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
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
	if err := store.RecountQueues(ctx, db, tenant); err != nil {
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

// TestCompleteNotStartedRepeated: a not_started repeated after its requeue voided the nonce is the
// same outcome again (SPEC §6): 200 with the job as it is now, nothing written, also once the job
// was dispatched anew. Another outcome on that nonce is outcome_conflict. A not_started on a
// dispatch that something else voided (lease recovery, the drainer's own requeue) stays
// dispatch_void, and so does one whose requeue is no longer the last word on the job.
func TestCompleteNotStartedRepeated(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t)
	now := clock.Trunc(time.Now())
	notStarted := func(nonce string) store.Completion { return store.Completion{Nonce: nonce, Status: "not_started"} }
	wantCode := func(what string, err error, code job.Code) {
		t.Helper()
		if job.ErrorCode(err) != code {
			t.Errorf("%s: %v, want %s", what, err, code)
		}
	}
	outbox := func() int {
		var n int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// redispatch does what a claim does to a queued job: a new dispatch under nonce.
	redispatch := func(id int64, nonce string) {
		t.Helper()
		if _, err := db.ExecContext(ctx, `UPDATE jobs SET status = 'dispatched', version = version + 1,
			attempt = attempt + 1, dispatched_at = ?, lease_until = ?, nonce_sha256 = ?, nonce_expires_at = ?
			WHERE id = ? AND status = 'queued'`, now, now.Add(10*time.Second), store.HashNonce(nonce), now.Add(5*time.Minute), id); err != nil {
			t.Fatal(err)
		}
	}
	// requeue ends the job's dispatch as another writer than /complete would.
	requeue := func(id int64, o store.Outcome) {
		t.Helper()
		r, err := store.Get(ctx, db, id, false)
		if err != nil {
			t.Fatal(err)
		}
		tx, _ := db.BeginTx(ctx, nil)
		if _, err := (&store.Store{}).Finish(ctx, tx, now, r, o); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}

	a := dispatched(t, db, now, "t", "a1")
	first, err := complete(t, db, now, a.ID, notStarted("a1"))
	if err != nil {
		t.Fatal(err)
	}
	pokes := outbox()
	again, err := complete(t, db, now, a.ID, notStarted("a1"))
	if err != nil {
		t.Fatalf("not_started repeated: %v, want the job", err)
	}
	if again.Status != job.Queued || again.Version != first.Version || again.Position == nil || *again.Position != 1 {
		t.Errorf("not_started repeated: status %s version %d position %v; want queued, version %d, position 1",
			again.Status, again.Version, again.Position, first.Version)
	}
	if n := outbox(); n != pokes {
		t.Errorf("the repeat wrote %d outbox rows", n-pokes)
	}
	_, err = complete(t, db, now, a.ID, store.Completion{Nonce: "a1", Status: "succeeded"})
	wantCode("succeeded after not_started", err, job.CodeOutcomeConflict)

	// Dispatched anew, the old dispatch's not_started is still the same outcome again.
	redispatch(a.ID, "a2")
	if r, err := complete(t, db, now, a.ID, notStarted("a1")); err != nil || r.Status != job.Dispatched {
		t.Errorf("not_started repeated after a new dispatch: %v, %v; want the dispatched job", r.Status, err)
	}
	// Once that dispatch is voided by recovery, the nonce a1 is two dispatches old.
	requeue(a.ID, store.Outcome{Status: job.Queued, ErrorCode: "lease_expired"})
	_, err = complete(t, db, now, a.ID, notStarted("a1"))
	wantCode("not_started of a dispatch before the last requeue", err, job.CodeDispatchVoid)
	_, err = complete(t, db, now, a.ID, notStarted("a2"))
	wantCode("not_started of a dispatch voided by lease recovery", err, job.CodeDispatchVoid)

	// Voided by the drainer's requeue after the executor refused it.
	b := dispatched(t, db, now, "t", "b1")
	requeue(b.ID, store.Outcome{Status: job.Queued, ErrorCode: "executor_refused"})
	_, err = complete(t, db, now, b.ID, notStarted("b1"))
	wantCode("not_started of a dispatch the drainer requeued", err, job.CodeDispatchVoid)

	// An executor may choose any error_code for a later outcome, the marker's included: a
	// terminal job's code says nothing about how an old dispatch ended.
	c := dispatched(t, db, now, "t", "c1")
	requeue(c.ID, store.Outcome{Status: job.Queued, ErrorCode: "lease_expired"})
	redispatch(c.ID, "c2")
	if _, err := complete(t, db, now, c.ID, store.Completion{Nonce: "c2", Status: "failed", ErrorCode: store.NotStartedCode}); err != nil {
		t.Fatal(err)
	}
	_, err = complete(t, db, now, c.ID, notStarted("c1"))
	wantCode("not_started of a recovered dispatch, the job failed since", err, job.CodeDispatchVoid)
}

// TestCompleteAfterSluiceEnded: a dispatch that sluice ended rather than its executor (lost,
// failed with dispatch_failed once the budget is spent, failed because the executor answered
// 429 or 503 after the start) is void to that executor. A late /complete with either outcome
// and a late /start answer dispatch_void with the job's status, not "the same outcome again",
// outcome_conflict or nonce_used, and change nothing. An outcome the executor reported itself
// stays its own: the same again is the job, another outcome_conflict, a /start nonce_used.
func TestCompleteAfterSluiceEnded(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t)
	now := clock.Trunc(time.Now())
	inTx := func(fn func(tx *sql.Tx) error) error {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := fn(tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	start := func(id int64, nonce string) error {
		return inTx(func(tx *sql.Tx) error {
			_, err := (&store.Store{}).ConfirmStart(ctx, tx, now, id, nonce, "s-"+nonce)
			return err
		})
	}
	// void checks that err is dispatch_void naming status.
	void := func(what string, err error, status job.Status) {
		t.Helper()
		var je *job.Error
		if !errors.As(err, &je) || je.Code != job.CodeDispatchVoid || je.Detail["status"] != status {
			t.Errorf("%s: %v, want dispatch_void with status %s", what, err, status)
		}
	}
	for _, c := range []struct {
		name     string
		started  bool
		failures int
		o        store.Outcome
		want     job.Status
	}{
		{"lost", true, 0, store.Outcome{Status: job.Lost, ErrorCode: "lease_expired"}, job.Lost},
		{"budget spent", false, 2, store.Outcome{Status: job.Queued, CountFailure: true, Budget: 3, ErrorCode: "dispatch_error"}, job.Failed},
		{"429 after the start", true, 0, store.Outcome{Status: job.Failed, ErrorCode: string(job.CodeRateLimited)}, job.Failed},
		{"503 after the start", true, 0, store.Outcome{Status: job.Failed, ErrorCode: "executor_refused"}, job.Failed},
	} {
		nonce := "n-" + c.name
		r := dispatched(t, db, now, "t", nonce)
		if c.started {
			if err := start(r.ID, nonce); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := db.ExecContext(ctx, "UPDATE jobs SET dispatch_failures = ? WHERE id = ?", c.failures, r.ID); err != nil {
			t.Fatal(err)
		}
		r, err := store.Get(ctx, db, r.ID, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := inTx(func(tx *sql.Tx) error {
			to, err := (&store.Store{}).Finish(ctx, tx, now, r, c.o)
			if err == nil && to != c.want {
				t.Fatalf("%s: ended %s, want %s", c.name, to, c.want)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		ended, _ := store.Get(ctx, db, r.ID, false)
		for _, outcome := range []string{"failed", "succeeded"} {
			_, err := complete(t, db, now, r.ID, store.Completion{Nonce: nonce, Status: outcome})
			void(c.name+": late /complete "+outcome, err, c.want)
		}
		void(c.name+": late /start", start(r.ID, nonce), c.want)
		if got, _ := store.Get(ctx, db, r.ID, false); got.Status != ended.Status || got.Version != ended.Version {
			t.Errorf("%s: the late reports moved the job from %s v%d to %s v%d", c.name, ended.Status, ended.Version, got.Status, got.Version)
		}
	}

	r := dispatched(t, db, now, "t", "own")
	if err := start(r.ID, "own"); err != nil {
		t.Fatal(err)
	}
	own := store.Completion{Nonce: "own", Status: "failed", ErrorCode: "upstream_down"}
	if _, err := complete(t, db, now, r.ID, own); err != nil {
		t.Fatal(err)
	}
	if got, err := complete(t, db, now, r.ID, own); err != nil || got.Status != job.Failed {
		t.Errorf("the executor's own outcome again: %v, %v; want the failed job", got.Status, err)
	}
	if _, err := complete(t, db, now, r.ID, store.Completion{Nonce: "own", Status: "succeeded"}); job.ErrorCode(err) != job.CodeOutcomeConflict {
		t.Errorf("another outcome after the executor's own: %v, want outcome_conflict", err)
	}
	if err := start(r.ID, "own"); job.ErrorCode(err) != job.CodeNonceUsed {
		t.Errorf("/start after the executor's own outcome: %v, want nonce_used", err)
	}
}
