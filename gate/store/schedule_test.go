package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/store"
)

// TestInsertScheduledJobs: a job admitted for later (NewJob.Due) is queued at its due time, not
// eligible before it, and takes its place in its tenant's queue: the queue state's head is the
// tenant's oldest queued job whichever row of the INSERT it is, one transaction or several, in
// one round trip or in a batch's prepared statements.
func TestInsertScheduledJobs(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch %v", batch), func(t *testing.T) {
			k := newFixture(t)
			var stmts *store.StmtCache
			if batch {
				stmts = store.NewStmtCache(k.db.DB)
			}
			insert := func(jobs ...store.NewJob) (store.InsertedJobs, time.Time) {
				t.Helper()
				tx := k.beginAdmission(t, stmts)
				st, err := tx.ReadAdmission(k.ctx, store.AdmissionRead{Tenants: []string{"a", "b"}})
				if err != nil {
					t.Fatal(err)
				}
				for i := range jobs {
					if !jobs[i].Due.IsZero() {
						jobs[i].Due = st.Now.Add(jobs[i].Due.Sub(time.Time{}))
					}
				}
				got, err := tx.InsertJobs(k.ctx, store.NewJobs{Now: st.Now, NoHeadAfterNow: st.NoHeadAfterNow, Prefix: "sx", Jobs: jobs}, false)
				if err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				return got, st.Now
			}
			// in is a Due of d after the admission's time (insert adds it).
			in := func(d time.Duration) time.Time { return time.Time{}.Add(d) }

			// A tenant's first jobs: a scheduled one first in the INSERT, then one due now.
			got, now := insert(store.NewJob{Tenant: "a", Caller: "p", Due: in(time.Hour), Poke: true},
				store.NewJob{Tenant: "a", Caller: "p", Poke: true})
			later, due := k.row(got.IDs[0]), k.row(got.IDs[1])
			if !later.QueuedAt.Equal(now.Add(time.Hour)) || later.NotBefore == nil || !later.NotBefore.Equal(now.Add(time.Hour)) {
				t.Fatalf("scheduled job: queued_at %v, not_before %v; want both %v", later.QueuedAt, later.NotBefore, now.Add(time.Hour))
			}
			if !due.QueuedAt.Equal(now) || due.NotBefore != nil {
				t.Fatalf("job due now: queued_at %v, not_before %v; want %v and none", due.QueuedAt, due.NotBefore, now)
			}
			if s := readQueueState(t, k.db.DB, "a"); s.queued != 2 || s.headID != got.IDs[1] {
				t.Fatalf("tenant a: %+v; want 2 queued, head %d (the job due now)", s, got.IDs[1])
			}
			// A tenant with only scheduled jobs: its head is the soonest; one due now takes it.
			got, _ = insert(store.NewJob{Tenant: "b", Caller: "p", Due: in(2 * time.Hour)})
			soonest, _ := insert(store.NewJob{Tenant: "b", Caller: "p", Due: in(time.Hour)})
			if s := readQueueState(t, k.db.DB, "b"); s.queued != 2 || s.headID != soonest.IDs[0] {
				t.Fatalf("tenant b, two scheduled: %+v; want head %d (the soonest)", s, soonest.IDs[0])
			}
			now1, _ := insert(store.NewJob{Tenant: "b", Caller: "p"})
			if s := readQueueState(t, k.db.DB, "b"); s.queued != 3 || s.headID != now1.IDs[0] {
				t.Fatalf("tenant b after a job due now: %+v; want head %d", s, now1.IDs[0])
			}
			// A Due at or before the admission's time is no schedule.
			past, now2 := insert(store.NewJob{Tenant: "b", Caller: "p", Due: in(-time.Minute)})
			if r := k.row(past.IDs[0]); !r.QueuedAt.Equal(now2) || r.NotBefore != nil {
				t.Fatalf("a due time already passed: queued_at %v, not_before %v; want %v and none", r.QueuedAt, r.NotBefore, now2)
			}
			kept := []queueState{readQueueState(t, k.db.DB, "a"), readQueueState(t, k.db.DB, "b")}
			if err := store.RecountQueues(k.ctx, k.db); err != nil {
				t.Fatal(err)
			}
			if counted := []queueState{readQueueState(t, k.db.DB, "a"), readQueueState(t, k.db.DB, "b")}; !slices.Equal(kept, counted) {
				t.Fatalf("queue states kept by admission %+v; a recount finds %+v", kept, counted)
			}
		})
	}
}

// handlerReads returns the rows conn's statements have read through indexes so far (the
// session's Handler_read_* counters): what a statement examined, whatever it returned.
func handlerReads(t *testing.T, ctx context.Context, conn *sql.Conn) int64 {
	t.Helper()
	rows, err := conn.QueryContext(ctx, "SHOW SESSION STATUS LIKE 'Handler_read%'")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var sum int64
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		if name != "Handler_read_rnd_deleted" { // not a row read
			sum += n
		}
	}
	return sum
}

// TestClaimReadsSkipScheduledJobs: a claim pass's reads stop before the jobs scheduled for later,
// however many: the heads read of a tenant with 5,000 of them, and the page of tenants with work
// when 1,000 tenants have only such jobs, each examine a few rows (SPEC §6: the claim stays
// O(free slots) with jobs scheduled in the future).
func TestClaimReadsSkipScheduledJobs(t *testing.T) {
	t.Parallel()
	k := newFixture(t)
	ctx := k.ctx
	future := k.now.Add(24 * time.Hour)
	k.exec("INSERT INTO tenants (tenant, created_at) VALUES ('busy', ?)", k.now)
	var rows []string
	for i := range 5000 {
		rows = append(rows, fmt.Sprintf("('busy', 'queued', DATE_ADD(?, INTERVAL %d SECOND), DATE_ADD(?, INTERVAL %d SECOND), 'test')", i, i))
	}
	args := make([]any, 0, 2*len(rows))
	for range rows {
		args = append(args, future, future)
	}
	k.exec("INSERT INTO jobs (tenant, status, queued_at, not_before, caller) VALUES "+strings.Join(rows, ","), args...)
	due1 := k.insert(jobSpec{tenant: "busy", queuedAt: k.now.Add(-2 * time.Second)})
	due2 := k.insert(jobSpec{tenant: "busy", queuedAt: k.now.Add(-time.Second)})
	var tenants, jobs []string
	var targs, jargs []any
	for i := range 1000 {
		tenants = append(tenants, "(?, ?)")
		targs = append(targs, fmt.Sprintf("later-%04d", i), k.now)
		jobs = append(jobs, "(?, 'queued', ?, ?, 'test')")
		jargs = append(jargs, fmt.Sprintf("later-%04d", i), future, future)
	}
	k.exec("INSERT INTO tenants (tenant, created_at) VALUES "+strings.Join(tenants, ","), targs...)
	k.exec("INSERT INTO jobs (tenant, status, queued_at, not_before, caller) VALUES "+strings.Join(jobs, ","), jargs...)
	if err := store.RecountQueues(ctx, k.db); err != nil {
		t.Fatal(err)
	}
	conn, err := k.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	before := handlerReads(t, ctx, conn)
	heads, err := store.ReadHeads(ctx, conn, store.HeadsParams{Now: k.now, Tenants: []store.HeadsWant{{Tenant: "busy", N: 32}}})
	if err != nil {
		t.Fatal(err)
	}
	read := handlerReads(t, ctx, conn) - before - 1 // SHOW STATUS reads none, but count it out
	var ids []int64
	for _, h := range heads["busy"] {
		ids = append(ids, h.ID)
	}
	if !slices.Equal(ids, []int64{due1, due2}) {
		t.Fatalf("heads of busy: %v; want the two jobs due, %d and %d", ids, due1, due2)
	}
	if read > 20 {
		t.Fatalf("the heads read examined %d rows for 2 jobs due beside 5,000 scheduled", read)
	}

	for _, byName := range []bool{false, true} {
		before = handlerReads(t, ctx, conn)
		page, err := store.ReadTenantPage(ctx, conn, store.TenantPageParams{FromStart: !byName, ByName: byName, Limit: 70, DueOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		read = handlerReads(t, ctx, conn) - before
		var names []string
		for _, h := range page.Tenants {
			names = append(names, h.Tenant)
		}
		if !slices.Equal(names, []string{"busy"}) {
			t.Fatalf("by name %v: tenants due %v; want only busy", byName, names)
		}
		// By head the range ends at now; by name the rows are walked and filtered.
		if limit := map[bool]int64{false: 20, true: 3000}[byName]; read > limit {
			t.Fatalf("by name %v: the tenants page examined %d rows for 1 tenant due beside 1,000 with only scheduled jobs", byName, read)
		}
	}
}
