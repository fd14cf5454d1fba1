package integration_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/apitest"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/memcachedtest"
)

// auditRow is the part of an audit_events row the tests compare.
type auditRow struct {
	event, actor, from, to, code, scope string
	job                                 int64
}

func (r auditRow) String() string {
	return fmt.Sprintf("%s %s→%s by %q code %q scope %q job %d", r.event, r.from, r.to, r.actor, r.code, r.scope, r.job)
}

// readAudit reads the audit rows of db matching where, in id order.
func readAudit(t testing.TB, db *sql.DB, where string, args ...any) []auditRow {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), `SELECT event, actor, COALESCE(from_status, ''),
		COALESCE(to_status, ''), COALESCE(error_code, ''), COALESCE(scope, ''), COALESCE(job_id, 0)
		FROM audit_events WHERE `+where+` ORDER BY id`, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []auditRow
	for rows.Next() {
		var r auditRow
		if err := rows.Scan(&r.event, &r.actor, &r.from, &r.to, &r.code, &r.scope, &r.job); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func sameRows(got, want []auditRow) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

// TestAuditAdmissionCommitsWithItsJob: a committed admission leaves exactly one admitted event,
// naming its job and caller; one whose connection breaks before the server commits leaves
// none; one whose commit answer is lost leaves the one event with its job.
func TestAuditAdmissionCommitsWithItsJob(t *testing.T) {
	t.Parallel()
	var fault atomic.Value
	fault.Store("")
	f := apitest.Setup(t, apitest.Options{Faults: &gate.Faults{Commit: func(_ context.Context, tx gate.Tx) error {
		name, _ := fault.Load().(string)
		return apitest.CommitWithFault(tx, name)
	}}})
	for _, c := range []struct {
		fault string
		jobs  int
	}{{"", 1}, {"commit-rolled-back", 0}, {"commit-lost", 1}} {
		tenant := apitest.UniqueTenant("audited")
		fault.Store(c.fault)
		f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": tenant})
		fault.Store("")
		var id int64
		err := f.DB.QueryRowContext(context.Background(), "SELECT id FROM jobs WHERE tenant = ?", tenant).Scan(&id)
		if (err == nil) != (c.jobs == 1) {
			t.Fatalf("fault %q: job read: %v, want %d job(s)", c.fault, err, c.jobs)
		}
		got := readAudit(t, f.DB.DB, "tenant = ?", tenant)
		var want []auditRow
		if c.jobs == 1 {
			want = []auditRow{{event: "admitted", actor: "star", to: "queued", job: id}}
		}
		if !sameRows(got, want) {
			t.Errorf("fault %q: audit rows %v, want %v", c.fault, got, want)
		}
	}
}

// TestAuditBatchNamesEachJob: a batch's jobs, of several tenants in one INSERT with their
// pokes, each get one admitted event naming that job.
func TestAuditBatchNamesEachJob(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	a, b := apitest.UniqueTenant("batch-a"), apitest.UniqueTenant("batch-b")
	r := f.Do(t, http.MethodPost, "/v1/jobs:batch", apitest.StarToken, map[string]any{"jobs": []map[string]any{
		{"tenant": a}, {"tenant": b}, {"tenant": a}, {"tenant": b, "idempotency_key": "k"}}})
	if r.Status != 200 {
		t.Fatalf("batch: HTTP %d %s", r.Status, r.Raw)
	}
	rows, err := f.DB.QueryContext(context.Background(), `SELECT j.id, COUNT(e.id), MIN(e.tenant = j.tenant)
		FROM jobs j LEFT JOIN audit_events e ON e.job_id = j.id AND e.event = 'admitted'
		WHERE j.tenant IN (?, ?) GROUP BY j.id`, a, b)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var id, events int64
		var same sql.NullBool
		if err := rows.Scan(&id, &events, &same); err != nil {
			t.Fatal(err)
		}
		if events != 1 || !same.Bool {
			t.Errorf("job %d: %d admitted events (same tenant %v), want 1", id, events, same)
		}
		n++
	}
	if n != 4 {
		t.Errorf("%d jobs, want 4", n)
	}
}

// TestAuditRefusals: every refusal code gets its event: depth caps (queue_full, with the
// rejected row) in the admission's transaction; rate_limited and capacity_exceeded, which write
// nothing else, through the audit queue once it is flushed; a replay too; shadow mode's
// let-through refusals as shadow_refused. Validation failures are not audited.
func TestAuditRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	probe := apitest.Setup(t, apitest.Options{})
	q, err := store.NewAuditQueue(store.AuditQueueConfig{DB: probe.DB.DB})
	if err != nil {
		t.Fatal(err)
	}
	f := apitest.SetupOn(t, probe, apitest.Options{Memcached: memcachedtest.Shared(t), Audit: q})
	f.SetConfig(t, map[string]any{"admission_rate_per_minute": 1, "tenant_queue_depth": 2, "global_in_flight": 0})
	tenant := apitest.UniqueTenant("refused")
	admit := func(body map[string]any, status int, code string) harness.Response {
		t.Helper()
		body["tenant"] = tenant
		r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, body)
		if r.Status != status || (code != "" && r.Body["error_code"] != code) {
			t.Fatalf("admit %v: HTTP %d %s, want %d %s", body, r.Status, r.Raw, status, code)
		}
		return r
	}
	first := apitest.JobID(t, admit(map[string]any{"idempotency_key": "k1"}, 202, "").Body)
	admit(map[string]any{"idempotency_key": "k1"}, 200, "")                                                // replayed
	admit(map[string]any{}, 429, "rate_limited")                                                           // the minute's one unit is spent
	admit(map[string]any{"rate_key": strings.Repeat("k", gate.MaxRateKeyBytes+1)}, 400, "invalid_request") // not audited
	f.SetConfig(t, map[string]any{"admission_rate_per_minute": 0})
	admit(map[string]any{"queue": false}, 429, "capacity_exceeded") // global_in_flight 0: paused
	admit(map[string]any{}, 202, "")
	rejected := admit(map[string]any{}, 429, "queue_full")
	f.SetConfig(t, map[string]any{"admission_mode": "shadow"})
	shadowed := apitest.JobID(t, admit(map[string]any{}, 202, "").Body)

	// The queue holds the refusals until flushed.
	if n, err := q.RunOnce(ctx); err != nil || n != 3 {
		t.Fatalf("flush: %d events, %v; want the 3 queued (replay, rate_limited, capacity_exceeded)", n, err)
	}
	var second int64
	if err := f.DB.QueryRowContext(ctx, "SELECT MAX(id) FROM jobs WHERE tenant = ? AND status = 'queued' AND id < ?", tenant, shadowed).Scan(&second); err != nil {
		t.Fatal(err)
	}
	rejectedID := int64(rejected.Body["id"].(float64))
	got := readAudit(t, f.DB.DB, "tenant = ?", tenant)
	// The flushed events come after the admissions' own rows; compare the two kinds apart.
	var inTx, queued []auditRow
	for _, r := range got {
		if r.event == "replayed" || r.code == "rate_limited" || r.code == "capacity_exceeded" {
			queued = append(queued, r)
		} else {
			inTx = append(inTx, r)
		}
	}
	wantTx := []auditRow{
		{event: "admitted", actor: "star", to: "queued", job: first},
		{event: "admitted", actor: "star", to: "queued", job: second},
		{event: "refused", actor: "star", to: "rejected", code: "queue_full", scope: "tenant", job: rejectedID},
		{event: "shadow_refused", actor: "star", to: "queued", job: shadowed},
	}
	wantQueued := []auditRow{
		{event: "replayed", actor: "star", to: "queued", job: first},
		{event: "refused", actor: "star", code: "rate_limited"},
		{event: "refused", actor: "star", code: "capacity_exceeded", scope: "global"},
	}
	if !sameRows(inTx, wantTx) || !sameRows(queued, wantQueued) {
		t.Errorf("audit rows:\n%v\n%v\nwant\n%v\n%v", inTx, queued, wantTx, wantQueued)
	}
}

// TestAuditQueueFullDrops: a full audit queue drops the event rather than block, and counts it
// in sluice_audit_dropped_total.
func TestAuditQueueFullDrops(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	reg := prometheus.NewRegistry()
	q, err := store.NewAuditQueue(store.AuditQueueConfig{DB: f.DB.DB, Size: 2, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		q.Add(store.AuditEvent{Event: store.EventRefused, Tenant: "full", ErrorCode: "rate_limited"})
	}
	if q.Dropped() != 1 || harness.Counter(t, reg, "sluice_audit_dropped_total") != 1 {
		t.Errorf("dropped %d (counter %v), want 1", q.Dropped(), harness.Counter(t, reg, "sluice_audit_dropped_total"))
	}
	// Run flushes what the queue holds, and what is left when it stops.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { q.Run(ctx); close(done) }()
	harness.WaitFor(t, 10*time.Second, "the queue's events to be written", func() (bool, error) {
		return len(readAudit(t, f.DB.DB, "tenant = 'full'")) == 2, nil
	})
	q.Add(store.AuditEvent{Event: store.EventRefused, Tenant: "full", ErrorCode: "capacity_exceeded"})
	cancel()
	<-done
	if n := len(readAudit(t, f.DB.DB, "tenant = 'full'")); n != 3 {
		t.Errorf("%d events written after Run stopped, want 3", n)
	}
}

// TestAuditJobEventsScope: GET /v1/jobs/{id}/events answers a producer for its own tenants'
// jobs only (another tenant's job is 404, like a missing one) and an admin for any job;
// GET /v1/audit is admin only, newest first, and pages with its cursor.
func TestAuditJobEventsScope(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	var ids []int64
	for i := 0; i < 3; i++ {
		ids = append(ids, apitest.JobID(t, f.Do(t, http.MethodPost, "/v1/jobs", apitest.AlphaToken, map[string]any{"tenant": "acme"}).Body))
	}
	path := "/v1/jobs/" + strconv.FormatInt(ids[0], 10) + "/events"
	for _, c := range []struct {
		token  string
		status int
	}{{apitest.AlphaToken, 200}, {apitest.AdminToken, 200}, {apitest.BetaToken, 404}, {apitest.ExecToken, 403}} {
		r := f.Do(t, http.MethodGet, path, c.token, nil)
		if r.Status != c.status {
			t.Errorf("GET %s: HTTP %d %s, want %d", path, r.Status, r.Raw, c.status)
			continue
		}
		if c.status == 200 {
			evs, _ := r.Body["events"].([]any)
			if len(evs) != 1 || evs[0].(map[string]any)["event"] != "admitted" || evs[0].(map[string]any)["actor"] != "alpha" {
				t.Errorf("GET %s: %s, want the one admitted event by alpha", path, r.Raw)
			}
		}
	}
	if r := f.Do(t, http.MethodGet, "/v1/jobs/999999/events", apitest.AlphaToken, nil); r.Status != 404 {
		t.Errorf("events of a missing job: HTTP %d, want 404", r.Status)
	}
	if r := f.Do(t, http.MethodGet, "/v1/audit", apitest.AlphaToken, nil); r.Status != 403 {
		t.Errorf("GET /v1/audit as a producer: HTTP %d, want 403", r.Status)
	}
	for _, bad := range []string{"event=nope", "since=yesterday", "limit=0", "cursor=zz"} {
		if r := f.Do(t, http.MethodGet, "/v1/audit?"+bad, apitest.AdminToken, nil); r.Status != 400 {
			t.Errorf("GET /v1/audit?%s: HTTP %d, want 400", bad, r.Status)
		}
	}
	// A redrive's admission names the operator who redrove, and the job it retries.
	if _, err := f.DB.ExecContext(context.Background(), "UPDATE jobs SET status = 'failed', version = version + 2 WHERE id = ?", ids[0]); err != nil {
		t.Fatal(err)
	}
	n, _, err := f.Admin.Redrive(context.Background(), ids[0])
	if err != nil {
		t.Fatal(err)
	}
	evs, err := f.Admin.JobEvents(context.Background(), n.ID)
	if err != nil || len(evs) != 1 || evs[0].Actor != "admin" || evs[0].Event != "admitted" ||
		string(evs[0].Detail) == "" || !strings.Contains(string(evs[0].Detail), fmt.Sprintf(`"retry_of":%d`, ids[0])) {
		t.Errorf("the redriven job's events: %+v, %v; want one admitted by admin with retry_of %d", evs, err, ids[0])
	}
	var seen []int64
	next := "/v1/audit?tenant=acme&event=admitted&since=2000-01-01T00:00:00Z&limit=2"
	for page := 0; next != "" && page < 5; page++ {
		r := f.Do(t, http.MethodGet, next, apitest.AdminToken, nil)
		if r.Status != 200 {
			t.Fatalf("GET %s: HTTP %d %s", next, r.Status, r.Raw)
		}
		for _, e := range r.Body["events"].([]any) {
			seen = append(seen, int64(e.(map[string]any)["job_id"].(float64)))
		}
		next = ""
		if c, ok := r.Body["next_cursor"].(string); ok {
			next = "/v1/audit?tenant=acme&limit=2&cursor=" + c
		}
	}
	if len(seen) != 4 || seen[0] != n.ID || seen[1] != ids[2] || seen[2] != ids[1] || seen[3] != ids[0] {
		t.Errorf("audit pages listed jobs %v, want %d then %v newest first", seen, n.ID, ids)
	}
}

// TestAuditStoryAfterSIGKILL: a drainer is SIGKILLed while it holds a running job; another
// drainer recovers it. The job's events tell what really happened, naming the drainers: claimed
// by the victim, started by the executor, lost by the rescuer.
func TestAuditStoryAfterSIGKILL(t *testing.T) {
	t.Parallel()
	bin := harness.BuildSluice(t)
	env := harness.Start(t, harness.Options{API: true, Relay: true})
	env.SetConfig(t, func(c *config.Config) { c.LeaseSeconds = 2 })

	victim := env.StartDrainer(t, bin, "victim")
	running := env.Admit(t, "t", map[string]any{"sleep_ms": 6000})
	harness.WaitFor(t, 10*time.Second, "the job to run", func() (bool, error) {
		return drainertest.ReadJob(t, env.DB.DB, running).Status == "running", nil
	})
	victim.Kill()
	env.StartDrainer(t, bin, "rescuer")
	harness.WaitFor(t, 30*time.Second, "recovery to mark the job lost", func() (bool, error) {
		return drainertest.ReadJob(t, env.DB.DB, running).Status == "lost", nil
	})
	want := []auditRow{
		{event: "admitted", actor: "producer", to: "queued", job: running},
		{event: "transition", actor: "victim", from: "queued", to: "dispatched", job: running},
		{event: "transition", actor: "executor", from: "dispatched", to: "running", job: running},
		{event: "transition", actor: "rescuer", from: "running", to: "lost", code: "lease_expired", job: running},
	}
	if got := readAudit(t, env.DB.DB, "job_id = ?", running); !sameRows(got, want) {
		t.Errorf("the job's events:\n%v\nwant\n%v", got, want)
	}
	// The API tells the same story.
	r := env.Do(t, http.MethodGet, "/v1/jobs/"+strconv.FormatInt(running, 10)+"/events", harness.AdminToken, nil)
	if evs, _ := r.Body["events"].([]any); r.Status != 200 || len(evs) != len(want) {
		t.Errorf("GET the job's events: HTTP %d %s, want %d events", r.Status, r.Raw, len(want))
	}
}

// TestAuditStoryRequeuedAfterSIGKILL: a drainer is SIGKILLed while an executor that never
// confirms holds its dispatch; the rescuer requeues the job and dispatches it again. The events
// name each drainer in turn.
func TestAuditStoryRequeuedAfterSIGKILL(t *testing.T) {
	t.Parallel()
	bin := harness.BuildSluice(t)
	var dispatches atomic.Int32
	release := make(chan struct{})
	holder := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dispatches.Add(1)
		select { // hold the dispatch, unconfirmed, until the caller goes away or the test ends
		case <-r.Context().Done():
		case <-release:
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(holder.Close)
	t.Cleanup(func() { close(release) }) // before holder.Close, which waits for held requests
	env := harness.Start(t, harness.Options{API: true, Relay: true, ExecutorURL: holder.URL + "/dispatch"})
	env.SetConfig(t, func(c *config.Config) { c.LeaseSeconds = 2 })

	victim := env.StartDrainer(t, bin, "victim")
	id := env.Admit(t, "t", nil)
	harness.WaitFor(t, 10*time.Second, "the executor to hold the dispatch", func() (bool, error) {
		return dispatches.Load() == 1, nil
	})
	victim.Kill()
	env.StartDrainer(t, bin, "rescuer")
	harness.WaitFor(t, 30*time.Second, "the rescuer to dispatch the job again", func() (bool, error) {
		return dispatches.Load() == 2, nil
	})
	want := []auditRow{
		{event: "admitted", actor: "producer", to: "queued", job: id},
		{event: "transition", actor: "victim", from: "queued", to: "dispatched", job: id},
		{event: "transition", actor: "rescuer", from: "dispatched", to: "queued", code: "lease_expired", job: id},
		{event: "transition", actor: "rescuer", from: "queued", to: "dispatched", job: id},
	}
	if got := readAudit(t, env.DB.DB, "job_id = ?", id); !sameRows(got, want) {
		t.Errorf("the job's events:\n%v\nwant\n%v", got, want)
	}
}

// starting is an executor that confirms each dispatch's start through the API, then answers it
// done.
func starting(exec *client.Client) *drainertest.Executor {
	return &drainertest.Executor{Answer: func(ctx context.Context, _ int, d executor.Dispatch) executor.Answer {
		if _, err := exec.Start(ctx, d.JobID, d.Nonce, ""); err != nil {
			return executor.Answer{Kind: executor.Done, Status: "failed", ErrorMessage: err.Error()}
		}
		return executor.Answer{Kind: executor.Done, Status: "succeeded"}
	}}
}

// TestAuditOff: the same admissions (single, replayed, batch, refused by a depth cap), a cancel
// and a drain whose executor confirms each start write their audit rows with the audit on, and
// none with gate.Config.AuditOff and drainer.Config.AuditOff (the benchmarks' comparison); the
// jobs end the same either way.
func TestAuditOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, off := range []bool{false, true} {
		probe := apitest.Setup(t, apitest.Options{})
		q, err := store.NewAuditQueue(store.AuditQueueConfig{DB: probe.DB.DB})
		if err != nil {
			t.Fatal(err)
		}
		f := apitest.SetupOn(t, probe, apitest.Options{Audit: q, AuditOff: off})
		f.SetConfig(t, map[string]any{"tenant_queue_depth": 3})
		first := apitest.JobID(t, f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": "acme", "idempotency_key": "k1"}).Body)
		if r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": "acme", "idempotency_key": "k1"}); r.Status != 200 {
			t.Fatalf("replay: HTTP %d %s", r.Status, r.Raw)
		}
		batch, err := f.Star.AdmitBatch(ctx, []client.AdmitRequest{{Tenant: "acme"}, {Tenant: "acme"}})
		if err != nil || batch[0].Status != 202 || batch[1].Status != 202 {
			t.Fatalf("batch: %+v, %v", batch, err)
		}
		if r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": "acme"}); r.Body["error_code"] != "queue_full" {
			t.Fatalf("over the depth cap: HTTP %d %s, want queue_full", r.Status, r.Raw)
		}
		canceled := *batch[0].Job
		if _, err := f.Star.Cancel(ctx, canceled.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := q.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		d, err := drainer.New(drainer.Config{DB: f.DB.DB, Executor: starting(f.Exec), ID: "d-audit", AuditOff: off})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		harness.WaitFor(t, 30*time.Second, "the drained jobs' outcomes", func() (bool, error) {
			var n int
			err := f.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE status = 'succeeded'").Scan(&n)
			return n == 2, err
		})
		d.Stop(ctx)

		var states string
		if err := f.DB.QueryRowContext(ctx, "SELECT GROUP_CONCAT(status ORDER BY id) FROM jobs").Scan(&states); err != nil {
			t.Fatal(err)
		}
		if states != "succeeded,canceled,succeeded,rejected" {
			t.Errorf("audit off %v: jobs %s", off, states)
		}
		got := readAudit(t, f.DB.DB, "1")
		if off {
			if len(got) != 0 {
				t.Errorf("audit off: %d audit rows: %v", len(got), got)
			}
			continue
		}
		// With the audit on, every decision and transition has its row.
		count := map[string]int{}
		for _, r := range got {
			count[r.event+" "+r.to]++
		}
		want := map[string]int{"admitted queued": 3, "replayed queued": 1, "refused rejected": 1, "transition canceled": 1,
			"transition dispatched": 2, "transition running": 2, "transition succeeded": 2}
		if fmt.Sprint(count) != fmt.Sprint(want) {
			t.Errorf("audit on: rows %v, want %v", count, want)
		}
		if evs := readAudit(t, f.DB.DB, "job_id = ?", first); len(evs) != 5 {
			t.Errorf("audit on: job %d's story %v, want admitted, replayed, dispatched, running, succeeded", first, evs)
		}
	}
}

// TestAuditListingBounded: GET /v1/audit?event= examines at most store.AuditScanRows events per
// request: a rare event older than that many answers an empty page with a cursor, and the next
// page finds it and ends.
func TestAuditListingBounded(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	if err := store.InsertAudit(context.Background(), f.DB.DB, []store.AuditEvent{{Event: store.EventRefused, Tenant: "acme"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.DB.ExecContext(context.Background(), fmt.Sprintf(`INSERT INTO audit_events (event, tenant)
		SELECT 'admitted', 'acme' FROM seq_1_to_%d`, store.AuditScanRows)); err != nil {
		t.Fatal(err)
	}
	r := f.Do(t, http.MethodGet, "/v1/audit?event=refused&limit=5", apitest.AdminToken, nil)
	c, _ := r.Body["next_cursor"].(string)
	if r.Status != 200 || len(r.Body["events"].([]any)) != 0 || c == "" {
		t.Fatalf("first page: HTTP %d %s, want no events and a cursor", r.Status, r.Raw)
	}
	r = f.Do(t, http.MethodGet, "/v1/audit?event=refused&limit=5&cursor="+c, apitest.AdminToken, nil)
	if evs, _ := r.Body["events"].([]any); r.Status != 200 || len(evs) != 1 || r.Body["next_cursor"] != nil {
		t.Errorf("second page: HTTP %d %s, want the refusal and no cursor", r.Status, r.Raw)
	}
}

// TestAuditJobEventsActorsForProducers: GET /v1/jobs/{id}/events shows a producer its own token
// name as the actor of what it did, and for everyone else only what kind of actor it was: the
// role of a token (admin, executor, producer) or drainer for a drainer's id (host-pid), which
// would otherwise tell a producer the operators' token names and the hosts sluice runs on
// (issue 30, finding 12a). An admin sees every name.
func TestAuditJobEventsActorsForProducers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := apitest.Setup(t, apitest.Options{})
	// Admitted by an admin, canceled by alpha.
	byAdmin := apitest.JobID(t, f.Do(t, http.MethodPost, "/v1/jobs", apitest.AdminToken, map[string]any{"tenant": "acme"}).Body)
	if r := f.Do(t, http.MethodDelete, "/v1/jobs/"+strconv.FormatInt(byAdmin, 10), apitest.AlphaToken, nil); r.Status != 200 {
		t.Fatalf("cancel: HTTP %d %s", r.Status, r.Raw)
	}
	// Reported by the executor.
	byExec, err := apitest.DispatchedJob(ctx, f.DB.DB, "acme", "n-exec")
	if err != nil {
		t.Fatal(err)
	}
	if r := f.Do(t, http.MethodPost, "/v1/jobs/"+strconv.FormatInt(byExec, 10)+"/complete", apitest.ExecToken,
		map[string]any{"nonce": "n-exec", "status": "succeeded"}); r.Status != 200 {
		t.Fatalf("complete: HTTP %d %s", r.Status, r.Raw)
	}
	// Ended by a drainer, which names itself by its id.
	byDrainer, err := apitest.DispatchedJob(ctx, f.DB.DB, "acme", "n-drainer")
	if err != nil {
		t.Fatal(err)
	}
	tx, err := f.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	now := time.Now().UTC().Truncate(time.Microsecond)
	if _, _, err := (&store.Store{Actor: "web-7.example.net-4242"}).Complete(ctx, tx, now, byDrainer,
		store.Completion{Nonce: "n-drainer", Status: "failed"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	actors := func(token string, id int64) []string {
		t.Helper()
		r := f.Do(t, http.MethodGet, "/v1/jobs/"+strconv.FormatInt(id, 10)+"/events", token, nil)
		if r.Status != 200 {
			t.Fatalf("events of job %d: HTTP %d %s", id, r.Status, r.Raw)
		}
		var out []string
		for _, e := range r.Body["events"].([]any) {
			a, _ := e.(map[string]any)["actor"].(string)
			out = append(out, a)
		}
		return out
	}
	for _, c := range []struct {
		who, token string
		id         int64
		want       []string
	}{
		{"alpha", apitest.AlphaToken, byAdmin, []string{"admin", "alpha"}},
		{"star", apitest.StarToken, byAdmin, []string{"admin", "producer"}},
		{"admin", apitest.AdminToken, byAdmin, []string{"admin", "alpha"}},
		{"alpha", apitest.AlphaToken, byExec, []string{"executor"}},
		{"admin", apitest.AdminToken, byExec, []string{"exec"}},
		{"alpha", apitest.AlphaToken, byDrainer, []string{"drainer"}},
		{"admin", apitest.AdminToken, byDrainer, []string{"web-7.example.net-4242"}},
	} {
		if got := actors(c.token, c.id); strings.Join(got, ",") != strings.Join(c.want, ",") {
			t.Errorf("%s reads job %d's actors as %q, want %q", c.who, c.id, got, c.want)
		}
	}
}
