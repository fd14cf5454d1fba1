package store_test

import (
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// TestExpireStartDeadlines: the queued jobs past their start_by end expired with start_deadline,
// an audit event and a release poke each; a job held elsewhere, one still in time, one without a
// deadline and one no longer queued are left alone, and so are the rows it did not select.
func TestExpireStartDeadlines(t *testing.T) {
	k := newFixture(t)
	past, future := k.now.Add(-time.Second), k.now.Add(time.Hour)
	a := k.insert(jobSpec{tenant: "a", startBy: &past})
	b := k.insert(jobSpec{tenant: "b", startBy: &past})
	held := k.insert(jobSpec{tenant: "c", startBy: &past})
	inTime := k.insert(jobSpec{tenant: "a", startBy: &future})
	none := k.insert(jobSpec{tenant: "d"})
	running := k.insert(jobSpec{tenant: "d", status: job.Running, startBy: &past})
	st := &store.Store{}
	if any, err := store.StartDeadlinesPassed(k.ctx, k.db, k.now); err != nil || !any {
		t.Fatalf("StartDeadlinesPassed = %v, %v; want true", any, err)
	}
	hold := k.begin()
	if _, err := store.Get(k.ctx, hold, held, true); err != nil {
		t.Fatal(err)
	}
	tx := k.begin()
	gone, err := st.ExpireStartDeadlines(k.ctx, tx, k.now, 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(gone); !slices.Equal(got, []int64{a, b}) {
		t.Fatalf("expired %v, want %v", got, []int64{a, b})
	}
	k.wantLocked("inside the expiry", []int64{a, b, inTime, none, running}, a, b)
	k.wantTenantsLocked("inside the expiry", []string{"a", "b", "d"}, "a", "b")
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, id := range []int64{a, b} {
		r := k.row(id)
		if r.Status != job.Expired || r.ErrorCode == nil || *r.ErrorCode != store.StartDeadlineCode || r.Version != 1 || r.FinishedAt == nil {
			t.Errorf("job %d past its deadline: %+v", id, r)
		}
		if n := k.count("SELECT COUNT(*) FROM audit_events WHERE job_id = ? AND to_status = 'expired' AND error_code = 'start_deadline'", id); n != 1 {
			t.Errorf("job %d: %d audit events of its expiry", id, n)
		}
		if n := k.count("SELECT COUNT(*) FROM outbox WHERE subject LIKE '%.release.%' AND payload LIKE CONCAT('%\"job_id\":', ?, '}')", id); n != 1 {
			t.Errorf("job %d: %d release pokes", id, n)
		}
	}
	for _, id := range []int64{inTime, none} {
		if r := k.row(id); r.Status != job.Queued {
			t.Errorf("job %d: %s; want still queued", id, r.Status)
		}
	}
	// The deadlines of the jobs that ended are forgotten (a and b expired); the held job's, the
	// one in time and the running job's stay (a requeue may put it back in the queue).
	if n := k.count("SELECT COUNT(*) FROM job_deadlines WHERE job_id IN (?, ?, ?)", held, inTime, running); n != 3 || k.count("SELECT COUNT(*) FROM job_deadlines") != 3 {
		t.Errorf("deadlines left: %d of the held, the in-time and the running job's, %d in all; want those 3 only", n, k.count("SELECT COUNT(*) FROM job_deadlines"))
	}
	k.exec("UPDATE jobs SET status = 'succeeded', finished_at = ? WHERE id = ?", k.now, running)
	if _, err := st.ExpireStartDeadlines(k.ctx, k.db, k.now, 10); err != nil {
		t.Fatal(err)
	}
	if n := k.count("SELECT COUNT(*) FROM job_deadlines WHERE job_id = ?", running); n != 0 {
		t.Errorf("the deadline of a job that ran in time is kept after it ended")
	}
	if again, err := st.ExpireStartDeadlines(k.ctx, k.db, k.now, 10); err != nil || len(again) != 0 {
		t.Errorf("a second sweep with the last one held elsewhere: %v (%v)", ids(again), err)
	}
	_ = hold.Rollback()
	wantQueueState(t, k, "a", "b", "c", "d")
	if any, err := store.StartDeadlinesPassed(k.ctx, k.db, past.Add(-time.Second)); err != nil || any {
		t.Fatalf("StartDeadlinesPassed before every deadline = %v, %v; want false", any, err)
	}
}

// TestExpireStartDeadlinesPastJobsInFlight: jobs in flight past their start_by, more than a
// sweep's limit and older, do not keep a queued job past its own from expiring, and alone they
// are not "deadlines passed" (the sweep would find nothing to do).
func TestExpireStartDeadlinesPastJobsInFlight(t *testing.T) {
	k := newFixture(t)
	older, past := k.now.Add(-time.Minute), k.now.Add(-time.Second)
	for range 3 {
		k.insert(jobSpec{tenant: "busy", status: job.Running, startBy: &older})
	}
	if any, err := store.StartDeadlinesPassed(k.ctx, k.db, k.now); err != nil || any {
		t.Fatalf("with only jobs in flight past their deadlines: StartDeadlinesPassed = %v, %v; want false", any, err)
	}
	late := k.insert(jobSpec{tenant: "late", startBy: &past})
	if any, err := store.StartDeadlinesPassed(k.ctx, k.db, k.now); err != nil || !any {
		t.Fatalf("with a queued job past its deadline: StartDeadlinesPassed = %v, %v; want true", any, err)
	}
	gone, err := (&store.Store{}).ExpireStartDeadlines(k.ctx, k.db, k.now, 2)
	if err != nil || !slices.Equal(ids(gone), []int64{late}) {
		t.Fatalf("a sweep of 2 behind 3 jobs in flight expired %v (%v), want %v", ids(gone), err, []int64{late})
	}
	if n := k.count("SELECT COUNT(*) FROM job_deadlines"); n != 3 {
		t.Errorf("%d deadlines left, want the 3 of the jobs in flight", n)
	}
}

// TestClaimSkipsPassedDeadlines: a job past its start_by is never a head a pass reads, and a claim
// of one (its deadline passed between the read and the claim) does not take it.
func TestClaimSkipsPassedDeadlines(t *testing.T) {
	k := newFixture(t)
	past, future := k.now.Add(-time.Second), k.now.Add(time.Hour)
	late := k.insert(jobSpec{tenant: "a", queuedAt: k.now.Add(-3 * time.Second), startBy: &past})
	inTime := k.insert(jobSpec{tenant: "a", queuedAt: k.now.Add(-2 * time.Second), startBy: &future})
	heads, err := store.ReadHeads(k.ctx, k.db, store.HeadsParams{Now: k.now, Tenants: []store.HeadsWant{{Tenant: "a", N: 5}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(heads["a"]) != 1 || heads["a"][0].ID != inTime {
		t.Fatalf("heads %+v; want only job %d, in time", heads["a"], inTime)
	}
	tx := k.beginConn()
	if _, err := store.LockClaims(k.ctx, tx, false); err != nil {
		t.Fatal(err)
	}
	got, err := (&store.Store{}).ClaimJobs(k.ctx, tx, store.ClaimParams{DrainerID: "d9", Stamp: k.now, LeaseUntil: k.now.Add(time.Minute),
		NonceExpiresAt: k.now.Add(time.Minute), Jobs: []store.ClaimJob{
			{ID: late, Tenant: "a", NonceSHA256: store.HashNonce("n1")},
			{ID: inTime, Tenant: "a", NonceSHA256: store.HashNonce("n2")}}})
	if err != nil {
		t.Fatal(err)
	}
	if got.Got[late] || !got.Got[inTime] {
		t.Fatalf("claimed %v; want job %d and not %d, past its deadline", got.Got, inTime, late)
	}
	if r := k.row(late); r.Status != job.Queued {
		t.Fatalf("the late job: %s; want queued, for the sweep to expire", r.Status)
	}
}

// TestRecentServiceTime: the median start-to-outcome time of a tenant's last succeeded jobs
// (started_at, else dispatched_at), failed ones left out, none for a tenant without one.
func TestRecentServiceTime(t *testing.T) {
	k := newFixture(t)
	for i, d := range []time.Duration{time.Second, 3 * time.Second, 2 * time.Second} {
		id := k.insert(jobSpec{tenant: "a", status: job.Succeeded})
		start := k.now.Add(time.Duration(i) * time.Minute)
		k.exec("UPDATE jobs SET dispatched_at = ?, started_at = ?, finished_at = ? WHERE id = ?", start, start, start.Add(d), id)
	}
	// Started unconfirmed: from its dispatch, 4 s, which moves the median of four to 3 s.
	unconfirmed := k.insert(jobSpec{tenant: "a", status: job.Succeeded})
	k.exec("UPDATE jobs SET dispatched_at = ?, started_at = NULL, finished_at = ? WHERE id = ?", k.now, k.now.Add(4*time.Second), unconfirmed)
	failed := k.insert(jobSpec{tenant: "a", status: job.Failed})
	k.exec("UPDATE jobs SET dispatched_at = ?, finished_at = ? WHERE id = ?", k.now, k.now.Add(time.Hour), failed)
	if d, ok, err := store.RecentServiceTime(k.ctx, k.db, "a"); err != nil || !ok || d != 3*time.Second {
		t.Fatalf("tenant a: %v, %v, %v; want 3 s, the upper median of 1, 2, 3 and 4 s", d, ok, err)
	}
	if d, ok, err := store.RecentServiceTime(k.ctx, k.db, "b"); err != nil || ok || d != 0 {
		t.Fatalf("a tenant without jobs: %v, %v, %v; want none", d, ok, err)
	}
}
