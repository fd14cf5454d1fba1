package store_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/outbox"
)

// beginAdmission opens an admission transaction (a batch's, through stmts, if not nil), closed
// when t ends.
func (k *fixture) beginAdmission(t *testing.T, stmts *store.StmtCache) *store.AdmissionTx {
	t.Helper()
	tx, err := store.BeginAdmission(k.ctx, k.db.DB, stmts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tx.Close)
	return tx
}

// TestReadAdmissionCountsLiveSlots: what an admission reads as in flight is the jobs and the
// live slots that count together (SPEC §5a: one accounting), so a queue=false admission and the
// headers see the capacity a slot holds; an expired slot no longer counts, nor does one granted
// past a limit (counted false, migration 0020).
func TestReadAdmissionCountsLiveSlots(t *testing.T) {
	k := newFixture(t)
	k.insert(jobSpec{tenant: "a", status: job.Running})
	if _, err := k.db.ExecContext(k.ctx, `INSERT INTO slots (tenant, caller, lanes, interactive, lease_seconds, counted, expires_at, created_at) VALUES
		('b', 'p', 'gpu', 1, 60, TRUE, NOW(6) + INTERVAL 1 HOUR, NOW(6)),
		('b', 'p', 'gpu', 1, 60, FALSE, NOW(6) + INTERVAL 1 HOUR, NOW(6)),
		('b', 'p', '', 0, 60, TRUE, NOW(6) - INTERVAL 1 SECOND, NOW(6))`); err != nil {
		t.Fatal(err)
	}
	tx := k.beginAdmission(t, nil)
	st, err := tx.ReadAdmission(k.ctx, store.AdmissionRead{Tenants: []string{"a"}, CountInFlight: true})
	if err != nil {
		t.Fatal(err)
	}
	if u := st.Usage; u.Total != 2 || u.Tenant["b"] != 1 || u.Lane["gpu"] != 1 || u.Interactive != 1 {
		t.Errorf("in flight %+v, want a's job and b's live slot", u)
	}
	if st.TenantInFlight["a"] != 1 {
		t.Errorf("a's jobs in flight %d, want 1", st.TenantInFlight["a"])
	}
	tx.Close()
	// Each tenant's jobs in flight, taken from the same read, leave the slots out; alone or
	// with another tenant, with the in-flight read or counted on their own without it.
	for _, p := range []store.AdmissionRead{
		{Tenants: []string{"a", "b"}, CountInFlight: true}, {Tenants: []string{"a", "b"}},
		{Tenants: []string{"b"}, CountInFlight: true}, {Tenants: []string{"b"}},
	} {
		tx := k.beginAdmission(t, nil)
		st, err := tx.ReadAdmission(k.ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]int{"a": 1, "b": 0}
		for _, tenant := range p.Tenants {
			if st.TenantInFlight[tenant] != want[tenant] {
				t.Errorf("read %+v: %s's jobs in flight %d, want %d (its slots are not jobs)", p, tenant, st.TenantInFlight[tenant], want[tenant])
			}
		}
		tx.Close()
	}
}

// TestReadAdmission: the read creates and locks the tenants' rows (no job row), and returns the
// database time, the depths and in-flight counts of one tenant or several, the global depth
// counted up to its bound or the estimate given, the jobs of the idempotency keys and the first
// job of each redrive. Asked not to wait, it fails at once on a tenant another transaction holds.
func TestReadAdmission(t *testing.T) {
	k := newFixture(t)
	key := "k1"
	q1 := k.insert(jobSpec{tenant: "a"})
	k.insert(jobSpec{tenant: "a", interactive: true})
	k.insert(jobSpec{tenant: "a", status: job.Running})
	k.insert(jobSpec{tenant: "b", status: job.Dispatched, lanes: "gpu", interactive: true})
	k.insert(jobSpec{tenant: "c"})
	keyed := k.insert(jobSpec{tenant: "b", status: job.Succeeded, idemKey: key})
	failed := k.insert(jobSpec{tenant: "b", status: job.Failed})
	redrive := k.insert(jobSpec{tenant: "b", retryOf: failed})
	k.insert(jobSpec{tenant: "b", retryOf: failed})
	all := []int64{q1, keyed, failed, redrive}

	t.Run("one tenant", func(t *testing.T) {
		tx := k.beginAdmission(t, nil)
		st, err := tx.ReadAdmission(k.ctx, store.AdmissionRead{Tenants: []string{"a"}, GlobalCountUpTo: 100, CountInFlight: true, CountInteractive: true})
		if err != nil {
			t.Fatal(err)
		}
		if st.TenantDepth["a"] != 2 || st.TenantInteractive["a"] != 1 || st.TenantInFlight["a"] != 1 || st.GlobalDepth != 5 || st.Usage.Total != 2 {
			t.Errorf("state %+v, want a: 2 queued (1 interactive), 1 in flight; 5 queued and 2 in flight in all", st)
		}
		if u := st.Usage; u.Total != 2 || u.Interactive != 1 || u.Lane["gpu"] != 1 || u.Tenant["b"] != 1 || u.Tier["default"] != 2 {
			t.Errorf("in flight %+v, want 2 (b's interactive on gpu, a's plain)", u)
		}
		if st.Now.Location() != time.UTC || st.Now.Before(k.now) {
			t.Errorf("database time %v, want UTC, not before %v", st.Now, k.now)
		}
		k.wantTenantsLocked("inside the transaction", []string{"a", "b", "c"}, "a")
		k.wantLocked("inside the transaction", all)
	})
	t.Run("several tenants, estimated, keys and redrives", func(t *testing.T) {
		tx := k.beginAdmission(t, nil)
		st, err := tx.ReadAdmission(k.ctx, store.AdmissionRead{Tenants: []string{"a", "b", "new"}, GlobalEstimate: 42,
			CountInteractive: true, IdempotencyKeys: []string{key, "absent"}, Redrives: []int64{failed, q1}})
		if err != nil {
			t.Fatal(err)
		}
		if st.TenantDepth["a"] != 2 || st.TenantInteractive["a"] != 1 || st.TenantInFlight["a"] != 1 || st.TenantDepth["b"] != 2 ||
			st.TenantInteractive["b"] != 0 || st.TenantInFlight["b"] != 1 || st.TenantDepth["new"] != 0 || st.GlobalDepth != 42 || st.Usage.Total != 0 {
			t.Errorf("state %+v", st)
		}
		if !slices.Equal(ids(st.Keyed), []int64{keyed}) || !slices.Equal(ids(st.Redriven), []int64{redrive}) {
			t.Errorf("keyed %v, redriven %v; want [%d], [%d]", ids(st.Keyed), ids(st.Redriven), keyed, redrive)
		}
		k.wantTenantsLocked("inside the transaction", []string{"a", "b", "c", "new"}, "a", "b", "new")
	})
	t.Run("interactive depths only when asked", func(t *testing.T) {
		for _, tenants := range [][]string{{"a"}, {"a", "b"}} {
			tx := k.beginAdmission(t, nil)
			st, err := tx.ReadAdmission(k.ctx, store.AdmissionRead{Tenants: tenants})
			if err != nil || st.TenantDepth["a"] != 2 || st.TenantInteractive["a"] != 0 {
				t.Errorf("%v: depth %v, interactive %v (%v); want a's 2 and its interactive job not counted", tenants, st.TenantDepth, st.TenantInteractive, err)
			}
			tx.Close()
		}
	})
	t.Run("a global count stops at its bound", func(t *testing.T) {
		tx := k.beginAdmission(t, nil)
		st, err := tx.ReadAdmission(k.ctx, store.AdmissionRead{Tenants: []string{"c"}, GlobalCountUpTo: 3})
		if err != nil || st.GlobalDepth != 3 {
			t.Errorf("global depth %d (%v), want 3", st.GlobalDepth, err)
		}
	})
	t.Run("no wait", func(t *testing.T) {
		hold, err := k.db.BeginTx(k.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer hold.Rollback()
		if _, err := hold.ExecContext(k.ctx, "SELECT 1 FROM tenants WHERE tenant = 'a' FOR UPDATE"); err != nil {
			t.Fatal(err)
		}
		tx := k.beginAdmission(t, nil)
		began := time.Now()
		_, err = tx.ReadAdmission(k.ctx, store.AdmissionRead{Tenants: []string{"a"}, NoWait: true})
		var me *mysql.MySQLError
		if !errors.As(err, &me) || me.Number != 1205 {
			t.Errorf("a read that must not wait, on a held tenant: %v, want error 1205", err)
		}
		// The lock wait timeout is 10 s (store.Open); a read that waited would take that long.
		if took := time.Since(began); took > 5*time.Second {
			t.Errorf("a read that must not wait took %s", took)
		}
	})
	if n := k.count("SELECT COUNT(*) FROM tenants WHERE tenant = 'new'"); n != 0 {
		t.Errorf("a tenant row created by a transaction rolled back is still there (%d)", n)
	}
}

// TestInsertJobs: an admission's rows, queued or rejected, with ids on the session's id step
// (consecutive on one server, every third on a 3-node Galera cluster), the enqueue
// pokes asked for (their bodies naming their jobs), the queued jobs added to their tenants'
// queue state, and the COMMIT in the same round trip when asked; a batch does the same through
// prepared statements, a chunk of 250 rows an INSERT.
func TestInsertJobs(t *testing.T) {
	for _, step := range idSteps {
		t.Run(fmt.Sprintf("id step %d", step), func(t *testing.T) { testInsertJobs(t, step) })
	}
}

func testInsertJobs(t *testing.T, step int) {
	k, step := newFixtureStep(t, step)
	key := "k1"
	hash := "h1"
	retryOf := k.insert(jobSpec{tenant: "a", status: job.Failed})
	jobs := []store.NewJob{
		{Tenant: "a", Caller: "p", Payload: []byte(`{"x":1}`), IdempotencyKey: &key, RequestSHA256: []byte("fp"), RateKeySHA256: &hash},
		{Tenant: "a", Caller: "p", Rejected: "queue full (tenant depth cap)", Payload: []byte(`{}`), IdempotencyKey: &key},
		{Tenant: "b", Caller: "p", RetryOf: &retryOf, Poke: true},
		{Tenant: "a", Caller: "p", Poke: true},
	}
	for _, batch := range []bool{false, true} {
		var stmts *store.StmtCache
		if batch {
			stmts = store.NewStmtCache(k.db.DB)
		}
		tx := k.beginAdmission(t, stmts)
		st, err := tx.ReadAdmission(k.ctx, store.AdmissionRead{Tenants: []string{"a", "b"}})
		if err != nil {
			t.Fatal(err)
		}
		js := jobs
		if batch {
			js = nil
			for range 130 {
				js = append(js, jobs...) // 520 rows: three chunks
			}
			for i := range js {
				js[i].IdempotencyKey = nil
			}
		}
		commit := !batch && tx.CanCommitWithInsert()
		got, err := tx.InsertJobs(k.ctx, store.NewJobs{Now: st.Now, Prefix: "sx", Jobs: js}, commit)
		if err != nil {
			t.Fatalf("batch %v: %v", batch, err)
		}
		if !commit {
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		for i := 1; i < len(got.IDs); i++ {
			if got.IDs[i] != got.IDs[i-1]+int64(step) {
				t.Fatalf("batch %v: ids %v, want one every %d", batch, got.IDs, step)
			}
		}
		for i, j := range js {
			r := k.row(got.IDs[i])
			switch {
			case j.Rejected != "":
				if r.Status != job.Rejected || r.FinishedAt == nil || *r.ErrorCode != string(job.CodeQueueFull) || *r.ErrorMessage != j.Rejected ||
					r.Payload != nil || r.IdempotencyKey != nil || got.PokeIDs[i] != 0 {
					t.Errorf("batch %v: rejected row %d: %+v, poke %d", batch, i, r, got.PokeIDs[i])
				}
			default:
				if r.Status != job.Queued || !r.QueuedAt.Equal(st.Now) || string(r.Payload) != string(j.Payload) || r.Caller != "p" ||
					(j.IdempotencyKey != nil) != (r.IdempotencyKey != nil) || (j.RetryOf != nil) != (r.RetryOf != nil) {
					t.Errorf("batch %v: queued row %d: %+v", batch, i, r)
				}
				if j.Poke != (got.PokeIDs[i] != 0) {
					t.Errorf("batch %v: row %d: poke %d, want one: %v", batch, i, got.PokeIDs[i], j.Poke)
				}
				if j.Poke {
					var body string
					if err := k.db.QueryRowContext(k.ctx, "SELECT CAST(payload AS CHAR) FROM outbox WHERE id = ? AND subject = ?",
						got.PokeIDs[i], outbox.Subject("sx", outbox.Enqueue, j.Tenant)).Scan(&body); err != nil {
						t.Errorf("batch %v: poke of row %d: %v", batch, i, err)
					}
					if want := `"job_id":` + strconv.FormatInt(got.IDs[i], 10); !strings.Contains(body, want) {
						t.Errorf("batch %v: poke body %s, want %s", batch, body, want)
					}
				}
			}
		}
		wantQueueState(t, k, "a", "b")
	}
}

// TestInsertJobsClockStepBack: a tenant whose oldest queued job is newer than the admission's
// time (the database clock stepped back) gets the new job as its head. The read says so
// (NoHeadAfterNow false), alone and among other tenants, so the insert takes the UPDATE that
// looks the head up; a tenant whose head is older keeps it with the UPDATE that does not.
func TestInsertJobsClockStepBack(t *testing.T) {
	k := newFixture(t)
	k.insert(jobSpec{tenant: "c", queuedAt: k.now.Add(time.Hour)})
	old := k.insert(jobSpec{tenant: "d", queuedAt: k.now.Add(-time.Hour)})
	for _, tenants := range [][]string{{"c", "d"}, {"c"}} {
		tx := k.beginAdmission(t, nil)
		st, err := tx.ReadAdmission(k.ctx, store.AdmissionRead{Tenants: tenants})
		if err != nil {
			t.Fatal(err)
		}
		if st.NoHeadAfterNow {
			t.Errorf("tenants %v: no head after now, but c's is an hour ahead", tenants)
		}
		tx.Close()
	}
	tx := k.beginAdmission(t, nil)
	st, err := tx.ReadAdmission(k.ctx, store.AdmissionRead{Tenants: []string{"c"}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := tx.InsertJobs(k.ctx, store.NewJobs{Now: st.Now, NoHeadAfterNow: st.NoHeadAfterNow, Jobs: []store.NewJob{{Tenant: "c"}}}, true)
	if err != nil {
		t.Fatal(err)
	}
	if qs := readQueueState(t, k.db.DB, "c"); qs.headID != got.IDs[0] || qs.queued != 2 {
		t.Errorf("queue state %+v, want job %d at the head of 2", qs, got.IDs[0])
	}
	wantQueueState(t, k, "c")

	tx = k.beginAdmission(t, nil)
	if st, err = tx.ReadAdmission(k.ctx, store.AdmissionRead{Tenants: []string{"d"}}); err != nil || !st.NoHeadAfterNow {
		t.Fatalf("tenant d, its head an hour old: no head after now %v (%v), want true", st.NoHeadAfterNow, err)
	}
	if _, err = tx.InsertJobs(k.ctx, store.NewJobs{Now: st.Now, NoHeadAfterNow: true, Jobs: []store.NewJob{{Tenant: "d"}, {Tenant: "d"}}}, true); err != nil {
		t.Fatal(err)
	}
	if qs := readQueueState(t, k.db.DB, "d"); qs.headID != old || qs.queued != 3 {
		t.Errorf("queue state %+v, want job %d still at the head of 3", qs, old)
	}
	wantQueueState(t, k, "d")
}

// wantQueueState fails unless each tenant's queue state is what a recount gives.
func wantQueueState(t *testing.T, k *fixture, tenants ...string) {
	t.Helper()
	for _, tenant := range tenants {
		before := readQueueState(t, k.db.DB, tenant)
		if err := store.RecountQueues(k.ctx, k.db, tenant); err != nil {
			t.Fatal(err)
		}
		if after := readQueueState(t, k.db.DB, tenant); after != before {
			t.Errorf("tenant %s: queue state %+v, a recount gives %+v", tenant, before, after)
		}
	}
}

// TestInsertJobsAudit: each job of an admission gets its one audit row, naming it, with the
// event given (admitted, a refusal, a shadow refusal, another actor than the caller): alone,
// several in one INSERT, and over several chunks of a prepared batch, with enough plain
// admissions to be derived from their job rows in one statement after the inserts
// (auditAdmittedRangesSQL) and with too few; with consecutive ids and with Galera's step.
func TestInsertJobsAudit(t *testing.T) {
	for _, step := range idSteps {
		t.Run(fmt.Sprintf("id step %d", step), func(t *testing.T) { testInsertJobsAudit(t, step) })
	}
}

func testInsertJobsAudit(t *testing.T, step int) {
	k, _ := newFixtureStep(t, step)
	zero, none := int64(0), 0
	admitted := func(tenant, actor, detail string) store.AuditEvent {
		return store.AuditEvent{Event: store.EventAdmitted, Tenant: tenant, Actor: actor, To: "queued", Version: &zero,
			Attempt: &none, Detail: json.RawMessage(detail)}
	}
	type admission struct {
		job store.NewJob
		e   store.AuditEvent
	}
	kinds := []admission{
		{store.NewJob{Tenant: "a", Caller: "p", Poke: true}, admitted("a", "p", `{"position":1}`)},
		{store.NewJob{Tenant: "a", Caller: "p", Rejected: "queue full (tenant depth cap)"}, store.AuditEvent{Event: store.EventRefused,
			Tenant: "a", Actor: "p", To: "rejected", ErrorCode: "queue_full", Scope: "tenant", Version: &zero, Attempt: &none,
			Detail: json.RawMessage(`{"scope":"tenant"}`)}},
		{store.NewJob{Tenant: "b", Caller: "p"}, func() store.AuditEvent {
			e := admitted("b", "p", `{"rate_limited":true}`)
			e.Event = store.EventShadowRefused
			return e
		}()},
		{store.NewJob{Tenant: "b", Caller: "p"}, admitted("b", "ops", `{"retry_of":7}`)}, // a redrive: another actor
		{store.NewJob{Tenant: "b", Caller: "p", Poke: true}, admitted("b", "p", `{"position":2}`)},
		// The longest detail, with spaces and characters of several bytes inside it: the others
		// are padded to its length and trimmed back.
		{store.NewJob{Tenant: "a", Caller: "p"}, admitted("a", "p", `{"note":"é ü — ok ","position":3}`)},
	}
	for _, c := range []struct {
		name string
		adm  []admission
	}{
		{"one implied", kinds[:1]},
		{"one not implied", kinds[1:2]},
		{"mixed", kinds},
		{"batch", func() []admission {
			var out []admission
			for range 104 {
				out = append(out, kinds...) // 624 rows: three chunks
			}
			return out
		}()},
		{"batch, few implied", func() []admission {
			var out []admission
			for i := range 100 { // 10 implied: below derivedAuditMin, every row by its values
				if i%10 == 0 {
					out = append(out, kinds[0])
				} else {
					out = append(out, kinds[1+i%3])
				}
			}
			return out
		}()},
	} {
		var stmts *store.StmtCache
		if len(c.adm) > 64 {
			stmts = store.NewStmtCache(k.db.DB)
		}
		tx := k.beginAdmission(t, stmts)
		st, err := tx.ReadAdmission(k.ctx, store.AdmissionRead{Tenants: []string{"a", "b"}})
		if err != nil {
			t.Fatal(err)
		}
		p := store.NewJobs{Now: st.Now, Jobs: make([]store.NewJob, len(c.adm)), Audit: make([]store.AuditEvent, len(c.adm))}
		for i, a := range c.adm {
			p.Jobs[i], p.Audit[i] = a.job, a.e
		}
		got, err := tx.InsertJobs(k.ctx, p, false)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		for i, id := range got.IDs {
			evs, err := store.JobEvents(k.ctx, k.db, id, 10)
			if err != nil || len(evs) != 1 {
				t.Fatalf("%s: job %d (%d): events %+v, %v; want one", c.name, i, id, evs, err)
			}
			e, want := evs[0], c.adm[i].e
			if e.Event != want.Event || e.Tenant != want.Tenant || e.Actor != want.Actor || e.To != want.To ||
				e.ErrorCode != want.ErrorCode || e.Scope != want.Scope || *e.Version != 0 || *e.Attempt != 0 || e.From != "" ||
				e.SlotID != nil || string(e.Detail) != string(want.Detail) {
				t.Errorf("%s: job %d: event %+v, want %+v", c.name, i, e, want)
			}
		}
	}
	if n := k.count("SELECT COUNT(*) FROM audit_events"); n != 1+1+6+624+100 {
		t.Errorf("%d audit rows, want one per job (732)", n)
	}
}

// TestAuditAdmittedRanges: the audit rows of jobs whose ids are not one run (another
// transaction's INSERT took ids between two chunks') each get their own detail, and a job
// between the runs, or one whose detail is nil, gets no row. With an id step of 3 (Galera's
// auto_increment_increment on a 3-node cluster), the ids between a run's, which other nodes
// write, get no row either.
func TestAuditAdmittedRanges(t *testing.T) {
	cases := []struct {
		name string
		step int64
		// mine are the indexes of the inserted jobs that are the INSERTs' rows, in runs.
		mine  []int
		total int
	}{
		// Runs [0,1], [3,4,5]: 2 belongs to someone else.
		{name: "consecutive", step: 1, mine: []int{0, 1, 3, 4, 5}, total: 6},
		// Runs [0,3,6], [12,15]: 9 is on the step but another INSERT's; the rest another node's.
		{name: "step 3", step: 3, mine: []int{0, 3, 6, 12, 15}, total: 16},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := newFixture(t)
			var ids []int64
			for range c.total {
				ids = append(ids, k.insert(jobSpec{tenant: "a", status: "queued", queuedAt: time.Now()}))
			}
			mine := make([]int64, len(c.mine))
			ours := map[int64]bool{}
			for i, at := range c.mine {
				mine[i] = ids[at]
				ours[ids[at]] = true
			}
			// The fourth job's event is not implied.
			details := []json.RawMessage{[]byte(`{"position":1}`), []byte(`{"position":2}`), []byte(`{"position":3}`), nil,
				[]byte(`{"position":5}`)}
			q, args := store.AuditAdmittedRangesSQL(mine, c.step, details)
			k.exec(q, args...)
			for i, id := range mine {
				evs, err := store.JobEvents(k.ctx, k.db, id, 10)
				switch {
				case err != nil:
					t.Fatal(err)
				case details[i] == nil && len(evs) != 0:
					t.Errorf("job %d: %+v, want no event", i, evs)
				case details[i] != nil && (len(evs) != 1 || string(evs[0].Detail) != string(details[i]) || evs[0].Event != store.EventAdmitted ||
					evs[0].Tenant != "a" || evs[0].Actor != "test" || evs[0].To != "queued"):
					t.Errorf("job %d: %+v, want one admitted event with detail %s", i, evs, details[i])
				}
			}
			for _, id := range ids {
				if n := k.count("SELECT COUNT(*) FROM audit_events WHERE job_id = ?", id); !ours[id] && n != 0 {
					t.Errorf("job %d, not the INSERTs', got %d rows", id, n)
				}
			}
		})
	}
}

// TestInsertJobsIDStepChanged: a Galera cluster that loses or gains a node changes every
// session's auto_increment_increment at once, so a transaction can read one step with its
// admission state and INSERT with another. Several rows' ids would then be derived wrongly: the
// round trip fails with ErrIDStepChanged before its COMMIT, and nothing is written. A single
// row's id does not depend on the step.
func TestInsertJobsIDStepChanged(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch %v", batch), func(t *testing.T) {
			k, step := newFixtureStep(t, 1)
			if step != 1 {
				t.Skipf("the server overrides a session's auto_increment_increment (%d): a Galera cluster", step)
			}
			var stmts *store.StmtCache
			if batch {
				stmts = store.NewStmtCache(k.db.DB)
			}
			insert := func(jobs int) error {
				tx, err := store.BeginAdmission(k.ctx, k.db.DB, stmts)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Close() // rolls back what failed, and frees the tenant's lock
				st, err := tx.ReadAdmission(k.ctx, store.AdmissionRead{Tenants: []string{"a"}})
				if err != nil {
					t.Fatal(err)
				}
				// What the cluster's membership change does to the session between the two.
				if _, err := tx.DB().ExecContext(k.ctx, "SET SESSION auto_increment_increment = 2"); err != nil {
					t.Fatal(err)
				}
				js := make([]store.NewJob, jobs)
				for i := range js {
					js[i] = store.NewJob{Tenant: "a", Caller: "p", Poke: true}
				}
				commit := tx.CanCommitWithInsert()
				_, err = tx.InsertJobs(k.ctx, store.NewJobs{Now: st.Now, Prefix: "sx", Jobs: js}, commit)
				if err == nil && !commit {
					err = tx.Commit()
				}
				return err
			}
			if err := insert(3); !errors.Is(err, store.ErrIDStepChanged) {
				t.Fatalf("three rows across a step change: %v, want ErrIDStepChanged", err)
			}
			if n := k.count("SELECT COUNT(*) FROM jobs"); n != 0 {
				t.Fatalf("%d jobs written by the failed transaction", n)
			}
			if err := insert(1); err != nil {
				t.Fatalf("one row across a step change: %v", err)
			}
			if n := k.count("SELECT COUNT(*) FROM jobs"); n != 1 {
				t.Fatalf("%d jobs, want the one row", n)
			}
		})
	}
}
