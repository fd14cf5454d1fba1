package integration_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/integration/apitest"
	"github.com/sluicehq/sluice/integration/harness"
)

// TestRunLater: a job admitted with delay_seconds or run_at is queued at once, shows when it is
// due (not_before, and queued_at: it joins the queue then), counts in its tenant's depth, and is
// not dispatched before it is due, while a job admitted after it and due now runs first. A
// scheduled job can be canceled like any queued job.
func TestRunLater(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{})
	r := env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, map[string]any{"tenant": "acme", "delay_seconds": 1.5})
	if r.Status != http.StatusAccepted || r.Body["status"] != "queued" || r.Body["not_before"] == nil ||
		r.Body["not_before"] != r.Body["queued_at"] || r.Body["position"] != nil || r.Header.Get("Sluice-Queue-Position") != "" {
		t.Fatalf("admit with delay_seconds: %d %s; want 202 queued, not_before = queued_at, no position", r.Status, r.Raw)
	}
	delayed := apitest.JobID(t, r.Body)
	far := time.Now().UTC().Add(time.Hour).Format(time.RFC3339)
	r = env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, map[string]any{"tenant": "acme", "run_at": far})
	if r.Status != http.StatusAccepted {
		t.Fatalf("admit with run_at: %d %s", r.Status, r.Raw)
	}
	later := apitest.JobID(t, r.Body)
	now := env.Admit(t, "acme", map[string]any{})

	// The job due now runs; the delayed one runs once due, never before; the one an hour away
	// stays queued, counted in the depth.
	for _, id := range []int64{now, delayed} {
		r = env.Do(t, http.MethodGet, fmt.Sprintf("/v1/jobs/%d?wait=30", id), harness.ProducerToken, nil)
		if r.Body["status"] != string(job.Succeeded) {
			t.Fatalf("job %d after waiting: %s; want succeeded", id, r.Raw)
		}
	}
	var nowAt, delayedAt, dueAt time.Time
	if err := env.DB.QueryRow("SELECT dispatched_at FROM jobs WHERE id = ?", now).Scan(&nowAt); err != nil {
		t.Fatal(err)
	}
	if err := env.DB.QueryRow("SELECT dispatched_at, queued_at FROM jobs WHERE id = ?", delayed).Scan(&delayedAt, &dueAt); err != nil {
		t.Fatal(err)
	}
	if delayedAt.Before(dueAt) || !nowAt.Before(delayedAt) {
		t.Fatalf("delayed job due %v dispatched %v, the job due now dispatched %v; want the delayed one at or after its due time, after the other",
			dueAt, delayedAt, nowAt)
	}
	r = env.Do(t, http.MethodGet, fmt.Sprintf("/v1/jobs/%d", later), harness.ProducerToken, nil)
	if r.Body["status"] != "queued" || r.Body["position"] != float64(1) {
		t.Fatalf("the job an hour away: %s; want queued at position 1", r.Raw)
	}
	r = env.Do(t, http.MethodGet, "/v1/tenants", harness.AdminToken, nil)
	if ts, _ := r.Body["tenants"].([]any); len(ts) != 1 || ts[0].(map[string]any)["depth"] != float64(1) {
		t.Fatalf("tenants: %s; want acme with depth 1", r.Raw)
	}
	if r = env.Do(t, http.MethodDelete, fmt.Sprintf("/v1/jobs/%d", later), harness.ProducerToken, nil); r.Body["status"] != "canceled" {
		t.Fatalf("cancel the scheduled job: %d %s", r.Status, r.Raw)
	}

	// Bad schedules are 400 and write nothing.
	var before int
	if err := env.DB.QueryRow("SELECT COUNT(*) FROM jobs").Scan(&before); err != nil {
		t.Fatal(err)
	}
	for _, body := range []map[string]any{
		{"tenant": "acme", "delay_seconds": 5, "queue": false},
		{"tenant": "acme", "run_at": "next week"},
		{"tenant": "acme", "run_at": time.Now().UTC().AddDate(2, 0, 0).Format(time.RFC3339)},
		{"tenant": "acme", "delay_seconds": -5},
	} {
		if r := env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, body); r.Status != http.StatusBadRequest {
			t.Errorf("admit %v: %d %s; want 400", body, r.Status, r.Raw)
		}
	}
	var after int
	if err := env.DB.QueryRow("SELECT COUNT(*) FROM jobs").Scan(&after); err != nil || after != before {
		t.Fatalf("jobs %d before the bad schedules, %d after (%v)", before, after, err)
	}
}

// TestStartBy: a job not dispatched by its start_by ends expired with start_deadline, which a
// waiter hears at once (its release poke) and its events show; it is never dispatched after. An
// admission with refuse_if_late is refused with 429 deadline_unreachable when its deadline is
// before its run_at, or before the start its place in the queue and the tenant's recent service
// time give, and writes nothing.
func TestStartBy(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{WaitBackstop: time.Hour})
	env.SetConfig(t, func(c *config.Config) { c.GlobalInFlight = 0 }) // nothing starts
	by := time.Now().UTC().Add(time.Hour).Format(time.RFC3339Nano)
	r := env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, map[string]any{"tenant": "acme", "start_by": by})
	if r.Status != http.StatusAccepted || r.Body["start_by"] == nil {
		t.Fatalf("admit with start_by: %d %s", r.Status, r.Raw)
	}
	id := apitest.JobID(t, r.Body)
	// A waiter first, then the deadline moved into the past: with the backstop an hour away,
	// only the job's end can answer it before the wait's 30 s.
	expiry := goWait(http.MethodGet, fmt.Sprintf("%s/v1/jobs/%d?wait=30", env.URL, id), harness.ProducerToken, nil)
	untilWaiting(t, env.URL, 1)
	for _, q := range []string{"UPDATE jobs SET start_by = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE id = ?",
		"UPDATE job_deadlines SET start_by = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE job_id = ?"} {
		if _, err := env.DB.Exec(q, id); err != nil {
			t.Fatal(err)
		}
	}
	if e := <-expiry; e.body["status"] != "expired" || e.body["error_code"] != "start_deadline" || e.body["dispatched_at"] != nil {
		t.Fatalf("a job past its start_by: %v (%v); want expired, start_deadline, never dispatched", e.body, e.err)
	}
	if _, poke, backstop := waitersAt(t, env.URL); poke < 1 || backstop != 0 {
		t.Fatalf("wakes: poke %v, backstop %v; want the expiry's", poke, backstop)
	}
	ev := env.Do(t, http.MethodGet, fmt.Sprintf("/v1/jobs/%d/events", id), harness.ProducerToken, nil)
	if !strings.Contains(string(ev.Raw), `"to":"expired"`) || !strings.Contains(string(ev.Raw), `"error_code":"start_deadline"`) {
		t.Fatalf("events: %s; want the expiry with start_deadline", ev.Raw)
	}

	// refuse_if_late: the tenant's recent service time is 10 s (jobs recorded as if run), its cap
	// the default 2 and two jobs queued: a new job starts in about 10 s at the earliest.
	env.Admit(t, "slow", map[string]any{}) // queued, and the tenant's row
	env.Admit(t, "slow", map[string]any{})
	for range 3 {
		if _, err := env.DB.Exec(`INSERT INTO jobs (tenant, status, queued_at, dispatched_at, started_at, finished_at, caller)
			VALUES ('slow', 'succeeded', UTC_TIMESTAMP(6) - INTERVAL 20 SECOND, UTC_TIMESTAMP(6) - INTERVAL 20 SECOND,
			UTC_TIMESTAMP(6) - INTERVAL 20 SECOND, UTC_TIMESTAMP(6) - INTERVAL 10 SECOND, 'producer')`); err != nil {
			t.Fatal(err)
		}
	}
	var before int
	if err := env.DB.QueryRow("SELECT COUNT(*) FROM jobs").Scan(&before); err != nil {
		t.Fatal(err)
	}
	in := func(d time.Duration) string { return time.Now().UTC().Add(d).Format(time.RFC3339Nano) }
	for _, body := range []map[string]any{
		{"tenant": "slow", "start_by": in(5 * time.Second), "refuse_if_late": true},
		{"tenant": "acme", "start_by": in(time.Minute), "run_at": in(time.Hour), "refuse_if_late": true},
		{"tenant": "acme", "start_by": in(-time.Second), "refuse_if_late": true},
	} {
		r := env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, body)
		if r.Status != http.StatusTooManyRequests || r.Body["error_code"] != "deadline_unreachable" || r.Body["estimated_start"] == nil {
			t.Errorf("admit %v: %d %s; want 429 deadline_unreachable with estimated_start", body, r.Status, r.Raw)
		}
	}
	var after int
	if err := env.DB.QueryRow("SELECT COUNT(*) FROM jobs").Scan(&after); err != nil || after != before {
		t.Fatalf("jobs %d before the refusals, %d after (%v)", before, after, err)
	}
	r = env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, map[string]any{"tenant": "slow", "start_by": in(time.Hour), "refuse_if_late": true})
	if r.Status != http.StatusAccepted {
		t.Fatalf("a deadline the estimate meets: %d %s; want 202", r.Status, r.Raw)
	}
}

// TestReplaceKey: an admission with a replace_key replaces its tenant's queued job with that key:
// the old one ends replaced, pointing at the new one, which a waiter on it hears; the depth stays
// one. A batch's jobs with one key replace each other in order. Concurrent admissions with one key
// leave exactly one queued job. An idempotent replay replaces nothing; a job already dispatched
// is not touched; bad keys are 400.
func TestReplaceKey(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{WaitBackstop: time.Hour})
	env.SetConfig(t, func(c *config.Config) { c.GlobalInFlight = 0 })
	admit := func(body map[string]any) map[string]any {
		t.Helper()
		r := env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, body)
		if r.Status != http.StatusAccepted && r.Status != http.StatusOK {
			t.Fatalf("admit %v: %d %s", body, r.Status, r.Raw)
		}
		return r.Body
	}
	get := func(id int64) map[string]any {
		t.Helper()
		return env.Do(t, http.MethodGet, fmt.Sprintf("/v1/jobs/%d", id), harness.ProducerToken, nil).Body
	}
	a := apitest.JobID(t, admit(map[string]any{"tenant": "acme", "replace_key": "repo"}))
	waiter := goWait(http.MethodGet, fmt.Sprintf("%s/v1/jobs/%d?wait=30", env.URL, a), harness.ProducerToken, nil)
	untilWaiting(t, env.URL, 1) // so that the replacement's release poke is what answers it
	b := apitest.JobID(t, admit(map[string]any{"tenant": "acme", "replace_key": "repo"}))
	other := apitest.JobID(t, admit(map[string]any{"tenant": "globex", "replace_key": "repo"})) // another tenant's key
	if w := <-waiter; w.body["status"] != "replaced" || w.body["replaced_by"] != float64(b) {
		t.Fatalf("the waiter on the replaced job: %v; want replaced by %d", w.body, b)
	}
	if j := get(b); j["status"] != "queued" || j["replace_key"] != "repo" {
		t.Fatalf("the new job: %v", j)
	}
	if j := get(other); j["status"] != "queued" {
		t.Fatalf("another tenant's job with the same key: %v; want queued", j)
	}

	// A batch: its jobs with one key replace each other in order, and the queued one before them.
	r := env.Do(t, http.MethodPost, "/v1/jobs:batch", harness.ProducerToken, map[string]any{"jobs": []map[string]any{
		{"tenant": "acme", "replace_key": "k2"}, {"tenant": "acme", "replace_key": "k2"}, {"tenant": "acme", "replace_key": "repo"},
		{"tenant": "acme", "replace_key": "k2"}}})
	var items []map[string]any
	for _, it := range r.Body["results"].([]any) {
		items = append(items, it.(map[string]any)["job"].(map[string]any))
	}
	id := func(j map[string]any) float64 { return j["id"].(float64) }
	if items[0]["status"] != "replaced" || items[0]["replaced_by"] != id(items[1]) ||
		items[1]["status"] != "replaced" || items[1]["replaced_by"] != id(items[3]) ||
		items[2]["status"] != "queued" || items[3]["status"] != "queued" {
		t.Fatalf("batch results: %v", items)
	}
	if j := get(b); j["status"] != "replaced" || j["replaced_by"] != id(items[2]) {
		t.Fatalf("the queued job the batch replaced: %v", j)
	}

	// Racing admissions of one key: one queued job at the end, every other replaced.
	const racers = 20
	var racing []<-chan waitAnswer
	for range racers {
		racing = append(racing, goWait(http.MethodPost, env.URL+"/v1/jobs", harness.ProducerToken, map[string]any{"tenant": "race", "replace_key": "hot"}))
	}
	for _, ch := range racing {
		if a := <-ch; a.err != nil || a.status != http.StatusAccepted {
			t.Fatalf("a racing admission: %d %v (%v); want 202", a.status, a.body, a.err)
		}
	}
	var queued, replaced int
	if err := env.DB.QueryRow(`SELECT SUM(status = 'queued'), SUM(status = 'replaced') FROM jobs WHERE tenant = 'race'`).Scan(&queued, &replaced); err != nil {
		t.Fatal(err)
	}
	if queued != 1 || replaced != racers-1 {
		t.Fatalf("after %d racing admissions of one key: %d queued, %d replaced; want 1 and %d", racers, queued, replaced, racers-1)
	}

	// An idempotent replay returns its job and replaces nothing.
	keyed := map[string]any{"tenant": "acme", "replace_key": "repo", "idempotency_key": "i1"}
	g := apitest.JobID(t, admit(keyed))
	if again := admit(keyed); apitest.JobID(t, again) != g || get(g)["status"] != "queued" {
		t.Fatalf("replay: %v; want job %d, still queued", again, g)
	}

	// A job already dispatched is not touched.
	env.SetConfig(t, func(c *config.Config) { c.GlobalInFlight = 4 })
	h := apitest.JobID(t, admit(map[string]any{"tenant": "slow", "replace_key": "s", "payload": map[string]any{"sleep_ms": 1500}}))
	harness.WaitFor(t, 30*time.Second, "the slow job to run", func() (bool, error) {
		var status string
		err := env.DB.QueryRow("SELECT status FROM jobs WHERE id = ?", h).Scan(&status)
		return status == "running" || status == "dispatched", err
	})
	i := apitest.JobID(t, admit(map[string]any{"tenant": "slow", "replace_key": "s"}))
	for _, id := range []int64{h, i} {
		if j := env.Do(t, http.MethodGet, fmt.Sprintf("/v1/jobs/%d?wait=30", id), harness.ProducerToken, nil).Body; j["status"] != "succeeded" {
			t.Fatalf("job %d: %v; want succeeded (a dispatched job is not replaced)", id, j)
		}
	}

	for _, body := range []map[string]any{
		{"tenant": "acme", "replace_key": ""},
		{"tenant": "acme", "replace_key": "k", "queue": false},
		{"tenant": "acme", "replace_key": strings.Repeat("k", 256)},
	} {
		if r := env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, body); r.Status != http.StatusBadRequest {
			t.Errorf("admit %v: %d %s; want 400", body, r.Status, r.Raw)
		}
	}
}

// TestStartByPassedWithRoom: a job whose start_by has passed while the drainer has room ends
// expired: the pass that skips it finds no candidate, and the upkeep still sweeps the deadlines.
func TestStartByPassedWithRoom(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{})
	past := time.Now().UTC().Add(-time.Second).Format(time.RFC3339Nano)
	id := apitest.JobID(t, env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, map[string]any{"tenant": "acme", "start_by": past}).Body)
	r := env.Do(t, http.MethodGet, fmt.Sprintf("/v1/jobs/%d?wait=30", id), harness.ProducerToken, nil)
	if r.Body["status"] != "expired" || r.Body["error_code"] != "start_deadline" || r.Body["dispatched_at"] != nil {
		t.Fatalf("a job admitted past its start_by: %s; want expired, start_deadline, never dispatched", r.Raw)
	}
}
