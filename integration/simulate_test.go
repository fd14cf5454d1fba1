package integration_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer/simulate"
	"github.com/sluicehq/sluice/integration/apitest"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/memcachedtest"
	"github.com/sluicehq/sluice/integration/wait"
)

// simBurst is a tenant's jobs in a wave, each with the executor's sleep (its service time) in
// its payload.
type simBurst struct {
	tenant string
	sleeps []int // ms, one a job
}

// simRefusalKey is simulate.TenantResult.Refused's key.
func simRefusalKey(code, scope string) string {
	if scope == "" {
		return code
	}
	return code + ":" + scope
}

// postSimWave admits the bursts of several tenants at once: one POST /v1/jobs:batch, one
// transaction, the bursts' items in order. It adds the jobs admitted to admitted and the refusals
// answered, by "code" or "code:scope", to refused, by tenant.
func postSimWave(t *testing.T, env *harness.Env, bursts []simBurst, admitted map[string]int, refused map[string]map[string]int) {
	t.Helper()
	var jobs []map[string]any
	var tenantOf []string
	for _, b := range bursts {
		for _, ms := range b.sleeps {
			jobs = append(jobs, map[string]any{"tenant": b.tenant, "payload": map[string]any{"sleep_ms": ms}})
			tenantOf = append(tenantOf, b.tenant)
		}
	}
	r := env.Do(t, http.MethodPost, "/v1/jobs:batch", harness.ProducerToken, map[string]any{"jobs": jobs})
	if r.Status != http.StatusOK {
		t.Fatalf("batch of %d: HTTP %d %s", len(jobs), r.Status, r.Raw)
	}
	results, _ := r.Body["results"].([]any)
	if len(results) != len(jobs) {
		t.Fatalf("batch of %d: %d results: %s", len(jobs), len(results), r.Raw)
	}
	for i, res := range results {
		item, _ := res.(map[string]any)
		tn := tenantOf[i]
		switch item["status"] {
		case float64(http.StatusAccepted):
			admitted[tn]++
		case float64(http.StatusTooManyRequests):
			e, _ := item["error"].(map[string]any)
			code, _ := e["error_code"].(string)
			scope, _ := e["scope"].(string)
			if refused[tn] == nil {
				refused[tn] = map[string]int{}
			}
			refused[tn][simRefusalKey(code, scope)]++
		default:
			t.Fatalf("batch item %d (%s): %v", i, tn, item)
		}
	}
}

// simDBNow is the database's clock, which stamps the audit trail and the jobs.
func simDBNow(t *testing.T, db *sql.DB) time.Time {
	t.Helper()
	var now time.Time
	if err := db.QueryRowContext(context.Background(), "SELECT UTC_TIMESTAMP(6)").Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now.UTC()
}

// simNearestRank is the q-quantile of sorted by nearest rank, as simulate's Quantiles are.
func simNearestRank(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(q * float64(len(sorted))))
	return sorted[max(rank, 1)-1]
}

// simAlternate returns n sleeps, a and b in turn (a first).
func simAlternate(n, a, b int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = a
		if i%2 == 1 {
			out[i] = b
		}
	}
	return out
}

// simRepeat returns n sleeps of ms.
func simRepeat(n, ms int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = ms
	}
	return out
}

// TestSimulateFidelity is issue 35's "fidelity, measured": a real run of five tenants through
// the API, an in-process drainer and the simulated executor (bursts of several tenants at once,
// 40 ms and 300 ms jobs, caps 8 global and 4 a tenant so that jobs queue, one burst past its
// tenant's depth cap, one tenant past the admission rate limit, and one batch refused by both),
// replayed from its audit trail by simulate.RunRecorded with no change, and the pickup delays
// simulate.Calibrate measures on the run, as the CLI and the API do. For every tenant the
// simulated p50 and p95 wait (admission to claim) must be within 15 % or 5 ms (the looser) of the
// measured ones (dispatched_at − queued_at), and the refusals by code and scope equal exactly.
//
// Each wave is one batch holding every tenant's burst: one transaction, one clock reading, all of
// whose arrivals the replay decides together before its claim pass, as the drainer's first pass
// after the commit sees them all. The refusals are decided alike in the run and in the replay
// whatever the drainer's pickup: the bursts past the depth cap are their tenants' first, into
// empty queues; the other tenants' queues stay within the cap whatever has been claimed; the
// rate-limited tenant's second burst comes once its queue is empty, within the rate limit's
// minute.
//
// The jobs are long beside the drainer's own jitter under the race detector on a busy 2-core
// machine (a pass of some milliseconds, stalls of tens): with 20 ms and 150 ms jobs a tenant
// whose short jobs got one unit every 30 ms had its p50 on a 30 ms step, and one pickup's
// jitter that swapped two tenants' turn moved it past 15 % (1 run in 10 with a busy loop beside
// it, once in CI).
//
// B's first burst is 20 jobs, not 12 (session 29): with 12, B's sorted waits had a gap at their
// median (about 100 ms against 143 ms), and its second wave lands as other tenants' jobs end. Whether
// the first unit freed then goes to B (its poke's pass brings the outcome too) or to C (the
// outcome's pass comes first) is a sub-millisecond race that the drainer decides by which wakes its
// loop first and the replay by mean delays; the other way, two of B's second-wave waits crossed the
// gap and its p50 moved by about 20 ms, more than 15 % of 100 ms. The plain build, faster than the
// race-built one CI runs, met it in about half of its runs (B's p50 off by +12 to +21 %, failing
// the whole-suite coverage run twice). With 20 B's p50 is about 200 ms, inside a run of waits, and
// 40 runs (plain, race, instrumented, and beside a busy loop) kept every tenant within 6 %.
//
// It asserts on time, so it does not run in parallel with the package's other tests.
func TestSimulateFidelity(t *testing.T) {
	began := time.Now()
	ctx := context.Background()
	env := harness.Start(t, harness.Options{Memcached: []string{memcachedtest.Shared(t)}})
	// The admission rate limit counts in the shared memcached, per tenant and minute: names of
	// this run only.
	a, b, c, d, e := apitest.UniqueTenant("sim-a"), apitest.UniqueTenant("sim-b"), apitest.UniqueTenant("sim-c"), apitest.UniqueTenant("sim-d"), apitest.UniqueTenant("sim-e")
	tenants := []string{a, b, c, d, e}
	name := map[string]string{a: "A", b: "B", c: "C", d: "D", e: "E"}
	patchConfig(t, env, map[string]any{
		"global_in_flight": 8, "tenant_in_flight": 4, "tenant_queue_depth": 20, "admission_rate_per_minute": 30})

	// The rate limit's window is the minute (of the database clock, which the audit trail
	// stamps): D's two batches, well under a second apart, must fall in the same one, in the run
	// and in the replay. Wait, if need be, for a minute with more than 5 s left.
	var since time.Time
	wait.Until(t, 15*time.Second, "a minute of the database clock with 5 s left", func() bool {
		since = simDBNow(t, env.DB.DB)
		return since.Second() < 55
	})

	admitted := map[string]int{}
	refused := map[string]map[string]int{}
	const short, long = 40, 300 // ms
	// Wave 1, at once: A's burst of 26 into an empty queue of cap 20 (6 refused queue_full), B's 20
	// short jobs (its cap: none refused), C's 8 long ones, D's 18 mostly short ones, and E's 36
	// short ones, refused by both the rate limit and the depth cap: the rate limit grants the
	// first 30 (6 refused rate_limited), of which the depth cap takes 20 (10 refused queue_full,
	// their units given back).
	dSleeps := simRepeat(18, short)
	for i := 0; i < len(dSleeps); i += 6 {
		dSleeps[i] = long
	}
	postSimWave(t, env, []simBurst{
		{a, simAlternate(26, long, short)},
		{b, simRepeat(20, short)},
		{c, simRepeat(8, long)},
		{d, dSleeps},
		{e, simRepeat(36, short)},
	}, admitted, refused)
	// Wave 2, once D's queue is empty (A's and C's still queue): D's 18 more, of which the rate
	// limit (30 a minute) admits 12; B's 8 and C's 6, which keep their queues within the cap.
	wait.For(t, 30*time.Second, "D's queue to empty", func() (bool, error) {
		var n int
		err := env.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE tenant = ? AND status = 'queued'", d).Scan(&n)
		return n == 0, err
	})
	postSimWave(t, env, []simBurst{
		{d, simRepeat(18, short)},
		{b, simAlternate(8, short, long)},
		{c, simRepeat(6, short)},
	}, admitted, refused)

	// The workload did what it is for: the refusals above, answered to the callers.
	wantRefused := map[string]map[string]int{a: {"queue_full:tenant": 6}, d: {"rate_limited": 6},
		e: {"queue_full:tenant": 10, "rate_limited": 6}}
	for _, tn := range tenants {
		if !maps.Equal(refused[tn], wantRefused[tn]) {
			t.Fatalf("tenant %s: refusals answered %v, want %v", name[tn], refused[tn], wantRefused[tn])
		}
	}
	total := 0
	for _, n := range admitted {
		total += n
	}
	wait.For(t, 60*time.Second, "every admitted job to end", func() (bool, error) {
		c, err := env.CountJobsWhere(ctx, "status <> 'rejected'")
		return c["succeeded"] == total && len(c) == 1, err
	})
	// Refusals that write no job row reach the audit trail through its queue: wait for them.
	wait.For(t, 30*time.Second, "the refusals' audit events", func() (bool, error) {
		var n int
		err := env.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM audit_events WHERE event = 'refused'").Scan(&n)
		return n == 28, err
	})
	// A refusal that wrote no row is audited (through the audit queue) at its admission's
	// instant: E's rate-limit refusals at the queued_at of its batch's jobs.
	var stray int
	if err := env.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_events WHERE tenant = ? AND event = 'refused'
		AND error_code = 'rate_limited' AND at <> (SELECT MIN(queued_at) FROM jobs WHERE tenant = ?)`, e, e).Scan(&stray); err != nil || stray != 0 {
		t.Fatalf("E's rate-limit refusals audited at another instant than its batch's: %d (%v)", stray, err)
	}
	until := simDBNow(t, env.DB.DB).Add(time.Millisecond)
	ran := time.Since(began)

	// Measured: each tenant's waits from its jobs' rows, from queued_at (the admission's clock
	// reading: the figure asserted) and, for the log, from its admission's audit event (the arrival
	// instant the replay reads); its refusals from the audit trail.
	waits, fromAudit := map[string][]float64{}, map[string][]float64{}
	rows, err := env.DB.QueryContext(ctx, `SELECT j.tenant, TIMESTAMPDIFF(MICROSECOND, j.queued_at, j.dispatched_at),
		TIMESTAMPDIFF(MICROSECOND, a.at, j.dispatched_at), j.attempt
		FROM jobs j JOIN audit_events a ON a.job_id = j.id AND a.event = 'admitted' WHERE j.status = 'succeeded'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var tn string
		var us, usAudit int64
		var attempt int
		if err := rows.Scan(&tn, &us, &usAudit, &attempt); err != nil {
			t.Fatal(err)
		}
		if attempt != 1 {
			t.Fatalf("a job of %s took %d attempts: the run is not one the replay models", name[tn], attempt)
		}
		waits[tn] = append(waits[tn], float64(us)/1000)
		fromAudit[tn] = append(fromAudit[tn], float64(usAudit)/1000)
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	measuredRefused := map[string]map[string]int{}
	rows, err = env.DB.QueryContext(ctx, `SELECT tenant, COALESCE(error_code, ''), COALESCE(scope, ''), COUNT(*)
		FROM audit_events WHERE event = 'refused' GROUP BY tenant, error_code, scope`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var tn, code, scope string
		var n int
		if err := rows.Scan(&tn, &code, &scope, &n); err != nil {
			t.Fatal(err)
		}
		if measuredRefused[tn] == nil {
			measuredRefused[tn] = map[string]int{}
		}
		measuredRefused[tn][simRefusalKey(code, scope)] += n
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}

	replayStart := time.Now()
	arrival, outcome, measured, err := simulate.Calibrate(ctx, env.DB.DB, since, until)
	if err != nil || !measured {
		t.Fatalf("Calibrate: %v (measured %v)", err, measured)
	}
	t.Logf("pickup measured on the run: %s after an arrival, %s after an outcome", arrival, outcome)
	cmp, err := simulate.RunRecorded(ctx, env.DB.DB, since, until, nil, simulate.Options{ArrivalPickup: arrival, OutcomePickup: outcome}, nil)
	if err != nil {
		t.Fatalf("RunRecorded: %v", err)
	}
	replayed := time.Since(replayStart)
	cur := cmp.Current

	t.Logf("run: %d jobs admitted of %d arrivals, %s of wall time (the replay took %s)",
		total, cur.Total.Arrivals, ran.Round(time.Millisecond), replayed.Round(time.Microsecond))
	t.Logf("waits in ms: measured from queued_at (the replay's arrival; asserted) and, in brackets, from the admission's audit event")
	t.Logf("%-6s %4s  %17s %8s %8s %7s  %17s %8s %8s %7s  %s", "tenant", "jobs",
		"p50 meas [at]", "sim", "err ms", "err %", "p95 meas [at]", "sim", "err ms", "err %", "refused (measured = simulated)")
	within := func(sim, meas float64) bool { return math.Abs(sim-meas) <= max(0.15*meas, 5) }
	rel := func(sim, meas float64) float64 {
		if meas == 0 {
			return math.Inf(1)
		}
		return 100 * (sim - meas) / meas
	}
	for _, tn := range tenants {
		ws := waits[tn]
		sort.Float64s(ws)
		m50, m95 := simNearestRank(ws, 0.50), simNearestRank(ws, 0.95)
		wa := fromAudit[tn]
		sort.Float64s(wa)
		sr := cur.Tenants[tn]
		if sr == nil {
			t.Errorf("tenant %s: not in the replay", name[tn])
			continue
		}
		t.Logf("%-6s %4d  %7.1f [%7.1f] %8.1f %+8.1f %+6.1f%%  %7.1f [%7.1f] %8.1f %+8.1f %+6.1f%%  %v = %v", name[tn], len(ws),
			m50, simNearestRank(wa, 0.50), sr.Wait.P50, sr.Wait.P50-m50, rel(sr.Wait.P50, m50),
			m95, simNearestRank(wa, 0.95), sr.Wait.P95, sr.Wait.P95-m95, rel(sr.Wait.P95, m95), measuredRefused[tn], sr.Refused)
		if sr.Admitted != len(ws) || sr.Started != len(ws) || sr.NeverStarted != 0 {
			t.Errorf("tenant %s: replay admitted %d and started %d (%d never), the run admitted and ran %d",
				name[tn], sr.Admitted, sr.Started, sr.NeverStarted, len(ws))
		}
		if !within(sr.Wait.P50, m50) {
			t.Errorf("tenant %s: simulated p50 wait %.1f ms, measured %.1f ms: off by %.1f ms (%+.1f %%), more than 15 %% or 5 ms",
				name[tn], sr.Wait.P50, m50, sr.Wait.P50-m50, rel(sr.Wait.P50, m50))
		}
		if !within(sr.Wait.P95, m95) {
			t.Errorf("tenant %s: simulated p95 wait %.1f ms, measured %.1f ms: off by %.1f ms (%+.1f %%), more than 15 %% or 5 ms",
				name[tn], sr.Wait.P95, m95, sr.Wait.P95-m95, rel(sr.Wait.P95, m95))
		}
		if !maps.Equal(sr.Refused, measuredRefused[tn]) {
			t.Errorf("tenant %s: simulated refusals %v, measured %v", name[tn], sr.Refused, measuredRefused[tn])
		}
		if !maps.Equal(measuredRefused[tn], refused[tn]) {
			t.Errorf("tenant %s: the audit trail's refusals %v, the callers were answered %v", name[tn], measuredRefused[tn], refused[tn])
		}
	}
	if len(cur.Tenants) != len(tenants) {
		t.Errorf("the replay saw %d tenants, the run had %d", len(cur.Tenants), len(tenants))
	}
}

// simExpected is an arrival TestSimulateRecordedReadsTheAuditTrail sent, as Recorded must give
// it back.
type simExpected struct {
	what        string
	tenant      string
	job         int64 // the job's row (0: none written)
	lanes       []string
	interactive bool
	priority    int
	immediate   bool
	scheduled   bool
	// serviceOf: the service time is the mean of these jobs' (a job that never ran, or a
	// refusal: its tenant's mean so far, else everyone's); nil: the job's own.
	serviceOf []int64
}

// TestSimulateRecordedReadsTheAuditTrail checks simulate.Recorded against the database for a
// handful of known arrivals: each comes back, in order, at its admission's clock reading (its
// row's queued_at, else its admission event's instant), with
// its job's lanes (sorted), interactive flag and priority, and the time from its dispatch to its
// outcome as service time; a depth refusal (a rejected row) with its row's lanes; a refusal that
// wrote no row (queue=false, capacity_exceeded) as an immediate arrival without lanes; each
// refusal with its tenant's mean service so far, or everyone's for a tenant with none; and a
// scheduled job with its due time.
func TestSimulateRecordedReadsTheAuditTrail(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := harness.Start(t, harness.Options{})
	patchConfig(t, env, map[string]any{"lanes": map[string]int{"gpu": 1, "alpha": 2, "beta": 2, "off": 0}, "tenant_queue_depth": 2})
	since := simDBNow(t, env.DB.DB)

	admit := func(body map[string]any, status int) harness.Response {
		t.Helper()
		r := env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, body)
		if r.Status != status {
			t.Fatalf("admit %v: HTTP %d %s, want %d", body, r.Status, r.Raw, status)
		}
		return r
	}
	// Refusals that write no row reach the trail through the audit queue: wait for each, so that
	// the arrivals' order is the requests'.
	refusals := 0
	flushed := func() {
		t.Helper()
		refusals++
		wait.For(t, 10*time.Second, "the refusal's audit event", func() (bool, error) {
			var n int
			err := env.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM audit_events WHERE event = 'refused' AND job_id IS NULL").Scan(&n)
			return n == refusals, err
		})
	}
	var want []simExpected
	sleep := func(ms int) map[string]any { return map[string]any{"sleep_ms": ms} }

	r := admit(map[string]any{"tenant": "x", "lanes": []string{"gpu"}, "priority": 7, "payload": sleep(40)}, http.StatusAccepted)
	want = append(want, simExpected{what: "a job with a lane and a priority", tenant: "x", job: apitest.JobID(t, r.Body), lanes: []string{"gpu"}, priority: 7})
	x1 := want[len(want)-1].job
	r = admit(map[string]any{"tenant": "x", "interactive": true, "payload": sleep(10)}, http.StatusAccepted)
	want = append(want, simExpected{what: "an interactive job", tenant: "x", job: apitest.JobID(t, r.Body), interactive: true, priority: 5})
	x2 := want[len(want)-1].job
	r = admit(map[string]any{"tenant": "y", "lanes": []string{"beta", "alpha"}, "payload": sleep(20)}, http.StatusAccepted)
	want = append(want, simExpected{what: "a job with two lanes", tenant: "y", job: apitest.JobID(t, r.Body), lanes: []string{"alpha", "beta"}, priority: 5})
	y1 := want[len(want)-1].job

	// A batch of three into z's empty queue of depth 2: the third is refused queue_full, a
	// rejected row that keeps its lanes.
	r = env.Do(t, http.MethodPost, "/v1/jobs:batch", harness.ProducerToken, map[string]any{"jobs": []map[string]any{
		{"tenant": "z", "payload": sleep(15)}, {"tenant": "z", "payload": sleep(25)},
		{"tenant": "z", "lanes": []string{"gpu"}, "payload": sleep(5)}}})
	results, _ := r.Body["results"].([]any)
	if r.Status != http.StatusOK || len(results) != 3 {
		t.Fatalf("batch: HTTP %d %s", r.Status, r.Raw)
	}
	var z []int64
	for i, res := range results {
		item := res.(map[string]any)
		wantStatus := float64(http.StatusAccepted)
		if i == 2 {
			wantStatus = http.StatusTooManyRequests
		}
		if item["status"] != wantStatus {
			t.Fatalf("batch item %d: %v, want status %v", i, item, wantStatus)
		}
		if i < 2 {
			z = append(z, int64(item["job"].(map[string]any)["id"].(float64)))
		} else {
			z = append(z, int64(item["error"].(map[string]any)["id"].(float64)))
		}
	}
	want = append(want,
		simExpected{what: "the batch's first job", tenant: "z", job: z[0], priority: 5},
		simExpected{what: "the batch's second job", tenant: "z", job: z[1], priority: 5},
		simExpected{what: "the batch's depth refusal", tenant: "z", job: z[2], lanes: []string{"gpu"}, priority: 5, serviceOf: z[:2]})

	// queue=false on a paused lane: capacity_exceeded, no row written.
	admit(map[string]any{"tenant": "y", "queue": false, "lanes": []string{"off"}}, http.StatusTooManyRequests)
	flushed()
	want = append(want, simExpected{what: "an immediate refusal of a tenant with a job", tenant: "y",
		immediate: true, priority: 5, serviceOf: []int64{y1}})
	admit(map[string]any{"tenant": "w", "queue": false, "lanes": []string{"off"}}, http.StatusTooManyRequests)
	flushed()
	want = append(want, simExpected{what: "an immediate refusal of a tenant without one", tenant: "w",
		immediate: true, priority: 5, serviceOf: []int64{x1, x2, y1, z[0], z[1]}})

	r = admit(map[string]any{"tenant": "x", "delay_seconds": 0.2, "payload": sleep(5)}, http.StatusAccepted)
	want = append(want, simExpected{what: "a scheduled job", tenant: "x", job: apitest.JobID(t, r.Body), priority: 5, scheduled: true})

	wait.For(t, 30*time.Second, "every admitted job to end", func() (bool, error) {
		c, err := env.CountJobs(ctx)
		return c["succeeded"] == 6 && c["rejected"] == 1 && len(c) == 2, err
	})
	until := simDBNow(t, env.DB.DB).Add(time.Millisecond)

	// What the database says of each: its arrival, the admission's clock reading (its row's
	// queued_at), or for a scheduled job or a refusal without a row its admission event's
	// instant; for a job that ran, its service time; for a scheduled one, when it was due
	// (queued_at: it joined its queue then).
	at := func(e simExpected) time.Time {
		t.Helper()
		var v time.Time
		q, arg := "SELECT at FROM audit_events WHERE job_id = ? AND event IN ('admitted', 'refused')", any(e.job)
		if e.job != 0 && !e.scheduled {
			q = "SELECT queued_at FROM jobs WHERE id = ?"
		}
		if e.job == 0 {
			q, arg = "SELECT at FROM audit_events WHERE tenant = ? AND event = 'refused' AND job_id IS NULL", e.tenant
		}
		if err := env.DB.QueryRowContext(ctx, q, arg).Scan(&v); err != nil {
			t.Fatalf("%s: its audit event: %v", e.what, err)
		}
		return v.UTC()
	}
	service := func(id int64) time.Duration {
		t.Helper()
		var us int64
		if err := env.DB.QueryRowContext(ctx, "SELECT TIMESTAMPDIFF(MICROSECOND, dispatched_at, finished_at) FROM jobs WHERE id = ?", id).Scan(&us); err != nil {
			t.Fatalf("job %d's service time: %v", id, err)
		}
		return time.Duration(us) * time.Microsecond
	}
	due := func(id int64) time.Time {
		t.Helper()
		var v time.Time
		if err := env.DB.QueryRowContext(ctx, "SELECT queued_at FROM jobs WHERE id = ?", id).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v.UTC()
	}

	var got []simulate.Arrival
	src := simulate.Recorded(ctx, env.DB.DB, since, until)
	for {
		a, err := src.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Recorded: %v", err)
		}
		got = append(got, a)
	}
	if len(got) != len(want) {
		t.Fatalf("Recorded gave %d arrivals, want %d: %+v", len(got), len(want), got)
	}
	for i, e := range want {
		a := got[i]
		wantService := time.Duration(0)
		if e.serviceOf == nil {
			wantService = service(e.job)
		} else {
			var sum time.Duration
			for _, id := range e.serviceOf {
				sum += service(id)
			}
			wantService = sum / time.Duration(len(e.serviceOf))
		}
		wantAt := at(e)
		if a.Kind != simulate.Job || a.Tenant != e.tenant || !a.At.Equal(wantAt) {
			t.Errorf("arrival %d (%s): %s of %q at %s, want a job of %q at %s", i, e.what, a.Kind, a.Tenant, a.At, e.tenant, wantAt)
			continue
		}
		if !slices.Equal(a.Lanes, e.lanes) || a.Interactive != e.interactive || a.Priority != e.priority || a.Immediate != e.immediate {
			t.Errorf("arrival %d (%s): lanes %v interactive %v priority %d immediate %v, want %v %v %d %v", i, e.what,
				a.Lanes, a.Interactive, a.Priority, a.Immediate, e.lanes, e.interactive, e.priority, e.immediate)
		}
		if a.Service != wantService {
			t.Errorf("arrival %d (%s): service %s, want %s", i, e.what, a.Service, wantService)
		}
		if a.Service <= 0 {
			t.Errorf("arrival %d (%s): no service time", i, e.what)
		}
		if e.scheduled {
			if d := due(e.job); !a.RunAt.Equal(d) {
				t.Errorf("arrival %d (%s): run_at %s, want its due time %s (%s after its admission)", i, e.what, a.RunAt, d, d.Sub(wantAt))
			}
		} else if !a.RunAt.IsZero() {
			t.Errorf("arrival %d (%s): run_at %s, want none", i, e.what, a.RunAt)
		}
	}
}
