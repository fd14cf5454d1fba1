package integration_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/waiters"
	"github.com/sluicehq/sluice/integration/apitest"
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

// waitersAt reads a process's waiters gauge and its wake counters (/metrics at url).
func waitersAt(tb testing.TB, url string) (waiting, poke, backstop float64) {
	tb.Helper()
	m := scrape(tb, url)
	waiting, _ = metricValue(m, "sluice_job_waiters")
	poke, _ = metricValue(m, `sluice_job_waiter_wakes_total{source="poke"}`)
	backstop, _ = metricValue(m, `sluice_job_waiter_wakes_total{source="backstop"}`)
	return waiting, poke, backstop
}

// untilWaiting waits until n requests wait in the process at url.
func untilWaiting(tb testing.TB, url string, n float64) {
	tb.Helper()
	wait.Until(tb, time.Minute, fmt.Sprintf("%v waiting requests", n), func() bool {
		w, _, _ := waitersAt(tb, url)
		return w == n
	})
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
// ends, woken by the job's release poke through NATS: the API runs in a process of its own, the
// drainer and the relay in another, and the backstop's period is an hour, so nothing else can
// have woken it; the waiter read nothing while it waited. POST /v1/jobs?wait= answers 200 with
// the outcome, in the query or in the body, and the Go client waits the same way.
func TestWaitWokenByReleasePoke(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{API: true, WaitBackstop: time.Hour})
	env.StartApp(t, harness.Options{Drainer: true, Relay: true})
	env.SetConfig(t, func(c *config.Config) { c.GlobalInFlight = 0 }) // hold the job queued
	id := env.Admit(t, "acme", map[string]any{"sleep_ms": 50})
	answer := goWait(http.MethodGet, fmt.Sprintf("%s/v1/jobs/%d?wait=60", env.URL, id), harness.ProducerToken, nil)
	untilWaiting(t, env.URL, 1)
	env.SetConfig(t, func(c *config.Config) { c.GlobalInFlight = 4 })
	var a waitAnswer
	select {
	case a = <-answer:
	case <-time.After(time.Minute):
		t.Fatal("the waiting GET did not answer within a minute of the job's release")
	}
	if a.err != nil || a.status != http.StatusOK || a.body["status"] != "succeeded" {
		t.Fatalf("waiting GET: %d %v (%v); want 200 succeeded", a.status, a.body, a.err)
	}
	waiting, poke, backstop := waitersAt(t, env.URL)
	if poke < 1 || backstop != 0 {
		t.Fatalf("wakes: poke %v, backstop %v; want the release poke's and no backstop's", poke, backstop)
	}
	if waiting != 0 {
		t.Fatalf("%v waiters left after the answer", waiting)
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

	// The Go client waits the same way.
	id = env.Admit(t, "acme", map[string]any{"sleep_ms": 50, "outcome": "failed"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	j, err := client.New(env.URL, harness.ProducerToken).Wait(ctx, id)
	if err != nil || j.ID != id || j.Status != job.Failed {
		t.Fatalf("client Wait: %+v, %v; want job %d failed", j, err, id)
	}
}

// TestWaitBackstop: a change that sends no release poke (a cancel) wakes a waiter through the
// backstop's read, driven here one tick at a time.
func TestWaitBackstop(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	hub := f.API.Waiters()
	id := apitest.JobID(t, f.Do(t, http.MethodPost, "/v1/jobs", apitest.AlphaToken, map[string]any{"tenant": "acme"}).Body)
	answer := goWait(http.MethodGet, fmt.Sprintf("%s/v1/jobs/%d?wait=60", f.URL, id), apitest.AlphaToken, nil)
	wait.Until(t, 10*time.Second, "the GET to wait", func() bool { return hub.Len() == 1 })
	if err := hub.Tick(context.Background()); err != nil { // the job has not changed: no wake
		t.Fatal(err)
	}
	if _, backstop := hub.Wakes(); backstop != 0 {
		t.Fatalf("the backstop woke a waiter of a job that had not changed (%d)", backstop)
	}
	if r := f.Do(t, http.MethodDelete, fmt.Sprintf("/v1/jobs/%d", id), apitest.AlphaToken, nil); r.Status != http.StatusOK {
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
	f := apitest.Setup(t, apitest.Options{})
	id := apitest.JobID(t, f.Do(t, http.MethodPost, "/v1/jobs", apitest.AlphaToken, map[string]any{"tenant": "acme"}).Body)
	a := <-goWait(http.MethodGet, fmt.Sprintf("%s/v1/jobs/%d?wait=0.3", f.URL, id), apitest.AlphaToken, nil)
	if a.err != nil || a.status != http.StatusOK || a.body["status"] != "queued" || a.took < 300*time.Millisecond {
		t.Fatalf("GET ?wait=0.3 of a queued job: %d %v in %v (%v); want 200 queued after 0.3 s", a.status, a.body, a.took, a.err)
	}
	a = <-goWait(http.MethodPost, f.URL+"/v1/jobs?wait=0.2", apitest.AlphaToken, map[string]any{"tenant": "acme"})
	if a.err != nil || a.status != http.StatusAccepted || a.body["status"] != "queued" || a.took < 200*time.Millisecond {
		t.Fatalf("POST ?wait=0.2: %d %v in %v (%v); want 202 queued after 0.2 s", a.status, a.body, a.took, a.err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if j, err := f.Alpha.Wait(ctx, id); !errors.Is(err, context.DeadlineExceeded) || j.Status != job.Queued {
		t.Fatalf("client Wait past its context's deadline: %+v, %v; want the queued job and DeadlineExceeded", j, err)
	}
	if r := f.Do(t, http.MethodDelete, fmt.Sprintf("/v1/jobs/%d", id), apitest.AlphaToken, nil); r.Status != http.StatusOK {
		t.Fatalf("cancel: %d %s", r.Status, r.Raw)
	}
	a = <-goWait(http.MethodGet, fmt.Sprintf("%s/v1/jobs/%d?wait=60", f.URL, id), apitest.AlphaToken, nil)
	if a.status != http.StatusOK || a.body["status"] != "canceled" || a.took > 30*time.Second {
		t.Fatalf("GET ?wait=60 of a canceled job: %d %v in %v; want 200 canceled at once", a.status, a.body, a.took)
	}
	if n := f.API.Waiters().Len(); n != 0 {
		t.Fatalf("%d waiters left", n)
	}
}

// TestWaitBadInput: a wait that is not a number of seconds from 0 to 60 is 400 naming `wait`,
// and an admission with one writes nothing.
func TestWaitBadInput(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	id := apitest.JobID(t, f.Do(t, http.MethodPost, "/v1/jobs", apitest.AlphaToken, map[string]any{"tenant": "acme"}).Body)
	before := f.RowCounts(t)
	for _, bad := range []string{"abc", "-1", "61", "NaN", "1e9", "0x10"} {
		r := f.Do(t, http.MethodGet, fmt.Sprintf("/v1/jobs/%d?wait=%s", id, bad), apitest.AlphaToken, nil)
		if r.Status != http.StatusBadRequest || r.Body["error_code"] != "invalid_request" || r.Body["field"] != "wait" {
			t.Errorf("GET ?wait=%s: %d %s; want 400 invalid_request on wait", bad, r.Status, r.Raw)
		}
		r = f.Do(t, http.MethodPost, "/v1/jobs?wait="+bad, apitest.AlphaToken, map[string]any{"tenant": "acme"})
		if r.Status != http.StatusBadRequest || r.Body["field"] != "wait" {
			t.Errorf("POST ?wait=%s: %d %s; want 400 on wait", bad, r.Status, r.Raw)
		}
	}
	for _, body := range []string{`{"tenant":"acme","wait":"soon"}`, `{"tenant":"acme","wait":120}`, `{"tenant":"acme","wait":-3}`} {
		r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.AlphaToken, []byte(body))
		if r.Status != http.StatusBadRequest || r.Body["field"] != "wait" {
			t.Errorf("POST %s: %d %s; want 400 on wait", body, r.Status, r.Raw)
		}
	}
	if after := f.RowCounts(t); after != before {
		t.Fatalf("rows (jobs, outbox, tenants) %v before the bad waits, %v after", before, after)
	}
	// A "wait" inside the payload is the payload's.
	r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.AlphaToken, []byte(`{"tenant":"acme","payload":{"wait":"soon"}}`))
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
	f := apitest.Setup(t, apitest.Options{Waiters: &waiters.Config{MaxPerCaller: 1, Max: 2}, MaxRequests: 1})
	hub := f.API.Waiters()
	id := apitest.JobID(t, f.Do(t, http.MethodPost, "/v1/jobs", apitest.AlphaToken, map[string]any{"tenant": "acme"}).Body)
	path := fmt.Sprintf("/v1/jobs/%d?wait=60", id)
	first := goWait(http.MethodGet, f.URL+path, apitest.AlphaToken, nil)
	wait.Until(t, 10*time.Second, "the first GET to wait", func() bool { return hub.Len() == 1 })
	r := f.Do(t, http.MethodGet, path, apitest.AlphaToken, nil)
	if r.Status != http.StatusServiceUnavailable || r.Body["error_code"] != "busy" || r.Header.Get("Retry-After") == "" {
		t.Fatalf("a second wait of the same caller: %d %s; want 503 busy with Retry-After", r.Status, r.Raw)
	}
	second := goWait(http.MethodGet, f.URL+path, apitest.StarToken, nil)
	wait.Until(t, 10*time.Second, "another caller's GET to wait", func() bool { return hub.Len() == 2 })
	r = f.Do(t, http.MethodGet, path, apitest.AdminToken, nil)
	if r.Status != http.StatusServiceUnavailable || !strings.Contains(fmt.Sprint(r.Body["message"]), "waiting") {
		t.Fatalf("a wait past the process's bound: %d %s; want 503 busy", r.Status, r.Raw)
	}
	// An admission whose wait is refused is still an admission: 202, never an error to retry.
	r = f.Do(t, http.MethodPost, "/v1/jobs?wait=60", apitest.AlphaToken, map[string]any{"tenant": "acme"})
	if r.Status != http.StatusAccepted || r.Body["status"] != "queued" {
		t.Fatalf("POST ?wait=60 with the waiters full: %d %s; want 202 queued at once", r.Status, r.Raw)
	}
	if r := f.Do(t, http.MethodGet, fmt.Sprintf("/v1/jobs/%d", id), apitest.AlphaToken, nil); r.Status != http.StatusOK {
		t.Fatalf("a GET without wait while the waiters are full: %d %s", r.Status, r.Raw)
	}
	// The client retries a busy wait after Retry-After, until its context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	if _, err := f.Alpha.Wait(ctx, id); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("client Wait while its caller's waiters are full: %v; want DeadlineExceeded after retrying", err)
	}
	hub.Wake(id) // the job has not changed: each waiter reads it again and goes on waiting
	hub.Stop()   // as at shutdown: both answer with the job as it is
	for _, ch := range []<-chan waitAnswer{first, second} {
		if a := <-ch; a.status != http.StatusOK || a.body["status"] != "queued" || a.took > 30*time.Second {
			t.Fatalf("a waiter at Stop: %d %v after %v; want 200 queued at once", a.status, a.body, a.took)
		}
	}
}

// sseEvent is one server-sent event of an events stream.
type sseEvent struct {
	id, event, data string
}

// sseStream reads server-sent events off an open GET .../events?follow=1.
type sseStream struct {
	resp *http.Response
	sc   *bufio.Scanner
}

func openEvents(t *testing.T, url, token string, h http.Header) *sseStream {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req) // the whole stream, to its end
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		raw, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %d %s %s; want a 200 event stream", url, resp.StatusCode, resp.Header.Get("Content-Type"), raw)
	}
	return &sseStream{resp: resp, sc: bufio.NewScanner(resp.Body)}
}

// next returns the next event, skipping comments; ok is false at the end of the stream.
func (s *sseStream) next() (e sseEvent, ok bool) {
	for s.sc.Scan() {
		line := s.sc.Text()
		switch {
		case line == "":
			if e.event != "" || e.data != "" {
				return e, true
			}
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id: "):
			e.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			e.event = line[7:]
		case strings.HasPrefix(line, "data: "):
			e.data = line[6:]
		}
	}
	return e, false
}

// rest reads the stream to its end and returns its events.
func (s *sseStream) rest() []sseEvent {
	var out []sseEvent
	for e, ok := s.next(); ok; e, ok = s.next() {
		out = append(out, e)
	}
	return out
}

// TestFollowEvents: GET /v1/jobs/{id}/events?follow=1 streams the job's audit events as
// server-sent events, in order and each once, woken by the release poke (the backstop's period
// is an hour), and ends with the job once it is terminal; a client that reconnects with
// Last-Event-ID gets only what followed that event.
func TestFollowEvents(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{WaitBackstop: time.Hour})
	env.SetConfig(t, func(c *config.Config) { c.GlobalInFlight = 0 })
	id := env.Admit(t, "acme", map[string]any{"sleep_ms": 20})
	url := fmt.Sprintf("%s/v1/jobs/%d/events?follow=1", env.URL, id)
	s := openEvents(t, url, harness.ProducerToken, nil)
	first, ok := s.next()
	if !ok || first.event != "admitted" {
		t.Fatalf("the stream's first event: %+v (%v); want admitted", first, ok)
	}
	env.SetConfig(t, func(c *config.Config) { c.GlobalInFlight = 4 })
	events := append([]sseEvent{first}, s.rest()...)
	last := events[len(events)-1]
	if last.event != "end" || !strings.Contains(last.data, `"status":"succeeded"`) {
		t.Fatalf("the stream's last event: %+v; want end with the succeeded job", last)
	}
	var tos []string
	prev := int64(0)
	for _, e := range events[:len(events)-1] {
		n, err := strconv.ParseInt(e.id, 10, 64)
		if err != nil || n <= prev {
			t.Fatalf("event ids not rising: %+v after %d", e, prev)
		}
		prev = n
		var ev struct {
			To string `json:"to"`
		}
		if err := json.Unmarshal([]byte(e.data), &ev); err != nil {
			t.Fatalf("event data %q: %v", e.data, err)
		}
		tos = append(tos, e.event+":"+ev.To)
	}
	var recorded struct {
		Events []struct {
			Event, To string
		}
	}
	r := env.Do(t, http.MethodGet, fmt.Sprintf("/v1/jobs/%d/events", id), harness.ProducerToken, nil)
	if err := json.Unmarshal(r.Raw, &recorded); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, e := range recorded.Events {
		want = append(want, e.Event+":"+e.To)
	}
	if !slices.Equal(tos, want) || len(want) < 3 {
		t.Fatalf("streamed %v; the trail has %v", tos, want)
	}

	s = openEvents(t, url, harness.ProducerToken, http.Header{"Last-Event-Id": {first.id}})
	again := s.rest()
	if len(again) != len(events)-1 || again[0].id == first.id || again[len(again)-1].event != "end" {
		t.Fatalf("resumed after event %s: %d events %+v; want the %d after it and end", first.id, len(again), again, len(events)-2)
	}

	for _, bad := range []struct {
		query string
		h     http.Header
		field string
	}{
		{"?follow=yes", nil, "follow"},
		{"?follow=1", http.Header{"Last-Event-Id": {"x"}}, "Last-Event-ID"},
	} {
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/v1/jobs/%d/events%s", env.URL, id, bad.query), nil)
		req.Header.Set("Authorization", "Bearer "+harness.ProducerToken)
		for k, v := range bad.h {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(raw), `"field":"`+bad.field+`"`) {
			t.Errorf("events%s %v: %d %s; want 400 on %s", bad.query, bad.h, resp.StatusCode, raw, bad.field)
		}
	}
}

// TestEndedAfterOutcomes: the drainer announces the jobs whose outcomes it wrote
// (drainer.Config.Ended, which the app wires to its waiters) once they are committed: each call
// names jobs that a connection of its own reads as ended.
func TestEndedAfterOutcomes(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	ctx := context.Background()
	var admitted []int64
	for range 2 {
		admitted = append(admitted, apitest.JobID(t, f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": "acme"}).Body))
	}
	var mu sync.Mutex
	var announced []int64
	d, err := drainer.New(drainer.Config{DB: f.DB.DB, Executor: starting(f.Exec), ID: "d-announce",
		Ended: func(ids []int64) {
			for _, id := range ids {
				var status string
				if err := f.DB.QueryRowContext(ctx, "SELECT status FROM jobs WHERE id = ?", id).Scan(&status); err != nil || status != "succeeded" {
					t.Errorf("Ended named job %d while another connection reads it %q (%v)", id, status, err)
				}
			}
			mu.Lock()
			announced = append(announced, ids...)
			mu.Unlock()
		}})
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
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(announced)
	if !slices.Equal(announced, admitted) {
		t.Fatalf("Ended announced %v; want each job once, %v", announced, admitted)
	}
}
