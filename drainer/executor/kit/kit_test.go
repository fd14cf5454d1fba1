package kit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer/executor"
)

const (
	secret = "kit-secret"
	token  = "kit-executor-token"
)

// fakeAPI stands for sluice's API: it records every call and answers /start and /complete with
// the scripted codes in turn (the last one repeating; none: 200).
type fakeAPI struct {
	t   *testing.T
	srv *httptest.Server

	mu       sync.Mutex
	calls    []apiCall
	starts   []int
	complete []int
	called   chan apiCall
}

type apiCall struct {
	Path string
	Body map[string]any
}

func newFakeAPI(t *testing.T) *fakeAPI {
	a := &fakeAPI{t: t, called: make(chan apiCall, 100)}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, `{"error_code":"unauthorized"}`, http.StatusUnauthorized)
			return
		}
		var c apiCall
		c.Path = r.URL.Path
		_ = json.NewDecoder(r.Body).Decode(&c.Body)
		a.mu.Lock()
		a.calls = append(a.calls, c)
		script := &a.complete
		if strings.HasSuffix(c.Path, "/start") {
			script = &a.starts
		}
		code := http.StatusOK
		if len(*script) > 0 {
			code = (*script)[0]
			if len(*script) > 1 {
				*script = (*script)[1:]
			}
		}
		a.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		switch code {
		case http.StatusOK:
			_, _ = w.Write([]byte(`{"status":"running"}`))
		case http.StatusServiceUnavailable:
			_, _ = w.Write([]byte(`{"error_code":"unavailable","retryable":true}`))
		case http.StatusConflict:
			_, _ = w.Write([]byte(`{"error_code":"dispatch_void","status":"queued"}`))
		}
		a.called <- c
	}))
	t.Cleanup(a.srv.Close)
	return a
}

// script sets the answers to /start and /complete.
func (a *fakeAPI) script(starts, complete []int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.starts, a.complete = starts, complete
}

func (a *fakeAPI) paths() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, c := range a.calls {
		out = append(out, c.Path)
	}
	return out
}

// next waits for the API's next call.
func (a *fakeAPI) next() apiCall {
	a.t.Helper()
	select {
	case c := <-a.called:
		return c
	case <-time.After(10 * time.Second):
		a.t.Fatal("no API call within 10 s")
		return apiCall{}
	}
}

// newHandler is New with the test's secret, the fake API and token; it fails t on an error and
// closes the Handler in t's cleanup.
func newHandler(t *testing.T, api *fakeAPI, run Func, opts ...Option) *Handler {
	t.Helper()
	h, err := New(secret, api.srv.URL, token, run, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// dispatch is a dispatch of job id with nonce, its deadline a minute away.
func dispatch(id int64, nonce string, payload string) executor.Dispatch {
	key := "0123abcd"
	return executor.Dispatch{JobID: id, Tenant: "acme", RateKeySHA256: &key, Payload: json.RawMessage(payload),
		Nonce: nonce, Deadline: time.Now().Add(time.Minute).UTC(), Version: 3, Attempt: 1}
}

// send posts body signed with key to h, as the drainer does, and returns the answer.
func send(h http.Handler, body []byte, key string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/dispatch", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(executor.HeaderSignature, executor.Sign([]byte(key), body))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func encode(t *testing.T, d executor.Dispatch) []byte {
	t.Helper()
	raw, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// answerOf decodes a dispatch answer the way the drainer does.
func answerOf(rec *httptest.ResponseRecorder) executor.Answer {
	return executor.Classify(rec.Code, rec.Header().Get("Retry-After"), rec.Body.Bytes())
}

// TestSyncJob: a signed dispatch is confirmed with its nonce, then run with the job as sent, and
// its outcome is the answer, which the drainer reads as Done.
func TestSyncJob(t *testing.T) {
	api := newFakeAPI(t)
	var got Job
	h := newHandler(t, api, func(ctx context.Context, j Job) Outcome {
		got = j
		if _, ok := ctx.Deadline(); !ok {
			t.Error("the function's context has no deadline")
		}
		return Succeeded(map[string]int{"rows": 3})
	})
	d := dispatch(7, "nonce-7", `{"x":1}`)
	rec := send(h, encode(t, d), secret)
	a := answerOf(rec)
	if a.Kind != executor.Done || a.Status != "succeeded" || string(a.Result) != `{"rows":3}` {
		t.Fatalf("answer HTTP %d %s: %+v", rec.Code, rec.Body, a)
	}
	if got.ID != 7 || got.Tenant != "acme" || got.RateKeySHA256 != "0123abcd" || string(got.Payload) != `{"x":1}` ||
		got.Nonce != "nonce-7" || !got.Deadline.Equal(d.Deadline) || got.Version != 3 || got.Attempt != 1 {
		t.Errorf("the function got %+v, want the dispatch %+v", got, d)
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	if c := api.calls; len(c) != 1 || c[0].Path != "/v1/jobs/7/start" || c[0].Body["nonce"] != "nonce-7" {
		t.Errorf("API calls %+v, want one /v1/jobs/7/start with the nonce", c)
	}
}

// TestSignatureForgeryRefused: a dispatch without the right signature is refused with 401
// before anything else: no start, no run, no OnReceive.
func TestSignatureForgeryRefused(t *testing.T) {
	api := newFakeAPI(t)
	var runs, received atomic.Int32
	h := newHandler(t, api, func(context.Context, Job) Outcome { runs.Add(1); return Outcome{} },
		OnReceive(func(Job) { received.Add(1) }))
	body := encode(t, dispatch(7, "n", `{}`))
	tampered := bytes.Replace(body, []byte(`"acme"`), []byte(`"evil"`), 1)
	for name, rec := range map[string]*httptest.ResponseRecorder{
		"another secret": send(h, body, "guessed-secret"),
		"tampered body": func() *httptest.ResponseRecorder {
			req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(tampered))
			req.Header.Set(executor.HeaderSignature, executor.Sign([]byte(secret), body))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			return rec
		}(),
		"unsigned": func() *httptest.ResponseRecorder {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body)))
			return rec
		}(),
	} {
		if rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), "bad_signature") {
			t.Errorf("%s: HTTP %d %s, want 401 bad_signature", name, rec.Code, rec.Body)
		}
	}
	if runs.Load() != 0 || received.Load() != 0 || len(api.paths()) != 0 {
		t.Fatalf("forged dispatches: %d runs, %d received, API calls %q; want none", runs.Load(), received.Load(), api.paths())
	}
	// The genuine body still runs: the forgeries did not use up its nonce.
	if rec := send(h, body, secret); rec.Code != http.StatusOK || runs.Load() != 1 {
		t.Fatalf("the genuine dispatch: HTTP %d %s, %d runs", rec.Code, rec.Body, runs.Load())
	}
}

// TestReplayRefused: the same signed dispatch again is refused with 409 and neither confirmed
// nor run a second time; another dispatch of the same job (a new nonce) runs.
func TestReplayRefused(t *testing.T) {
	api := newFakeAPI(t)
	var runs atomic.Int32
	h := newHandler(t, api, func(context.Context, Job) Outcome { runs.Add(1); return Outcome{} })
	body := encode(t, dispatch(7, "n1", `{}`))
	if rec := send(h, body, secret); rec.Code != http.StatusOK {
		t.Fatalf("first: HTTP %d %s", rec.Code, rec.Body)
	}
	rec := send(h, body, secret)
	if rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), "replayed") {
		t.Fatalf("replay: HTTP %d %s, want 409 replayed", rec.Code, rec.Body)
	}
	if rec := send(h, encode(t, dispatch(7, "n2", `{}`)), secret); rec.Code != http.StatusOK {
		t.Fatalf("redispatch with a new nonce: HTTP %d %s", rec.Code, rec.Body)
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("%d runs, want 2 (the replay not run)", n)
	}
	if p := api.paths(); len(p) != 2 {
		t.Fatalf("API calls %q, want two starts", p)
	}
}

// TestPastDeadlineRefused: a dispatch whose deadline has passed is refused without a start: a
// replay of a nonce the memory has forgotten is one.
func TestPastDeadlineRefused(t *testing.T) {
	api := newFakeAPI(t)
	var runs atomic.Int32
	h := newHandler(t, api, func(context.Context, Job) Outcome { runs.Add(1); return Outcome{} })
	d := dispatch(7, "n", `{}`)
	d.Deadline = time.Now().Add(-time.Second)
	rec := send(h, encode(t, d), secret)
	if rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), "deadline_passed") || runs.Load() != 0 || len(api.paths()) != 0 {
		t.Fatalf("HTTP %d %s, %d runs, API calls %q; want 409 deadline_passed and nothing done", rec.Code, rec.Body, runs.Load(), api.paths())
	}
}

// TestStartRefusedNeverRuns: the job runs only after a 200 from /start. A 409 (the dispatch was
// voided) or any other answer but a retryable 503 is final: the function is never called and the
// dispatch is answered 409. A retryable 503 is asked again with the same nonce.
func TestStartRefusedNeverRuns(t *testing.T) {
	for _, tc := range []struct {
		name   string
		starts []int
		runs   int32
		calls  int
	}{
		{"409 dispatch_void", []int{http.StatusConflict}, 0, 1},
		{"502 is final", []int{http.StatusBadGateway}, 0, 1},
		{"retryable 503 then 200", []int{http.StatusServiceUnavailable, http.StatusServiceUnavailable, http.StatusOK}, 1, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newFakeAPI(t)
			api.script(tc.starts, nil)
			var runs, refused atomic.Int32
			h := newHandler(t, api, func(context.Context, Job) Outcome { runs.Add(1); return Outcome{} },
				OnStartRefused(func(Job, error) { refused.Add(1) }))
			rec := send(h, encode(t, dispatch(7, "n7", `{}`)), secret)
			if runs.Load() != tc.runs || refused.Load() != 1-tc.runs {
				t.Fatalf("HTTP %d %s: %d runs, %d refusals; want %d runs", rec.Code, rec.Body, runs.Load(), refused.Load(), tc.runs)
			}
			if tc.runs == 0 && (rec.Code != http.StatusConflict || answerOf(rec).Kind != executor.Unknown) {
				t.Errorf("refused start answered HTTP %d %s, want 409", rec.Code, rec.Body)
			}
			api.mu.Lock()
			defer api.mu.Unlock()
			if len(api.calls) != tc.calls {
				t.Fatalf("%d /start calls, want %d", len(api.calls), tc.calls)
			}
			for _, c := range api.calls {
				if c.Body["nonce"] != "n7" {
					t.Fatalf("a /start carried nonce %v, want n7", c.Body["nonce"])
				}
			}
		})
	}
}

// TestDeadlineHonoured: the function's context ends at the dispatch's deadline.
func TestDeadlineHonoured(t *testing.T) {
	api := newFakeAPI(t)
	d := dispatch(7, "n", `{}`)
	d.Deadline = time.Now().Add(300 * time.Millisecond)
	var got time.Time
	h := newHandler(t, api, func(ctx context.Context, j Job) Outcome {
		got, _ = ctx.Deadline()
		select {
		case <-ctx.Done():
			return Failed("timeout", ctx.Err().Error())
		case <-time.After(10 * time.Second):
			return Outcome{}
		}
	})
	start := time.Now()
	rec := send(h, encode(t, d), secret)
	if !got.Equal(d.Deadline) {
		t.Errorf("the function's deadline is %s, want the dispatch's %s", got, d.Deadline)
	}
	a := answerOf(rec)
	if a.Status != "failed" || a.ErrorCode != "timeout" || !strings.Contains(a.ErrorMessage, "deadline exceeded") {
		t.Errorf("answer %+v, want the function's timeout", a)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the job ran %s past a deadline 300 ms away", took)
	}
}

// TestConcurrencyLimit: with MaxConcurrent(2), a third dispatch while two run is answered 503
// with the Retry-After given, neither confirmed nor run; a slot freed takes the next one.
func TestConcurrencyLimit(t *testing.T) {
	api := newFakeAPI(t)
	running := make(chan int64, 4)
	finish := make(chan struct{})
	h := newHandler(t, api, func(ctx context.Context, j Job) Outcome {
		if j.ID <= 2 { // the two that fill the slots
			running <- j.ID
			<-finish
		}
		return Outcome{}
	}, MaxConcurrent(2, 2500*time.Millisecond))
	var wg sync.WaitGroup
	codes := make(chan int, 2)
	for id := int64(1); id <= 2; id++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes <- send(h, encode(t, dispatch(id, "n"+strconv.FormatInt(id, 10), `{}`)), secret).Code
		}()
	}
	<-running
	<-running
	rec := send(h, encode(t, dispatch(3, "n3", `{}`)), secret)
	if a := answerOf(rec); a.Kind != executor.Refused || a.RetryAfter != 3 {
		t.Fatalf("third dispatch: HTTP %d %s (Retry-After %q), want 503 with Retry-After 3", rec.Code, rec.Body, rec.Header().Get("Retry-After"))
	}
	if p := api.paths(); len(p) != 2 {
		t.Fatalf("API calls %q, want the two running jobs' starts only", p)
	}
	close(finish)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			t.Errorf("a running job answered HTTP %d", c)
		}
	}
	if rec := send(h, encode(t, dispatch(4, "n4", `{}`)), secret); rec.Code != http.StatusOK {
		t.Fatalf("after the slots freed: HTTP %d %s", rec.Code, rec.Body)
	}
}

// TestAsyncReportRetried: an async job is answered 202 once its start is confirmed, and its
// outcome is reported through /complete, asked again while the API answers 503 or nothing
// reachable, once it is recorded; a 409 is final.
func TestAsyncReportRetried(t *testing.T) {
	for _, tc := range []struct {
		name     string
		complete []int
		calls    int
	}{
		{"recorded after two 503s", []int{http.StatusServiceUnavailable, http.StatusServiceUnavailable, http.StatusOK}, 3},
		{"409 is final", []int{http.StatusConflict, http.StatusOK}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newFakeAPI(t)
			api.script(nil, tc.complete)
			h := newHandler(t, api, func(ctx context.Context, j Job) Outcome { return Failed("upstream_down", "no route") },
				Async(func(Job) bool { return true }))
			rec := send(h, encode(t, dispatch(7, "n7", `{}`)), secret)
			if answerOf(rec).Kind != executor.Accepted {
				t.Fatalf("async dispatch: HTTP %d %s, want 202", rec.Code, rec.Body)
			}
			if c := api.next(); c.Path != "/v1/jobs/7/start" {
				t.Fatalf("first call %s, want the start", c.Path)
			}
			for range tc.calls {
				c := api.next()
				if c.Path != "/v1/jobs/7/complete" || c.Body["nonce"] != "n7" || c.Body["status"] != "failed" ||
					c.Body["error_code"] != "upstream_down" || c.Body["error_message"] != "no route" {
					t.Fatalf("report %+v, want /complete of the failure with the nonce", c)
				}
			}
			if err := h.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			if n := len(api.paths()); n != 1+tc.calls {
				t.Fatalf("%d API calls (%q), want the start and %d reports", n, api.paths(), tc.calls)
			}
		})
	}
}

// TestAsyncReportThroughAnOutage: a report that gets no answer (the connection is cut, as when
// the API is restarting) is sent again until the API records it.
func TestAsyncReportThroughAnOutage(t *testing.T) {
	var mu sync.Mutex
	var reports []string
	recorded := make(chan struct{})
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		reports = append(reports, r.URL.Path)
		n := len(reports)
		mu.Unlock()
		if n <= 2 {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		_, _ = w.Write([]byte(`{}`))
		close(recorded)
	}))
	t.Cleanup(api.Close)
	h, err := New(secret, api.URL, token, func(context.Context, Job) Outcome { return Succeeded(nil) },
		Async(func(Job) bool { return true }), UnconfirmedStarts())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	if rec := send(h, encode(t, dispatch(7, "n7", `{}`)), secret); rec.Code != http.StatusAccepted {
		t.Fatalf("HTTP %d %s", rec.Code, rec.Body)
	}
	select {
	case <-recorded:
	case <-time.After(20 * time.Second):
		t.Fatal("the report was not recorded within 20 s")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reports) != 3 || reports[2] != "/v1/jobs/7/complete" {
		t.Fatalf("reports %q, want three /complete, two of them cut", reports)
	}
}

// TestRateLimited: an upstream 429 becomes a gate. Synchronously it is a 429 with Retry-After
// (before the start, from BeforeStart, no /start is called); asynchronously a /complete with
// gate.retry_after: failed with rate_limited after a confirmed start, not_started without one.
func TestRateLimited(t *testing.T) {
	limited := func(context.Context, Job) Outcome { return RateLimited(1500 * time.Millisecond) }
	t.Run("sync", func(t *testing.T) {
		api := newFakeAPI(t)
		h := newHandler(t, api, limited)
		rec := send(h, encode(t, dispatch(7, "n", `{}`)), secret)
		if a := answerOf(rec); a.Kind != executor.RateLimited || a.RetryAfter != 2 {
			t.Fatalf("HTTP %d %s Retry-After %q, want 429 with 2", rec.Code, rec.Body, rec.Header().Get("Retry-After"))
		}
	})
	t.Run("before the start", func(t *testing.T) {
		api := newFakeAPI(t)
		var runs atomic.Int32
		h := newHandler(t, api, func(context.Context, Job) Outcome { runs.Add(1); return Outcome{} },
			BeforeStart(func(_ context.Context, j Job) *Outcome {
				if string(j.Payload) == `{"spent":true}` {
					o := RateLimited(time.Hour)
					return &o
				}
				return nil
			}))
		rec := send(h, encode(t, dispatch(7, "n", `{"spent":true}`)), secret)
		if a := answerOf(rec); a.Kind != executor.RateLimited || a.RetryAfter != 3600 || runs.Load() != 0 || len(api.paths()) != 0 {
			t.Fatalf("HTTP %d %s, %d runs, API calls %q; want 429 with 3600, nothing started", rec.Code, rec.Body, runs.Load(), api.paths())
		}
		if rec := send(h, encode(t, dispatch(8, "n8", `{}`)), secret); rec.Code != http.StatusOK || runs.Load() != 1 {
			t.Fatalf("a job BeforeStart lets go: HTTP %d, %d runs", rec.Code, runs.Load())
		}
	})
	for _, tc := range []struct {
		name   string
		opts   []Option
		status string
	}{
		{"async", nil, "failed"},
		{"async unconfirmed", []Option{UnconfirmedStarts()}, "not_started"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newFakeAPI(t)
			h := newHandler(t, api, limited, append(tc.opts, Async(func(Job) bool { return true }))...)
			if rec := send(h, encode(t, dispatch(7, "n", `{}`)), secret); rec.Code != http.StatusAccepted {
				t.Fatalf("HTTP %d %s", rec.Code, rec.Body)
			}
			c := api.next()
			if c.Path == "/v1/jobs/7/start" {
				c = api.next()
			}
			g, _ := c.Body["gate"].(map[string]any)
			if c.Path != "/v1/jobs/7/complete" || c.Body["status"] != tc.status || c.Body["error_code"] != "rate_limited" || g["retry_after"] != float64(2) {
				t.Fatalf("report %+v, want status %s, error_code rate_limited, gate.retry_after 2", c, tc.status)
			}
		})
	}
}

// TestUnconfirmedStarts: no /start is called; the job runs at once.
func TestUnconfirmedStarts(t *testing.T) {
	api := newFakeAPI(t)
	h := newHandler(t, api, func(context.Context, Job) Outcome { return Outcome{} }, UnconfirmedStarts())
	if rec := send(h, encode(t, dispatch(7, "n", `{}`)), secret); rec.Code != http.StatusOK || len(api.paths()) != 0 {
		t.Fatalf("HTTP %d, API calls %q; want 200 and none", rec.Code, api.paths())
	}
}

// TestOutcomes: the answers the function's outcomes make, panics included.
func TestOutcomes(t *testing.T) {
	for _, tc := range []struct {
		name             string
		run              Func
		status, code     string
		result, contains string
	}{
		{"zero", func(context.Context, Job) Outcome { return Outcome{} }, "succeeded", "", "", ""},
		{"result", func(context.Context, Job) Outcome { return Succeeded([]int{1, 2}) }, "succeeded", "", "[1,2]", ""},
		{"unencodable", func(context.Context, Job) Outcome { return Succeeded(func() {}) }, "failed", "result_unencodable", "", "func"},
		{"invalid status", func(context.Context, Job) Outcome { return Outcome{Status: "done"} }, "failed", "invalid_outcome", "", "done"},
		{"panic", func(context.Context, Job) Outcome { panic("boom") }, "failed", "executor_panic", "", "boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHandler(t, newFakeAPI(t), tc.run)
			a := answerOf(send(h, encode(t, dispatch(7, "n", `{}`)), secret))
			if a.Kind != executor.Done || a.Status != tc.status || a.ErrorCode != tc.code || string(a.Result) != tc.result ||
				!strings.Contains(a.ErrorMessage, tc.contains) {
				t.Fatalf("answer %+v", a)
			}
		})
	}
}

// TestBadDispatches: what is not a dispatch is refused with a 4xx, nothing run.
func TestBadDispatches(t *testing.T) {
	api := newFakeAPI(t)
	var runs atomic.Int32
	h := newHandler(t, api, func(context.Context, Job) Outcome { runs.Add(1); return Outcome{} })
	for name, tc := range map[string]struct {
		body   string
		header string
		code   int
	}{
		"not JSON":       {`{`, "", http.StatusBadRequest},
		"no job id":      {`{"nonce":"n"}`, "", http.StatusBadRequest},
		"no nonce":       {`{"job_id":3}`, "", http.StatusBadRequest},
		"header differs": {`{"job_id":3,"nonce":"n"}`, "4", http.StatusBadRequest},
	} {
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tc.body))
		req.Header.Set(executor.HeaderSignature, executor.Sign([]byte(secret), []byte(tc.body)))
		if tc.header != "" {
			req.Header.Set(executor.HeaderJobID, tc.header)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tc.code {
			t.Errorf("%s: HTTP %d %s, want %d", name, rec.Code, rec.Body, tc.code)
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET: HTTP %d", rec.Code)
	}
	if runs.Load() != 0 || len(api.paths()) != 0 {
		t.Fatalf("%d runs, API calls %q", runs.Load(), api.paths())
	}
}

// TestNewRefusesBadConfig: New names what is missing.
func TestNewRefusesBadConfig(t *testing.T) {
	run := func(context.Context, Job) Outcome { return Outcome{} }
	for _, tc := range []struct {
		secret, api, token string
		run                Func
		opts               []Option
		field              string
	}{
		{secret, "http://127.0.0.1:7480", token, nil, nil, "run"},
		{"", "http://127.0.0.1:7480", token, run, nil, "secret"},
		{secret, "", token, run, nil, "apiURL"},
		{secret, "127.0.0.1:7480", token, run, nil, "apiURL"},
		{secret, "http://127.0.0.1:7480", "", run, nil, "token"},
	} {
		if _, err := New(tc.secret, tc.api, tc.token, tc.run, tc.opts...); err == nil || !strings.Contains(err.Error(), "invalid config: "+tc.field) {
			t.Errorf("New(%q, %q, %q): %v, want invalid config: %s", tc.secret, tc.api, tc.token, err, tc.field)
		}
	}
	// Without an API, starts must be unconfirmed; without a secret, checks skipped.
	h, err := New("", "", "", run, UnconfirmedStarts(), InsecureSkipVerify())
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
}

// TestCloseStopsAsyncJobs: Close ends the context of async jobs under way and waits for them;
// a later dispatch, asynchronous or not, is answered 503 before its start.
func TestCloseStopsAsyncJobs(t *testing.T) {
	api := newFakeAPI(t)
	started := make(chan struct{})
	var ended atomic.Bool
	h := newHandler(t, api, func(ctx context.Context, j Job) Outcome {
		close(started)
		<-ctx.Done()
		ended.Store(true)
		return Failed("stopped", "")
	}, Async(func(Job) bool { return true }))
	if rec := send(h, encode(t, dispatch(7, "n", `{}`)), secret); rec.Code != http.StatusAccepted {
		t.Fatalf("HTTP %d", rec.Code)
	}
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := h.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown with a job that never ends: %v, want its context's deadline", err)
	}
	if !ended.Load() {
		t.Fatal("Shutdown returned before the job it cut short ended")
	}
	rec := send(h, encode(t, dispatch(8, "n8", `{}`)), secret)
	if answerOf(rec).Kind != executor.Refused || len(api.paths()) != 1 {
		t.Fatalf("after Close: HTTP %d, API calls %q; want 503 and only the first start", rec.Code, api.paths())
	}
	stopped := newHandler(t, api, func(context.Context, Job) Outcome { return Outcome{} })
	stopped.Close()
	if rec := send(stopped, encode(t, dispatch(9, "n9", `{}`)), secret); answerOf(rec).Kind != executor.Refused || len(api.paths()) != 1 {
		t.Fatalf("a synchronous dispatch after Close: HTTP %d, API calls %q; want 503 before any start", rec.Code, api.paths())
	}
}

// TestNonceMemoryBounded: the memory forgets nonces past their deadline and, when full, the
// oldest first.
func TestNonceMemoryBounded(t *testing.T) {
	m := newNonceMemory(3)
	now := time.Now()
	later := now.Add(time.Minute)
	for _, n := range []string{"a", "b", "c"} {
		if !m.add(n, later, now) {
			t.Fatalf("%s refused as seen", n)
		}
	}
	if m.add("b", later, now) {
		t.Fatal("b accepted twice")
	}
	if !m.add("d", later, now) || m.size() != 3 {
		t.Fatalf("d: size %d, want 3 (a forgotten)", m.size())
	}
	if !m.add("a", later, now) {
		t.Fatal("a is still remembered past the bound")
	}
	if !m.add("e", later, later) || m.size() != 1 {
		t.Fatalf("at the deadline every earlier nonce should be forgotten: size %d", m.size())
	}
}
