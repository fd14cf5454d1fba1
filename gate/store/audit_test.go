package store_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/testdb"
)

func ptr[T any](v T) *T { return &v }

// TestAuditReadAndPurge writes events of every column, reads them back by job and by each
// filter of ListAudit, pages with Before, and purges by age in batches.
func TestAuditReadAndPurge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	if err := store.InsertAudit(ctx, db, nil); err != nil {
		t.Fatalf("no events: %v", err)
	}
	full := store.AuditEvent{Event: store.EventRefused, Tenant: "acme", JobID: ptr(int64(7)), SlotID: ptr("s1"),
		Actor: "ops", From: "queued", To: "rejected", Version: ptr(int64(2)), Attempt: ptr(1), ErrorCode: "queue_full",
		Scope: "tenant", Detail: json.RawMessage(`{"cap":2}`)}
	events := []store.AuditEvent{full,
		{Event: store.EventAdmitted, Tenant: "acme", JobID: ptr(int64(7))},
		{Event: store.EventAdmitted, Tenant: "globex"}}
	if err := store.InsertAudit(ctx, db, events); err != nil {
		t.Fatal(err)
	}
	got, err := store.JobEvents(ctx, db, 7, 10)
	if err != nil || len(got) != 2 {
		t.Fatalf("JobEvents: %v, %v; want 2", got, err)
	}
	g := got[0]
	if g.Event != full.Event || g.Tenant != "acme" || *g.JobID != 7 || *g.SlotID != "s1" || g.Actor != "ops" ||
		g.From != "queued" || g.To != "rejected" || *g.Version != 2 || *g.Attempt != 1 || g.ErrorCode != "queue_full" ||
		g.Scope != "tenant" || string(g.Detail) != `{"cap":2}` || g.At.IsZero() || g.At.Location() != time.UTC {
		t.Errorf("read back %+v, want %+v", g, full)
	}
	future := time.Now().Add(time.Hour)
	for _, c := range []struct {
		f    store.AuditFilter
		want int
	}{
		{store.AuditFilter{Limit: 10}, 3},
		{store.AuditFilter{Tenant: ptr("acme"), Limit: 10}, 2},
		{store.AuditFilter{Event: store.EventAdmitted, Limit: 10}, 2},
		{store.AuditFilter{Since: &future, Limit: 10}, 0},
		{store.AuditFilter{Before: got[1].ID, Limit: 10}, 1},
		{store.AuditFilter{Limit: 1}, 1},
		{store.AuditFilter{Tenant: ptr("acme"), Event: store.EventRefused, Limit: 10}, 1},
		{store.AuditFilter{Event: store.EventAdmitted, Before: got[0].ID, Limit: 10}, 0},
	} {
		page, err := store.ListAudit(ctx, db, c.f)
		list := page.Events
		if err != nil || len(list) != c.want || page.Next != 0 {
			t.Errorf("ListAudit(%+v) = %d events, next %d, %v; want %d, no next", c.f, len(list), page.Next, err, c.want)
		}
		for i := 1; i < len(list); i++ {
			if list[i].ID >= list[i-1].ID {
				t.Errorf("ListAudit(%+v) not newest first: %v", c.f, list)
			}
		}
	}
	if _, err := db.ExecContext(ctx, "UPDATE audit_events SET at = at - INTERVAL 40 DAY WHERE tenant = 'acme'"); err != nil {
		t.Fatal(err)
	}
	cutoff := time.Now().Add(-30 * 24 * time.Hour)
	for _, want := range []int64{1, 1, 0} {
		if n, err := store.PurgeAudit(ctx, db, cutoff, 1); err != nil || n != want {
			t.Errorf("PurgeAudit: %d, %v; want %d", n, err, want)
		}
	}
	if page, _ := store.ListAudit(ctx, db, store.AuditFilter{Limit: 10}); len(page.Events) != 1 || page.Events[0].Tenant != "globex" {
		t.Errorf("after the purge: %v, want globex's event only", page.Events)
	}
}

// TestAuditBoundedReads: with more than AuditScanRows events, a listing by a rare event, by a
// tenant or by since examines one window of them per call and says where it goes on; the purge
// deletes the old events among the first ids it reads, and never a young one, even one of a lower
// id.
func TestAuditBoundedReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	// The rare event is the oldest; then AuditScanRows + 10 admissions, 5 of them of tenant t1.
	if err := store.InsertAudit(ctx, db, []store.AuditEvent{{Event: store.EventRefused, Tenant: "t1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO audit_events (event, tenant)
		SELECT 'admitted', IF(seq % 2000 = 0, 't1', 't2') FROM seq_1_to_10010`); err != nil {
		t.Fatal(err)
	}
	var rare int64
	if err := db.QueryRowContext(ctx, "SELECT MIN(id) FROM audit_events").Scan(&rare); err != nil {
		t.Fatal(err)
	}
	first, err := store.ListAudit(ctx, db, store.AuditFilter{Event: store.EventRefused, Limit: 10})
	if err != nil || len(first.Events) != 0 || first.Next == 0 {
		t.Fatalf("first window: %d events, next %d, %v; want none and a next", len(first.Events), first.Next, err)
	}
	second, err := store.ListAudit(ctx, db, store.AuditFilter{Event: store.EventRefused, Before: first.Next, Limit: 10})
	if err != nil || len(second.Events) != 1 || second.Events[0].ID != rare || second.Next != 0 {
		t.Errorf("second window: %+v, %v; want the refusal and the end", second, err)
	}
	past := time.Now().Add(-time.Hour)
	if page, err := store.ListAudit(ctx, db, store.AuditFilter{Since: &past, Limit: 3}); err != nil || len(page.Events) != 3 || page.Next != 0 {
		t.Errorf("since, a full page: %d events, next %d, %v; want 3 (the next page by its last id)", len(page.Events), page.Next, err)
	}
	// A tenant is a filter like the others (migration 0017 dropped its index): the first window
	// holds t1's five admissions and says where to go on; the next holds its refusal, the end.
	t1 := store.AuditFilter{Tenant: ptr("t1"), Limit: 10}
	if page, err := store.ListAudit(ctx, db, t1); err != nil || len(page.Events) != 5 || page.Next == 0 {
		t.Fatalf("t1's first window: %d events, next %d, %v; want its 5 admissions and a next", len(page.Events), page.Next, err)
	} else {
		t1.Before = page.Next
	}
	if page, err := store.ListAudit(ctx, db, t1); err != nil || len(page.Events) != 1 || page.Events[0].ID != rare || page.Next != 0 {
		t.Errorf("t1's second window: %+v, %v; want its refusal, the end", page, err)
	}

	// Age the rare event and the 20 after it, except the 10th after it (ids on the server's
	// auto_increment_increment, not always 1 apart).
	var tenth, twentieth int64
	if err := db.QueryRowContext(ctx, "SELECT id FROM audit_events WHERE id >= ? ORDER BY id LIMIT 1 OFFSET 10", rare).Scan(&tenth); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, "SELECT id FROM audit_events WHERE id >= ? ORDER BY id LIMIT 1 OFFSET 20", rare).Scan(&twentieth); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "UPDATE audit_events SET at = at - INTERVAL 40 DAY WHERE id <= ? AND id <> ?", twentieth, tenth); err != nil {
		t.Fatal(err)
	}
	cutoff := time.Now().Add(-30 * 24 * time.Hour)
	for _, want := range []int64{10, 9, 1, 0} {
		if n, err := store.PurgeAudit(ctx, db, cutoff, 10); err != nil || n != want {
			t.Errorf("PurgeAudit: %d, %v; want %d", n, err, want)
		}
	}
	var young int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM audit_events WHERE id = ?", tenth).Scan(&young); err != nil || young != 1 {
		t.Errorf("the young event among the old: %d rows, %v; want it kept", young, err)
	}
}

// TestAuditQueueFailures: a write the database refuses drops the batch and counts it; a nil
// queue takes nothing; the config is checked.
func TestAuditQueueFailures(t *testing.T) {
	t.Parallel()
	if _, err := store.NewAuditQueue(store.AuditQueueConfig{}); err == nil {
		t.Error("NewAuditQueue without DB: no error")
	}
	var none *store.AuditQueue
	if none.Add(store.AuditEvent{}) {
		t.Error("a nil queue took an event")
	}
	db := testdb.New(t)
	reg := prometheus.NewRegistry()
	q, err := store.NewAuditQueue(store.AuditQueueConfig{DB: db.DB, Registerer: reg, Batch: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.NewAuditQueue(store.AuditQueueConfig{DB: db.DB, Registerer: reg}); err == nil {
		t.Error("a second queue on one registry: no error")
	}
	for range 3 {
		q.Add(store.AuditEvent{Event: store.EventRefused, Tenant: "acme"})
	}
	closed, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/none")
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	broken, err := store.NewAuditQueue(store.AuditQueueConfig{DB: closed})
	if err != nil {
		t.Fatal(err)
	}
	broken.Add(store.AuditEvent{Event: store.EventRefused})
	if n, err := broken.RunOnce(context.Background()); n != 1 || err == nil || broken.Dropped() != 1 {
		t.Errorf("RunOnce on a closed database: %d, %v, dropped %d; want 1, an error, 1", n, err, broken.Dropped())
	}
	// Batches of 2: the first flush takes two, the next the rest.
	for _, want := range []int{2, 1, 0} {
		if n, err := q.RunOnce(context.Background()); n != want || err != nil {
			t.Errorf("RunOnce: %d, %v; want %d", n, err, want)
		}
	}
}

// TestAuditOff: each transition a Store writes (a claim, a confirmed start, outcomes in both
// forms, one requeued to hold its tenant's lock, a cancel, an expiry) writes its audit rows with
// the audit on, and none, with the same effect on the jobs, with AuditOff (the benchmarks'
// comparison).
func TestAuditOff(t *testing.T) {
	t.Parallel()
	for _, off := range []bool{false, true} {
		k := newFixture(t)
		st := &store.Store{Actor: "d9", AuditOff: off}
		queued := k.insert(jobSpec{})
		old := k.insert(jobSpec{tenant: "b", queuedAt: k.now.Add(-time.Hour)})
		toClaim := k.insert(jobSpec{tenant: "c"})
		started := dispatched(t, k.db, k.now, "acme", "n1")
		done := dispatched(t, k.db, k.now, "acme", "n2")
		requeued := dispatched(t, k.db, k.now, "acme", "n3")

		tx := k.begin()
		if _, _, err := st.Cancel(k.ctx, tx, k.now, queued); err != nil {
			t.Fatal(err)
		}
		if _, err := st.ConfirmStart(k.ctx, tx, k.now, started.ID, "n1", "s1"); err != nil {
			t.Fatal(err)
		}
		if gone, err := st.Expire(k.ctx, tx, k.now, k.now.Add(-time.Minute), 10); err != nil || len(gone) != 1 {
			t.Fatalf("expire: %v, %v", ids(gone), err)
		}
		if _, err := st.FinishMany(k.ctx, tx, k.now, []store.Finishing{{Row: done, Outcome: store.Outcome{Status: job.Succeeded}}}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		conn := k.beginConn()
		if _, err := store.LockJobs(k.ctx, conn, []int64{requeued.ID}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.FinishManyConn(k.ctx, conn, k.now, []store.Finishing{{Row: requeued,
			Outcome: store.Outcome{Status: job.Queued, ErrorCode: "executor_refused"}}}); err != nil {
			t.Fatal(err)
		}
		if err := conn.Commit(); err != nil {
			t.Fatal(err)
		}
		claim := k.beginConn()
		if _, err := store.LockClaims(k.ctx, claim, false); err != nil {
			t.Fatal(err)
		}
		got, err := st.ClaimJobs(k.ctx, claim, store.ClaimParams{DrainerID: "d9", Stamp: k.now, LeaseUntil: k.now.Add(time.Minute),
			NonceExpiresAt: k.now.Add(time.Minute),
			Jobs:           []store.ClaimJob{{ID: toClaim, Tenant: "c", NonceSHA256: store.HashNonce("nc")}}})
		if err != nil || !got.Got[toClaim] {
			t.Fatalf("claim: %v, %v", got, err)
		}

		for id, want := range map[int64]job.Status{queued: job.Canceled, old: job.Expired, toClaim: job.Dispatched,
			started.ID: job.Running, done.ID: job.Succeeded, requeued.ID: job.Queued} {
			if r := k.row(id); r.Status != want {
				t.Errorf("audit off %v: job %d is %s, want %s", off, id, r.Status, want)
			}
		}
		var wantRows int64 = 6 // one transition per job
		if off {
			wantRows = 0
		}
		if n := k.count("SELECT COUNT(*) FROM audit_events"); n != wantRows {
			t.Errorf("audit off %v: %d audit rows, want %d", off, n, wantRows)
		}
		if n := k.count("SELECT COUNT(DISTINCT job_id) FROM audit_events WHERE event = 'transition'"); n != wantRows {
			t.Errorf("audit off %v: transitions of %d jobs, want %d", off, n, wantRows)
		}
	}
}

// TestAuditTransitionsFromEachState: one batch of outcomes whose jobs left different states
// (running and dispatched) audits each with the state it left, and a batch whose jobs all left
// one state names it too.
func TestAuditTransitionsFromEachState(t *testing.T) {
	k := newFixture(t)
	st := &store.Store{Actor: "d9"}
	running := dispatched(t, k.db, k.now, "acme", "n1")
	plain := dispatched(t, k.db, k.now, "acme", "n2")
	alone := dispatched(t, k.db, k.now, "acme", "n3")
	tx := k.begin()
	if _, err := st.ConfirmStart(k.ctx, tx, k.now, running.ID, "n1", "s1"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	running = k.row(running.ID)
	for _, batch := range [][]store.Row{{running, plain}, {alone}} {
		var items []store.Finishing
		for _, r := range batch {
			items = append(items, store.Finishing{Row: r, Outcome: store.Outcome{Status: job.Succeeded}})
		}
		tx := k.begin()
		if _, err := st.FinishMany(k.ctx, tx, k.now, items); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	for id, from := range map[int64]job.Status{running.ID: job.Running, plain.ID: job.Dispatched, alone.ID: job.Dispatched} {
		evs, err := store.JobEvents(k.ctx, k.db, id, 10)
		if err != nil {
			t.Fatal(err)
		}
		last := evs[len(evs)-1]
		if last.From != string(from) || last.To != string(job.Succeeded) || last.Actor != "d9" {
			t.Errorf("job %d's last event is %+v; want %s → succeeded by d9", id, last, from)
		}
	}
}

// An event with At set is written at that instant (a refusal keeps its admission's), one without
// at the INSERT's, in the same statement; every other column as InsertAudit writes it.
func TestInsertAuditStamped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	past := time.Date(2026, 12, 6, 10, 0, 0, 123456000, time.UTC)
	events := []store.AuditEvent{
		{At: past, Event: store.EventRefused, Tenant: "acme", Actor: "p", ErrorCode: "rate_limited", Detail: json.RawMessage(`{"retry_after":3}`)},
		{Event: store.EventRefused, Tenant: "acme", Actor: "p", ErrorCode: "capacity_exceeded", Scope: "global"},
	}
	before := time.Now().UTC().Add(-time.Minute)
	if err := store.InsertAudit(ctx, db, events); err != nil {
		t.Fatal(err)
	}
	page, err := store.ListAudit(ctx, db, store.AuditFilter{Tenant: ptr("acme"), Limit: 10})
	if err != nil || len(page.Events) != 2 {
		t.Fatalf("ListAudit: %v, %v; want 2 events", page, err)
	}
	stamped, now := page.Events[1], page.Events[0] // newest (by id) first
	if !stamped.At.Equal(past) || stamped.ErrorCode != "rate_limited" || stamped.Actor != "p" || string(stamped.Detail) != `{"retry_after":3}` {
		t.Errorf("the stamped event read back as %+v, want at %s", stamped, past)
	}
	if now.At.Before(before) || now.ErrorCode != "capacity_exceeded" || now.Scope != "global" {
		t.Errorf("the unstamped event read back as %+v, want at the INSERT's time", now)
	}
}
