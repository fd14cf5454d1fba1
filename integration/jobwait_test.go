package integration_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/limits"
	"github.com/sluicehq/sluice/gate/waiters"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/wait"
)

// waitAnswer is the answer of a waiting request sent from a goroutine of its own.
type waitAnswer struct {
	status int
	body   map[string]any
	took   time.Duration
	err    error
}

// goWait sends method url with token (and body) from a goroutine and delivers its answer.
func goWait(method, url, token string, body any) <-chan waitAnswer {
	ch := make(chan waitAnswer, 1)
	go func() {
		start := time.Now()
		code, out, err := apiDo(context.Background(), &http.Client{Timeout: 2 * time.Minute}, method, url, token, body)
		ch <- waitAnswer{status: code, body: out, took: time.Since(start), err: err}
	}()
	return ch
}

// TestWaitWokenByReleasePoke: GET /v1/jobs/{id}?wait= answers with the outcome once the job
// ends, woken by the job's release poke through NATS. The backstop's period is an hour here, so
// nothing else can have woken it, and the waiter held no request slot and read nothing while it
// waited. POST /v1/jobs?wait= answers 200 with the outcome, in the query or in the body.
func TestWaitWokenByReleasePoke(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{WaitBackstop: time.Hour})
	env.SetConfig(t, func(c *limits.Config) { c.GlobalInFlight = 0 }) // hold the job queued
	id := env.Admit(t, "acme", map[string]any{"sleep_ms": 50})
	answer := goWait(http.MethodGet, fmt.Sprintf("%s/v1/jobs/%d?wait=60", env.URL, id), harness.ProducerToken, nil)
	waiting := func() float64 {
		v, _ := metricValue(scrape(t, env.URL), "sluice_job_waiters")
		return v
	}
	wait.Until(t, 10*time.Second, "the GET to wait", func() bool { return waiting() == 1 })
	env.SetConfig(t, func(c *limits.Config) { c.GlobalInFlight = 4 })
	var a waitAnswer
	select {
	case a = <-answer:
	case <-time.After(time.Minute):
		t.Fatal("the waiting GET did not answer within a minute of the job's release")
	}
	if a.err != nil || a.status != http.StatusOK || a.body["status"] != "succeeded" {
		t.Fatalf("waiting GET: %d %v (%v); want 200 succeeded", a.status, a.body, a.err)
	}
	text := scrape(t, env.URL)
	poke, _ := metricValue(text, `sluice_job_waiter_wakes_total{source="poke"}`)
	backstop, _ := metricValue(text, `sluice_job_waiter_wakes_total{source="backstop"}`)
	if poke < 1 || backstop != 0 {
		t.Fatalf("wakes: poke %v, backstop %v; want the release poke's and no backstop's", poke, backstop)
	}
	if n := waiting(); n != 0 {
		t.Fatalf("%v waiters left after the answer", n)
	}

	for _, c := range []struct {
		name, path string
		body       map[string]any
	}{
		{"query", "/v1/jobs?wait=30", map[string]any{"tenant": "acme"}},
		{"body", "/v1/jobs", map[string]any{"tenant": "acme", "wait": 30}},
	} {
		r := env.Do(t, http.MethodPost, c.path, harness.ProducerToken, c.body)
		if r.Status != http.StatusOK || r.Body["status"] != "succeeded" || r.Header.Get("Location") == "" {
			t.Fatalf("POST with wait in the %s: %d %s; want 200 succeeded with a Location", c.name, r.Status, r.Raw)
		}
	}
}

// TestWaitBackstop: a change that sends no release poke (a cancel) wakes a waiter through the
// backstop's read, driven here one tick at a time.
func TestWaitBackstop(t *testing.T) {
	t.Parallel()
	f := startFrontDoor(t, fdOptions{})
	hub := f.api.Waiters()
	id := jobID(t, f.do(t, http.MethodPost, "/v1/jobs", fdAlphaToken, map[string]any{"tenant": "acme"}).Body)
	answer := goWait(http.MethodGet, fmt.Sprintf("%s/v1/jobs/%d?wait=60", f.url, id), fdAlphaToken, nil)
	wait.Until(t, 10*time.Second, "the GET to wait", func() bool { return hub.Len() == 1 })
	if err := hub.Tick(context.Background()); err != nil { // the job has not changed: no wake
		t.Fatal(err)
	}
	if _, backstop := hub.Wakes(); backstop != 0 {
		t.Fatalf("the backstop woke a waiter of a job that had not changed (%d)", backstop)
	}
	if r := f.do(t, http.MethodDelete, fmt.Sprintf("/v1/jobs/%d", id), fdAlphaToken, nil); r.Status != http.StatusOK {
		t.Fatalf("cancel: %d %s", r.Status, r.Raw)
	}
	var a waitAnswer
	wait.Until(t, 10*time.Second, "the backstop to answer the waiter", func() bool {
		if err := hub.Tick(context.Background()); err != nil {
			t.Fatal(err)
		}
		select {
		case a = <-answer:
			return true
		default:
			return false
		}
	})
	if a.err != nil || a.status != http.StatusOK || a.body["status"] != "canceled" {
		t.Fatalf("waiting GET: %d %v (%v); want 200 canceled", a.status, a.body, a.err)
	}
	if poke, backstop := hub.Wakes(); poke != 0 || backstop < 1 {
		t.Fatalf("wakes: poke %d, backstop %d; want the backstop's only", poke, backstop)
	}
}

// TestWaitEnds: a wait that ends before the job answers with the job as it is, after the wait:
// 200 for GET, 202 for POST. A terminal job answers at once.
func TestWaitEnds(t *testing.T) {
	t.Parallel()
	f := startFrontDoor(t, fdOptions{})
	id := jobID(t, f.do(t, http.MethodPost, "/v1/jobs", fdAlphaToken, map[string]any{"tenant": "acme"}).Body)
	a := <-goWait(http.MethodGet, fmt.Sprintf("%s/v1/jobs/%d?wait=0.3", f.url, id), fdAlphaToken, nil)
	if a.err != nil || a.status != http.StatusOK || a.body["status"] != "queued" || a.took < 300*time.Millisecond {
		t.Fatalf("GET ?wait=0.3 of a queued job: %d %v in %v (%v); want 200 queued after 0.3 s", a.status, a.body, a.took, a.err)
	}
	a = <-goWait(http.MethodPost, f.url+"/v1/jobs?wait=0.2", fdAlphaToken, map[string]any{"tenant": "acme"})
	if a.err != nil || a.status != http.StatusAccepted || a.body["status"] != "queued" || a.took < 200*time.Millisecond {
		t.Fatalf("POST ?wait=0.2: %d %v in %v (%v); want 202 queued after 0.2 s", a.status, a.body, a.took, a.err)
	}
	if r := f.do(t, http.MethodDelete, fmt.Sprintf("/v1/jobs/%d", id), fdAlphaToken, nil); r.Status != http.StatusOK {
		t.Fatalf("cancel: %d %s", r.Status, r.Raw)
	}
	a = <-goWait(http.MethodGet, fmt.Sprintf("%s/v1/jobs/%d?wait=60", f.url, id), fdAlphaToken, nil)
	if a.status != http.StatusOK || a.body["status"] != "canceled" || a.took > 30*time.Second {
		t.Fatalf("GET ?wait=60 of a canceled job: %d %v in %v; want 200 canceled at once", a.status, a.body, a.took)
	}
	if n := f.api.Waiters().Len(); n != 0 {
		t.Fatalf("%d waiters left", n)
	}
}

// TestWaitBadInput: a wait that is not a number of seconds from 0 to 60 is 400 naming `wait`,
// and an admission with one writes nothing.
func TestWaitBadInput(t *testing.T) {
	t.Parallel()
	f := startFrontDoor(t, fdOptions{})
	id := jobID(t, f.do(t, http.MethodPost, "/v1/jobs", fdAlphaToken, map[string]any{"tenant": "acme"}).Body)
	before := f.rowCounts(t)
	for _, bad := range []string{"abc", "-1", "61", "NaN", "1e9", "0x10"} {
		r := f.do(t, http.MethodGet, fmt.Sprintf("/v1/jobs/%d?wait=%s", id, bad), fdAlphaToken, nil)
		if r.Status != http.StatusBadRequest || r.Body["error_code"] != "invalid_request" || r.Body["field"] != "wait" {
			t.Errorf("GET ?wait=%s: %d %s; want 400 invalid_request on wait", bad, r.Status, r.Raw)
		}
		r = f.do(t, http.MethodPost, "/v1/jobs?wait="+bad, fdAlphaToken, map[string]any{"tenant": "acme"})
		if r.Status != http.StatusBadRequest || r.Body["field"] != "wait" {
			t.Errorf("POST ?wait=%s: %d %s; want 400 on wait", bad, r.Status, r.Raw)
		}
	}
	for _, body := range []string{`{"tenant":"acme","wait":"soon"}`, `{"tenant":"acme","wait":120}`, `{"tenant":"acme","wait":-3}`} {
		r := f.do(t, http.MethodPost, "/v1/jobs", fdAlphaToken, []byte(body))
		if r.Status != http.StatusBadRequest || r.Body["field"] != "wait" {
			t.Errorf("POST %s: %d %s; want 400 on wait", body, r.Status, r.Raw)
		}
	}
	if after := f.rowCounts(t); after != before {
		t.Fatalf("rows (jobs, outbox, tenants) %v before the bad waits, %v after", before, after)
	}
	// A "wait" inside the payload is the payload's.
	r := f.do(t, http.MethodPost, "/v1/jobs", fdAlphaToken, []byte(`{"tenant":"acme","payload":{"wait":"soon"}}`))
	if r.Status != http.StatusAccepted {
		t.Fatalf("a payload with a wait field: %d %s; want 202", r.Status, r.Raw)
	}
}

// TestWaitBusy: past a caller's bound of waiters, its next wait is 503 busy while another
// caller still waits; a waiter gives back its request slot, so waiters never refuse other
// requests.
func TestWaitBusy(t *testing.T) {
	t.Parallel()
	// One request slot: the waiters must have given theirs back for any other request to pass.
	f := startFrontDoor(t, fdOptions{waiters: &waiters.Config{MaxPerCaller: 1, Max: 2}, maxRequests: 1})
	hub := f.api.Waiters()
	id := jobID(t, f.do(t, http.MethodPost, "/v1/jobs", fdAlphaToken, map[string]any{"tenant": "acme"}).Body)
	path := fmt.Sprintf("/v1/jobs/%d?wait=60", id)
	first := goWait(http.MethodGet, f.url+path, fdAlphaToken, nil)
	wait.Until(t, 10*time.Second, "the first GET to wait", func() bool { return hub.Len() == 1 })
	r := f.do(t, http.MethodGet, path, fdAlphaToken, nil)
	if r.Status != http.StatusServiceUnavailable || r.Body["error_code"] != "busy" || r.Header.Get("Retry-After") == "" {
		t.Fatalf("a second wait of the same caller: %d %s; want 503 busy with Retry-After", r.Status, r.Raw)
	}
	second := goWait(http.MethodGet, f.url+path, fdStarToken, nil)
	wait.Until(t, 10*time.Second, "another caller's GET to wait", func() bool { return hub.Len() == 2 })
	r = f.do(t, http.MethodGet, path, fdAdminToken, nil)
	if r.Status != http.StatusServiceUnavailable || !strings.Contains(fmt.Sprint(r.Body["message"]), "waiting") {
		t.Fatalf("a wait past the process's bound: %d %s; want 503 busy", r.Status, r.Raw)
	}
	// An admission whose wait is refused is still an admission: 202, never an error to retry.
	r = f.do(t, http.MethodPost, "/v1/jobs?wait=60", fdAlphaToken, map[string]any{"tenant": "acme"})
	if r.Status != http.StatusAccepted || r.Body["status"] != "queued" {
		t.Fatalf("POST ?wait=60 with the waiters full: %d %s; want 202 queued at once", r.Status, r.Raw)
	}
	if r := f.do(t, http.MethodGet, fmt.Sprintf("/v1/jobs/%d", id), fdAlphaToken, nil); r.Status != http.StatusOK {
		t.Fatalf("a GET without wait while the waiters are full: %d %s", r.Status, r.Raw)
	}
	hub.Wake(id) // the job has not changed: each waiter reads it again and goes on waiting
	hub.Stop()   // as at shutdown: both answer with the job as it is
	for _, ch := range []<-chan waitAnswer{first, second} {
		if a := <-ch; a.status != http.StatusOK || a.body["status"] != "queued" || a.took > 30*time.Second {
			t.Fatalf("a waiter at Stop: %d %v after %v; want 200 queued at once", a.status, a.body, a.took)
		}
	}
}
