package store_test

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/testdb"
	"github.com/sluicehq/sluice/integration/wait"
)

// TestLockClaims: the claim's first round trip holds the claim lock (and no job or tenant row),
// reads the runtime config in force (the defaults before any version) and the jobs in flight
// by tenant, tier, lane and interactive, and with the probe the queue's first two jobs with
// their payloads, lanes and interactive flags.
func TestLockClaims(t *testing.T) {
	k := newFixture(t)
	testdb.SetLimits(t, k.db.DB, func(c *config.Config) {
		c.Lanes = map[string]int{"gpu": 3, "search": 3}
		c.TenantTiers = map[string]string{"b": "gold"}
	})
	q := k.insert(jobSpec{tenant: "a", payload: `{"p":1}`, rateKey: "k", lanes: "gpu", interactive: true})
	r := k.insert(jobSpec{tenant: "a", status: job.Running, lanes: "gpu,search"})
	d := k.insert(jobSpec{tenant: "b", status: job.Dispatched, interactive: true, lanes: "gpu"})
	c := k.insert(jobSpec{tenant: "b", status: job.Claimed})
	done := k.insert(jobSpec{tenant: "c", status: job.Succeeded})
	all := []int64{q, r, d, c, done}

	tx := k.beginConn()
	l, err := store.LockClaims(k.ctx, tx, false)
	if err != nil {
		t.Fatal(err)
	}
	want := config.Usage{Total: 3, Interactive: 1, Tenant: map[string]int{"a": 1, "b": 2},
		Tier: map[string]int{"default": 1, "gold": 2}, Lane: map[string]int{"gpu": 2, "search": 1}}
	if l.Config.GlobalInFlight != config.Default().GlobalInFlight || !reflect.DeepEqual(l.Usage, want) || l.Lone != nil {
		t.Errorf("claim lock read %+v, want usage %+v", l, want)
	}
	if !k.claimLockHeld() {
		t.Error("the claim lock is not held")
	}
	k.wantLocked("under the claim lock", all)
	k.wantTenantsLocked("under the claim lock", []string{"a", "b", "c"})
	tx.Close()
	if k.claimLockHeld() {
		t.Error("the claim lock is held after the transaction ended")
	}

	testdb.SetLimits(t, k.db.DB, func(c *config.Config) { c.GlobalInFlight = 7 })
	k.insert(jobSpec{tenant: "c"})
	tx = k.beginConn()
	l, err = store.LockClaims(k.ctx, tx, true)
	if err != nil {
		t.Fatal(err)
	}
	if l.Config.GlobalInFlight != 7 || len(l.Lone) != 2 {
		t.Fatalf("with a config and the probe: %+v", l)
	}
	if j := l.Lone[0]; j.ID != q || j.Tenant != "a" || j.RateKey.String != "k" || j.Version != 0 ||
		!slices.Equal(j.Lanes, []string{"gpu"}) || !j.Interactive {
		t.Errorf("the probe's first job: %+v", j)
	}
}

// TestProbeQueue: at most two queued jobs, read without a lock.
func TestProbeQueue(t *testing.T) {
	k := newFixture(t)
	if got, err := store.ProbeQueue(k.ctx, k.db); err != nil || len(got) != 0 {
		t.Fatalf("an empty queue: %+v (%v)", got, err)
	}
	nb := k.now.Add(time.Minute)
	a := k.insert(jobSpec{notBefore: &nb})
	b := k.insert(jobSpec{})
	c := k.insert(jobSpec{})
	tx := k.begin()
	got, err := store.ProbeQueue(k.ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(headIDs(got), []int64{a, b}) || !got[0].NotBefore.Valid || !got[0].NotBefore.Time.Equal(nb) {
		t.Errorf("probe %+v, want jobs %d (with its not-before) and %d", got, a, b)
	}
	k.wantLocked("after the probe", []int64{a, b, c})
}

func headIDs(qs []store.QueuedJob) []int64 {
	var out []int64
	for _, q := range qs {
		out = append(out, q.ID)
	}
	return out
}

// TestClaimJobs: a claim moves the chosen jobs that are still queued at the version read to
// dispatched with its nonces, lease and stamps, and commits; a job taken or moved since it was
// read is not claimed and not changed, and the payloads and attempt counts of the jobs claimed
// come back. Its round trip locks the job rows, in id order, before their tenants' rows: held up
// by a tenant, it holds its jobs and waits.
func TestClaimJobs(t *testing.T) {
	k := newFixture(t)
	a := k.insert(jobSpec{tenant: "a", payload: `{"a":1}`})
	b := k.insert(jobSpec{tenant: "b", version: 2})
	k.exec("UPDATE jobs SET attempt = 3, dispatch_failures = 2 WHERE id = ?", b)
	stale := k.insert(jobSpec{tenant: "a", version: 1})
	canceled := k.insert(jobSpec{tenant: "b", status: job.Canceled})
	hash := func(n string) []byte { return store.HashNonce(n) }
	stamp := k.now.Add(time.Millisecond)
	p := store.ClaimParams{DrainerID: "d9", Stamp: stamp, StartedAt: &stamp, LeaseUntil: k.now.Add(10 * time.Second),
		NonceExpiresAt: k.now.Add(time.Minute), Jobs: []store.ClaimJob{
			{ID: a, Version: 0, Tenant: "a", NonceSHA256: hash("na")},
			{ID: b, Version: 2, Tenant: "b", NonceSHA256: hash("nb")},
			{ID: stale, Version: 0, Tenant: "a", NonceSHA256: hash("ns")},
			{ID: canceled, Version: 0, Tenant: "b", NonceSHA256: hash("nc")}}}

	hold := k.begin()
	if _, err := hold.ExecContext(k.ctx, "SELECT 1 FROM tenants WHERE tenant = 'b' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	tx := k.beginConn()
	if _, err := store.LockClaims(k.ctx, tx, false); err != nil {
		t.Fatal(err)
	}
	type result struct {
		store.Claimed
		err error
	}
	done := make(chan result, 1)
	go func() {
		got, err := (&store.Store{}).ClaimJobs(k.ctx, tx, p)
		done <- result{got, err}
	}()
	wait.For(t, 10*time.Second, "the claim to lock its jobs", func() (bool, error) {
		return k.db.HeldElsewhere(k.ctx, "SELECT 1 FROM jobs WHERE id = ?", canceled)
	})
	k.wantLocked("while the claim waits for tenant b", []int64{a, b, stale, canceled}, a, b, stale, canceled)
	if !k.claimLockHeld() {
		t.Error("the claim lock is not held while the claim waits")
	}
	if err := hold.Rollback(); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	if want := map[int64]bool{a: true, b: true, stale: false, canceled: false}; len(res.Got) != 4 || !res.Got[a] || !res.Got[b] || res.Got[stale] || res.Got[canceled] {
		t.Errorf("claimed %v, want %v", res.Got, want)
	}
	// The attempt counts as the claim left them; nothing for the jobs it did not get.
	if pa, pb := res.Payloads[a], res.Payloads[b]; len(res.Payloads) != 2 || string(pa.Payload) != `{"a":1}` || pa.Attempt != 1 ||
		pb.Payload != nil || pb.Attempt != 4 || pb.DispatchFailures != 2 {
		t.Errorf("payloads read back: %+v", res.Payloads)
	}
	k.wantLocked("after the commit", []int64{a, b, stale, canceled})
	if k.claimLockHeld() {
		t.Error("the claim lock is held after the commit")
	}
	for id, nonce := range map[int64]string{a: "na", b: "nb"} {
		r := k.row(id)
		if r.Status != job.Dispatched || r.Attempt != res.Payloads[id].Attempt || r.DrainerID == nil || *r.DrainerID != "d9" || !r.ClaimedAt.Equal(stamp) ||
			!r.DispatchedAt.Equal(stamp) || !r.StartedAt.Equal(stamp) || !r.LeaseUntil.Equal(p.LeaseUntil) ||
			!r.NonceExpiresAt.Equal(p.NonceExpiresAt) || !bytes.Equal(r.NonceSHA256, hash(nonce)) {
			t.Errorf("claimed job %d: %+v", id, r)
		}
	}
	if r := k.row(b); r.Version != 3 {
		t.Errorf("job b: version %d, want 3", r.Version)
	}
	if r := k.row(stale); r.Status != job.Queued || r.Version != 1 || r.NonceSHA256 != nil {
		t.Errorf("the stale job changed: %+v", r)
	}
	if r := k.row(canceled); r.Status != job.Canceled {
		t.Errorf("the canceled job changed: %+v", r)
	}
	// Tenant a still has a queued job, whose head the claim left behind; b has none left.
	if len(res.Behind) != 1 || res.Behind[0] != "a" {
		t.Errorf("heads left behind: %v, want [a]", res.Behind)
	}
	if skipped, err := store.AdvanceHeads(k.ctx, k.db.DB, res.Behind); err != nil || len(skipped) > 0 {
		t.Fatalf("advance: skipped %v, %v", skipped, err)
	}
	wantQueueState(t, k, "a", "b")
}

// TestClaimCountsItsTenants: a claim subtracts the jobs it moved, and only those, from their
// tenants' queue counts, in its own statement when it takes several jobs a tenant and through the
// trigger otherwise (migration 0025): a tenant left with queued jobs keeps its head behind for
// AdvanceHeads, a tenant left with none loses its head, and a job taken elsewhere meanwhile is not
// subtracted. The stamp has nanoseconds, which claimed_at does not keep, so the trigger compares
// a truncated stamp (else the jobs would be counted twice). MariaDB compares equal without the
// truncation too: that part guards a server that rounds, and cannot fail here. The second claim
// runs on the first one's connection with the same stamp.
func TestClaimCountsItsTenants(t *testing.T) {
	k := newFixture(t)
	var a, b []int64
	for range 5 {
		a = append(a, k.insert(jobSpec{tenant: "a"}))
	}
	for range 3 {
		b = append(b, k.insert(jobSpec{tenant: "b"}))
	}
	c := k.insert(jobSpec{tenant: "c", version: 1})
	tx := k.beginConn()
	claim := func(what string, stamp time.Time, jobs []int64, tenants []string) store.Claimed {
		t.Helper()
		p := store.ClaimParams{DrainerID: "d9", Stamp: stamp, LeaseUntil: k.now.Add(10 * time.Second),
			NonceExpiresAt: k.now.Add(time.Minute)}
		for i, id := range jobs {
			p.Jobs = append(p.Jobs, store.ClaimJob{ID: id, Tenant: tenants[i],
				NonceSHA256: store.HashNonce(fmt.Sprint(what, id))})
		}
		if _, err := store.LockClaims(k.ctx, tx, false); err != nil {
			t.Fatal(err)
		}
		got, err := (&store.Store{}).ClaimJobs(k.ctx, tx, p)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range jobs {
			if got.Got[id] != (id != c) { // c moved on to version 1
				t.Fatalf("%s: claimed %v", what, got.Got)
			}
		}
		if r := k.row(jobs[0]); !r.ClaimedAt.Equal(stamp.Truncate(time.Microsecond)) {
			t.Errorf("%s: claimed_at %v, want %v", what, r.ClaimedAt, stamp.Truncate(time.Microsecond))
		}
		return got
	}
	want := func(what, tenant string, queued int, head int64) {
		t.Helper()
		if qs := readQueueState(t, k.db.DB, tenant); qs.queued != queued || qs.headID != head || qs.listed != (head != 0) {
			t.Errorf("%s: tenant %s: %+v, want %d queued, head %d", what, tenant, qs, queued, head)
		}
	}

	// Six jobs of three tenants: counted by the claim.
	stamp := k.now.Add(time.Millisecond + 789*time.Nanosecond)
	got := claim("by the claim", stamp, []int64{a[0], a[1], a[2], b[0], b[1], c},
		[]string{"a", "a", "a", "b", "b", "c"})
	want("by the claim", "a", 2, a[0])
	want("by the claim", "b", 1, b[0])
	want("by the claim", "c", 1, c)
	if len(got.Behind) != 2 {
		t.Errorf("heads left behind: %v, want a and b", got.Behind)
	}
	if skipped, err := store.AdvanceHeads(k.ctx, k.db.DB, got.Behind); err != nil || len(skipped) > 0 {
		t.Fatalf("advance: skipped %v, %v", skipped, err)
	}
	want("advanced", "a", 2, a[3])
	want("advanced", "b", 1, b[2])
	wantQueueState(t, k, "a", "b", "c")

	// One job a tenant: counted by the trigger, on the first claim's connection and with its
	// stamp (an injected clock's): the trigger must not take these jobs for that claim's.
	got = claim("by the trigger", stamp, []int64{a[3], b[2], c}, []string{"a", "b", "c"})
	want("by the trigger", "a", 1, a[3])
	want("by the trigger", "b", 0, 0)
	want("by the trigger", "c", 1, c)
	if len(got.Behind) != 1 || got.Behind[0] != "a" {
		t.Errorf("heads left behind: %v, want [a]", got.Behind)
	}
	if skipped, err := store.AdvanceHeads(k.ctx, k.db.DB, got.Behind); err != nil || len(skipped) > 0 {
		t.Fatalf("advance: skipped %v, %v", skipped, err)
	}
	want("advanced", "a", 1, a[4])
	wantQueueState(t, k, "a", "b", "c")
}

// TestClaimCountReadsItsJobsOnly: a claim's count of the jobs it moved reads them by id, however
// many jobs their tenants have. Left to itself, with the statistics of the table from before a
// burst of admissions that InnoDB has not sampled again, MariaDB made it a lateral derived table
// that walked every job of each tenant in the tenants table through an index on tenant (found in
// a drain of 4 tenants of 5,000 jobs each: 567 us a claimed job instead of 64); the handler
// counters do not show the walk (index condition pushdown skips the entries), the plan does.
func TestClaimCountReadsItsJobsOnly(t *testing.T) {
	k := newFixture(t)
	k.exec("ALTER TABLE jobs STATS_AUTO_RECALC = 0")
	k.exec("ANALYZE TABLE jobs")
	var ids []int64
	var hashes []any
	for i, tenant := range []string{"d0", "d1", "d2", "d3"} {
		k.insert(jobSpec{tenant: tenant})
		k.exec("INSERT INTO jobs (tenant, status, queued_at) SELECT ?, 'queued', ? FROM seq_1_to_1000", tenant, k.now)
		first := k.count("SELECT MIN(id) FROM jobs WHERE tenant = ?", tenant)
		ids = append(ids, first, k.count("SELECT MIN(id) FROM jobs WHERE tenant = ? AND id > ?", tenant, first))
		hashes = append(hashes, store.HashNonce(strconv.Itoa(2*i)), store.HashNonce(strconv.Itoa(2*i+1)))
	}
	q, args := store.ClaimCountSQL(ids, hashes)
	jobsByID := false
	for _, row := range k.db.Explain(t, q, args...) {
		if strings.Contains(row["select_type"], "LATERAL") {
			t.Errorf("the count is planned as a lateral derived table: %v", row)
		}
		if row["table"] == "jobs" {
			jobsByID = row["key"] == "PRIMARY"
			if !jobsByID {
				t.Errorf("the count reads jobs through %q, not by id: %v", row["key"], row)
			}
		}
	}
	if !jobsByID {
		t.Error("the plan reads no jobs by id")
	}
}

// TestClaimUpdateReadsItsJobsByID: the claim's UPDATE finds its jobs by id, however short the
// queue. Left to itself, the optimizer walked the lease index's queued range instead once fewer
// jobs were queued than the claim names (a drain's last claims, a claim that takes every queued
// job), locking every queued job, and it weighs the status indexes' queued ranges (index dives)
// on every claim.
func TestClaimUpdateReadsItsJobsByID(t *testing.T) {
	k := newFixture(t)
	var jobs []store.ClaimJob
	for i := range 64 {
		spec := jobSpec{tenant: "t" + strconv.Itoa(i%4), status: job.Succeeded}
		if i >= 62 {
			spec.status = job.Queued
		}
		jobs = append(jobs, store.ClaimJob{ID: k.insert(spec), Tenant: spec.tenant, NonceSHA256: store.HashNonce(strconv.Itoa(i))})
	}
	q, args := store.ClaimUpdateSQL(store.ClaimParams{DrainerID: "d1", Stamp: k.now, LeaseUntil: k.now.Add(time.Minute),
		NonceExpiresAt: k.now.Add(time.Minute), Jobs: jobs})
	plan := k.db.Explain(t, q, args...)
	if len(plan) != 1 || plan[0]["key"] != "PRIMARY" || plan[0]["possible_keys"] != "PRIMARY" {
		t.Errorf("the claim's UPDATE is planned as %v; want the primary key alone", plan)
	}
}

// TestOpenClaim: a claim left open (OpenClaim) holds the claim lock and its jobs and shows nothing
// to others, and writes no audit row, until CommitClaim writes the claim's audit rows and commits:
// an outcome committed meanwhile beside it (the outcomes the claim counted out of flight) comes
// first in the trail's order (at, id), as it did in the jobs' own. With the audit off, CommitClaim
// only commits.
func TestOpenClaim(t *testing.T) {
	for _, auditOff := range []bool{false, true} {
		t.Run(fmt.Sprintf("audit off %v", auditOff), func(t *testing.T) {
			k := newFixture(t)
			st := &store.Store{Actor: "d9", AuditOff: auditOff}
			done := k.insert(jobSpec{tenant: "a", status: job.Dispatched, version: 1})
			queued := k.insert(jobSpec{tenant: "b"})
			taken := k.insert(jobSpec{tenant: "b", status: job.Canceled})
			tx := k.beginConn()
			if _, err := store.LockClaims(k.ctx, tx, false); err != nil {
				t.Fatal(err)
			}
			p := store.ClaimParams{DrainerID: "d9", Stamp: k.now, LeaseUntil: k.now.Add(time.Minute), NonceExpiresAt: k.now.Add(time.Minute),
				Jobs: []store.ClaimJob{{ID: queued, Tenant: "b", NonceSHA256: store.HashNonce("q")},
					{ID: taken, Tenant: "b", NonceSHA256: store.HashNonce("t")}}}
			got, err := st.OpenClaim(k.ctx, tx, p)
			if err != nil {
				t.Fatal(err)
			}
			if !got.Got[queued] || got.Got[taken] {
				t.Errorf("claimed %v; want the queued job alone", got.Got)
			}
			if r := k.row(queued); r.Status != job.Queued {
				t.Errorf("the open claim's job reads %s from outside; want queued until the commit", r.Status)
			}
			if !k.claimLockHeld() {
				t.Error("the open claim does not hold the claim lock")
			}
			k.wantLocked("while the claim is open", []int64{done, queued}, queued)
			if n := k.count("SELECT COUNT(*) FROM audit_events"); n != 0 {
				t.Errorf("%d audit rows before the claim's commit", n)
			}

			beside := k.beginConn()
			rows, err := store.LockJobs(k.ctx, beside, []int64{done})
			if err != nil || len(rows) != 1 {
				t.Fatalf("lock the outcome's job: %v, %v", rows, err)
			}
			if _, err := st.FinishManyCommit(k.ctx, beside, k.now, []store.Finishing{{Row: rows[0],
				Outcome: store.Outcome{Status: job.Succeeded, Reported: true}}}); err != nil {
				t.Fatal(err)
			}
			if err := st.CommitClaim(k.ctx, tx, p); err != nil {
				t.Fatal(err)
			}
			if r := k.row(queued); r.Status != job.Dispatched || r.Version != 1 {
				t.Errorf("the claimed job: %s, version %d; want dispatched, version 1", r.Status, r.Version)
			}
			if r := k.row(taken); r.Status != job.Canceled {
				t.Errorf("the job taken meanwhile: %s; want it left canceled", r.Status)
			}
			if k.claimLockHeld() {
				t.Error("the claim lock is still held after the commit")
			}
			var trail []int64
			rs, err := k.db.QueryContext(k.ctx, "SELECT job_id FROM audit_events WHERE event = 'transition' ORDER BY at, id")
			if err != nil {
				t.Fatal(err)
			}
			for rs.Next() {
				var id int64
				if err := rs.Scan(&id); err != nil {
					t.Fatal(err)
				}
				trail = append(trail, id)
			}
			if err := rs.Close(); err != nil {
				t.Fatal(err)
			}
			want := []int64{done, queued}
			if auditOff {
				want = nil
			}
			if !slices.Equal(trail, want) {
				t.Errorf("the trail's transitions, in order, are of jobs %v; want %v", trail, want)
			}
		})
	}
}

// TestRequeues: a batch sends a job back to queued unless every requeue in it has spent its
// dispatch budget (it fails instead), as FinishMany decides.
func TestRequeues(t *testing.T) {
	row := store.Row{Job: job.Job{ID: 1, Status: job.Dispatched}}
	row.DispatchFailures = 2
	done := store.Finishing{Row: row, Outcome: store.Outcome{Status: job.Succeeded, Reported: true}}
	requeue := store.Finishing{Row: row, Outcome: store.Outcome{Status: job.Queued, CountFailure: true, Budget: 5}}
	spent := store.Finishing{Row: row, Outcome: store.Outcome{Status: job.Queued, CountFailure: true, Budget: 3}}
	for _, tc := range []struct {
		items []store.Finishing
		want  bool
	}{
		{nil, false},
		{[]store.Finishing{done}, false},
		{[]store.Finishing{done, requeue}, true},
		{[]store.Finishing{spent, done}, false},
	} {
		if got := store.Requeues(tc.items); got != tc.want {
			t.Errorf("Requeues(%+v) = %v, want %v", tc.items, got, tc.want)
		}
	}
}
