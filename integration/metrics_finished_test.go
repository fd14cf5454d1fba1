package integration_test

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/harness"
)

// finishedCounts returns the sluice_jobs_finished_total series of a /metrics text, by state.
func finishedCounts(t *testing.T, text string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, `sluice_jobs_finished_total{state="`)
		if !ok {
			continue
		}
		state, value, ok := strings.Cut(rest, `"} `)
		if !ok {
			t.Fatalf("unexpected series line %q", line)
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("series line %q: %v", line, err)
		}
		out[state] = v
	}
	return out
}

// TestFinishedJobsMetrics proves SPEC §10's sluice_jobs_finished_total{state} in a process with
// the API and a drainer on one registry: every terminal state's series exists at 0 before any
// job ends; a synchronous answer (drainer), a /complete after a 202 (API), a cancel (API), a
// recovery to lost (drainer) and an admission refused into a rejected row (API) each count
// exactly once, in the state the job ended in; repeated /complete and cancel calls count
// nothing; and requeues (after a 503, a 429, a transport error, a not_started completion)
// count nothing and create no "queued" series. Dispatch waits are observed once per dispatch,
// execution times once per dispatched job that ended. The drainers run one pass at a time on a
// fake clock; the counts are read when the transitions are known to have committed.
func TestFinishedJobsMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := &harnessEnv{harness.Start(t, harness.Options{API: true})}
	fake := clock.NewFake(time.Now())
	s := drainertest.NewHeld()
	recorded := make(chan int64, 16)
	// The test's drainer registers its own collectors on the App's registry and shares the
	// App's job collectors, as the App's drainer role does.
	d := drainertest.NewDrainer(t, drainer.Config{DB: env.DB.DB, Executor: s, Clock: fake, ID: "metrics",
		Metrics: drainer.NewMetrics(env.App.Registry()), JobMetrics: env.App.JobMetrics(),
		Observer: drainer.ObserverFuncs{OnRecorded: func(id int64) { recorded <- id }}}, 100*time.Millisecond)

	want := map[string]float64{"succeeded": 0, "failed": 0, "canceled": 0, "rejected": 0, "lost": 0, "expired": 0, "replaced": 0}
	check := func(step string, dispatches, executions float64) {
		t.Helper()
		m := scrape(t, env.URL)
		if got := finishedCounts(t, m); !maps.Equal(got, want) {
			t.Fatalf("%s: sluice_jobs_finished_total %v, want %v", step, got, want)
		}
		for series, n := range map[string]float64{"sluice_dispatch_wait_seconds_count": dispatches,
			"sluice_execution_seconds_count": executions} {
			if got, ok := metricValue(m, series); !ok || got != n {
				t.Fatalf("%s: %s = %v (present %v), want %v", step, series, got, ok, n)
			}
		}
	}
	pass := func(what string, claims int) {
		t.Helper()
		p, err := d.RunOnce(ctx)
		if err != nil || p.Claimed != claims {
			t.Fatalf("%s: pass %+v, %v; want %d claimed", what, p, err, claims)
		}
	}
	answer := func(id int64, a executor.Answer) executor.Dispatch {
		t.Helper()
		disp := s.Next(t).Dispatch
		if disp.JobID != id {
			t.Fatalf("dispatched job %d, want %d", disp.JobID, id)
		}
		s.Replies <- a
		if got := drainertest.AwaitRecorded(t, recorded, 1)[0]; got != id {
			t.Fatalf("recorded job %d, want %d", got, id)
		}
		return disp
	}
	status := func(id int64, want string) {
		t.Helper()
		if got := drainertest.ReadJob(t, env.DB.DB, id).Status; got != want {
			t.Fatalf("job %d is %s, want %s", id, got, want)
		}
	}
	jobPath := func(id int64) string { return "/v1/jobs/" + strconv.FormatInt(id, 10) }

	// A fresh process: every terminal series at 0, no histogram observation.
	check("before any job ended", 0, 0)

	// A synchronous answer, recorded by the drainer.
	syncJob := env.Admit(t, "sync", nil)
	pass("sync", 1)
	answer(syncJob, executor.Answer{Kind: executor.Done, HTTPStatus: 200, Status: "succeeded"})
	status(syncJob, "succeeded")
	want["succeeded"] = 1
	check("after a synchronous success", 1, 1)

	// Requeues after a 503, a 429 and a transport error are not ends; the fourth dispatch succeeds.
	requeued := env.Admit(t, "requeue", nil)
	pass("503", 1)
	answer(requeued, executor.Answer{Kind: executor.Refused, HTTPStatus: 503, RetryAfter: 1})
	status(requeued, "queued")
	check("after a 503", 2, 1)
	fake.Advance(2 * time.Second) // past the 503's Retry-After
	pass("429", 1)
	answer(requeued, executor.Answer{Kind: executor.RateLimited, HTTPStatus: 429, RetryAfter: 1})
	status(requeued, "queued")
	check("after a 429", 3, 1)
	fake.Advance(7 * time.Second) // past the 429's gate of the job's own (no gate store: 1 s + 5 s)
	pass("error", 1)
	answer(requeued, executor.Answer{Kind: executor.Unknown, Err: errors.New("connection reset by peer")})
	status(requeued, "queued")
	check("after a transport error before any start", 4, 1)
	pass("requeued job's last dispatch", 1)
	answer(requeued, executor.Answer{Kind: executor.Done, HTTPStatus: 200, Status: "succeeded"})
	status(requeued, "succeeded")
	want["succeeded"] = 2
	check("after the requeued job succeeded", 5, 2)

	// An asynchronous executor: 202, then /complete. not_started requeues (not an end); failed
	// is one, counted by the API once; the same report again counts nothing.
	async := env.Admit(t, "async", nil)
	pass("async", 1)
	disp := answer(async, executor.Answer{Kind: executor.Accepted, HTTPStatus: 202})
	status(async, "dispatched")
	check("after a 202", 6, 2)
	r := env.Do(t, http.MethodPost, jobPath(async)+"/complete", harness.ExecutorToken, map[string]any{"nonce": disp.Nonce, "status": "not_started"})
	if r.Status != http.StatusOK || r.Body["status"] != "queued" {
		t.Fatalf("/complete not_started: HTTP %d %s", r.Status, r.Raw)
	}
	check("after /complete not_started", 6, 2)
	pass("async again", 1)
	disp = answer(async, executor.Answer{Kind: executor.Accepted, HTTPStatus: 202})
	for i := range 2 {
		r := env.Do(t, http.MethodPost, jobPath(async)+"/complete", harness.ExecutorToken,
			map[string]any{"nonce": disp.Nonce, "status": "failed", "error_code": "upstream_timeout"})
		if r.Status != http.StatusOK || r.Body["status"] != "failed" {
			t.Fatalf("/complete failed (call %d): HTTP %d %s", i+1, r.Status, r.Raw)
		}
	}
	want["failed"] = 1
	check("after /complete failed, twice", 7, 3)

	// A cancel through the API; a second cancel of the canceled job counts nothing.
	canceled := env.Admit(t, "cancel", nil)
	for i := range 2 {
		if r := env.Do(t, http.MethodDelete, jobPath(canceled), harness.ProducerToken, nil); r.Status != http.StatusOK || r.Body["status"] != "canceled" {
			t.Fatalf("cancel (call %d): HTTP %d %s", i+1, r.Status, r.Raw)
		}
	}
	want["canceled"] = 1
	check("after a cancel, twice", 7, 3)

	// Recovery to lost: another drainer dispatches a job whose start the executor confirms, then
	// stops renewing (it runs no more passes); past the lease, this drainer's upkeep finds it.
	lost := env.Admit(t, "lost", nil)
	s2 := drainertest.NewHeld()
	d2 := drainertest.NewDrainer(t, drainer.Config{DB: env.DB.DB, Executor: s2, Clock: fake, ID: "metrics-dying",
		JobMetrics: env.App.JobMetrics()}, 100*time.Millisecond)
	if p, err := d2.RunOnce(ctx); err != nil || p.Claimed != 1 {
		t.Fatalf("dying drainer's pass: %+v, %v; want 1 claimed", p, err)
	}
	if r := env.start(t, lost, s2.Next(t).Nonce, "attempt-1"); r.Status != http.StatusOK {
		t.Fatalf("/start: HTTP %d %s", r.Status, r.Raw)
	}
	check("after the lost job's dispatch", 8, 3)
	fake.Advance(11 * time.Second) // past the 10 s lease
	if p, err := d.RunOnce(ctx); err != nil || p.Recovered != 1 || p.Claimed != 0 {
		t.Fatalf("recovering pass: %+v, %v; want 1 recovered, none claimed", p, err)
	}
	status(lost, "lost")
	want["lost"] = 1
	check("after recovery to lost", 8, 4)

	// A replacement ends the queued job it replaces, counted by the API.
	for range 2 {
		if r := env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, map[string]any{"tenant": "replace", "replace_key": "k"}); r.Status != http.StatusAccepted {
			t.Fatalf("admit with a replace key: HTTP %d %s", r.Status, r.Raw)
		}
	}
	want["replaced"] = 1
	check("after a replacement", 8, 4)

	// An admission refused at the depth cap leaves a rejected row: an end, counted by the API.
	if r := env.Do(t, http.MethodPatch, "/v1/config", harness.AdminToken, map[string]any{"changes": map[string]any{"tenant_queue_depth": 0}}); r.Status != http.StatusOK {
		t.Fatalf("PATCH: HTTP %d %s", r.Status, r.Raw)
	}
	r = env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, map[string]any{"tenant": "full"})
	if r.Status != http.StatusTooManyRequests || r.Body["error_code"] != string(job.CodeQueueFull) {
		t.Fatalf("admission at depth cap 0: HTTP %d %s, want 429 queue_full", r.Status, r.Raw)
	}
	if c, err := env.CountJobsWhere(ctx, "tenant = 'full'"); err != nil || c["rejected"] != 1 || len(c) != 1 {
		t.Fatalf("tenant full's jobs: %v (%v), want one rejected row", c, err)
	}
	want["rejected"] = 1
	check("after a rejected admission", 8, 4)
}

// TestJobMetricsAtStart proves that a fresh process exports every terminal state's
// sluice_jobs_finished_total series at 0 whatever its roles, when it has a role that ends
// jobs: one with every role (which also proves the API and the drainer do not both register
// the names), and a drainer alone. A relay alone ends no jobs and exports none.
func TestJobMetricsAtStart(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{})
	zero := map[string]float64{"succeeded": 0, "failed": 0, "canceled": 0, "rejected": 0, "lost": 0, "expired": 0, "replaced": 0}
	if got := finishedCounts(t, scrape(t, env.URL)); !maps.Equal(got, zero) {
		t.Errorf("every role: sluice_jobs_finished_total %v, want %v", got, zero)
	}
	// Split processes on the same database, as on other hosts. Nothing is queued, so the extra
	// drainer has nothing to take from the first.
	drainerOnly := env.StartApp(t, harness.Options{Drainer: true})
	if got := finishedCounts(t, scrape(t, "http://"+drainerOnly.Addr())); !maps.Equal(got, zero) {
		t.Errorf("drainer alone: sluice_jobs_finished_total %v, want %v", got, zero)
	}
	relayOnly := env.StartApp(t, harness.Options{Relay: true})
	m := scrape(t, "http://"+relayOnly.Addr())
	if got := finishedCounts(t, m); len(got) != 0 {
		t.Errorf("relay alone: sluice_jobs_finished_total %v, want no series", got)
	}
	for _, name := range []string{"sluice_dispatch_wait_seconds_count", "sluice_execution_seconds_count"} {
		if _, ok := metricValue(m, name); ok {
			t.Errorf("relay alone exports %s", name)
		}
	}
}
