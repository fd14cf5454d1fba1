package kit

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer/executor"
)

// TestStartRetryRepeatsItsStartID: a /start whose answer may have been lost (a retryable 503) is
// asked again with the same nonce and the same start id, which the API answers as it answered
// the first (SPEC §4); the job runs once. Another dispatch draws another start id.
func TestStartRetryRepeatsItsStartID(t *testing.T) {
	api := newFakeAPI(t)
	api.script([]int{http.StatusServiceUnavailable, http.StatusOK}, nil)
	var runs atomic.Int32
	h := newHandler(t, api, func(context.Context, Job) Outcome { runs.Add(1); return Outcome{} })
	if rec := send(h, encode(t, dispatch(7, "n1", `{}`)), secret); rec.Code != http.StatusOK {
		t.Fatalf("HTTP %d %s", rec.Code, rec.Body)
	}
	first, retry := api.next(), api.next()
	id, _ := first.Body["start_id"].(string)
	if len(id) != 32 || retry.Body["start_id"] != id || retry.Body["nonce"] != "n1" {
		t.Fatalf("start %v then retry %v: want one 32-hex start id, repeated with the nonce", first.Body, retry.Body)
	}
	if runs.Load() != 1 {
		t.Fatalf("%d runs, want 1", runs.Load())
	}
	if rec := send(h, encode(t, dispatch(8, "n2", `{}`)), secret); rec.Code != http.StatusOK {
		t.Fatalf("HTTP %d %s", rec.Code, rec.Body)
	}
	if other := api.next(); other.Body["start_id"] == id {
		t.Errorf("another dispatch drew the same start id %v", id)
	}
}

// TestAudience: with Audience set, a dispatch naming another executor, or none, is refused with
// 403 wrong_audience before any start; one naming this executor runs. Without it, any audience
// runs.
func TestAudience(t *testing.T) {
	api := newFakeAPI(t)
	var runs atomic.Int32
	run := func(context.Context, Job) Outcome { runs.Add(1); return Outcome{} }
	h := newHandler(t, api, run, Audience("pool-a"))
	for i, aud := range []string{"pool-b", ""} {
		d := dispatch(int64(10+i), "n-"+aud, `{}`)
		d.Audience = aud
		rec := send(h, encode(t, d), secret)
		if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "wrong_audience") {
			t.Errorf("audience %q: HTTP %d %s, want 403 wrong_audience", aud, rec.Code, rec.Body)
		}
	}
	if runs.Load() != 0 || len(api.paths()) != 0 {
		t.Fatalf("misdirected dispatches: %d runs, API calls %q; want none", runs.Load(), api.paths())
	}
	d := dispatch(12, "n-a", `{}`)
	d.Audience = "pool-a"
	if rec := send(h, encode(t, d), secret); rec.Code != http.StatusOK || runs.Load() != 1 {
		t.Fatalf("its own audience: HTTP %d %s, %d runs", rec.Code, rec.Body, runs.Load())
	}
	open := newHandler(t, api, run)
	d = dispatch(13, "n-any", `{}`)
	d.Audience = "pool-b"
	if rec := send(open, encode(t, d), secret); rec.Code != http.StatusOK {
		t.Fatalf("no audience configured: HTTP %d %s", rec.Code, rec.Body)
	}
}

// countingReader counts the bytes read from it.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// TestOversizedDispatchRefused: a body declared over MaxDispatchBytes is refused with 413 without
// a byte of it read; one that does not declare its length is read only up to the limit.
func TestOversizedDispatchRefused(t *testing.T) {
	api := newFakeAPI(t)
	h := newHandler(t, api, func(context.Context, Job) Outcome { return Outcome{} }, MaxDispatchBytes(1024))
	huge := bytes.Repeat([]byte("x"), 64<<10)

	declared := &countingReader{r: bytes.NewReader(huge)}
	req := httptest.NewRequest(http.MethodPost, "/", declared)
	req.ContentLength = int64(len(huge))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusRequestEntityTooLarge || declared.n.Load() != 0 {
		t.Errorf("declared 64 KiB: HTTP %d %s after reading %d bytes, want 413 unread", rec.Code, rec.Body, declared.n.Load())
	}

	chunked := &countingReader{r: bytes.NewReader(huge)}
	req = httptest.NewRequest(http.MethodPost, "/", chunked)
	req.ContentLength = -1
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusRequestEntityTooLarge || chunked.n.Load() > 1024+512 {
		t.Errorf("undeclared 64 KiB: HTTP %d %s after reading %d bytes, want 413 within the limit", rec.Code, rec.Body, chunked.n.Load())
	}
	if len(api.paths()) != 0 {
		t.Errorf("API calls %q, want none", api.paths())
	}
	// The default takes a dispatch of sluice's default payload cap.
	def := newHandler(t, api, func(context.Context, Job) Outcome { return Outcome{} })
	payload := `{"blob":"` + strings.Repeat("y", 256<<10-20) + `"}`
	if rec := send(def, encode(t, dispatch(9, "n-big", payload)), secret); rec.Code != http.StatusOK {
		t.Errorf("a 256 KiB payload under the default limit: HTTP %d %s", rec.Code, rec.Body)
	}
}

// blockingBody blocks its first Read until release is closed, and says when it got there.
type blockingBody struct {
	reading chan struct{}
	release chan struct{}
	r       io.Reader
	once    atomic.Bool
}

func (b *blockingBody) Read(p []byte) (int, error) {
	if b.once.CompareAndSwap(false, true) {
		close(b.reading)
		<-b.release
	}
	return b.r.Read(p)
}

// TestConcurrentReadsBounded: past MaxConcurrentReads bodies being read at once, a dispatch is
// answered 503 with Retry-After (sluice queues the job again without spending its budget)
// before its body is read; once a read ends, dispatches are read again.
func TestConcurrentReadsBounded(t *testing.T) {
	api := newFakeAPI(t)
	h := newHandler(t, api, func(context.Context, Job) Outcome { return Outcome{} }, MaxConcurrentReads(1))
	slow := &blockingBody{reading: make(chan struct{}), release: make(chan struct{}),
		r: bytes.NewReader(encode(t, dispatch(1, "n-slow", `{}`)))}
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		req := httptest.NewRequest(http.MethodPost, "/", slow)
		req.ContentLength = -1
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		done <- rec
	}()
	select {
	case <-slow.reading:
	case <-time.After(10 * time.Second):
		t.Fatal("the slow body was never read")
	}
	other := &countingReader{r: bytes.NewReader(encode(t, dispatch(2, "n-2", `{}`)))}
	req := httptest.NewRequest(http.MethodPost, "/", other)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if a := answerOf(rec); rec.Code != http.StatusServiceUnavailable || a.Kind != executor.Refused || a.RetryAfter != 1 || other.n.Load() != 0 {
		t.Fatalf("a second read while one is under way: HTTP %d %s (read %d bytes), want 503 Retry-After 1 unread",
			rec.Code, rec.Body, other.n.Load())
	}
	close(slow.release)
	select {
	case rec := <-done:
		if rec.Code != http.StatusBadRequest && rec.Code != http.StatusUnauthorized {
			t.Fatalf("the slow, unsigned dispatch: HTTP %d %s", rec.Code, rec.Body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the slow dispatch did not end")
	}
	if rec := send(h, encode(t, dispatch(3, "n-3", `{}`)), secret); rec.Code != http.StatusOK {
		t.Fatalf("after the slow read: HTTP %d %s", rec.Code, rec.Body)
	}
}

// TestPlainHTTPAPIWarned: an API URL that sends the executor token and nonces unencrypted off
// the host is said once, at New; loopback is not.
func TestPlainHTTPAPIWarned(t *testing.T) {
	run := func(context.Context, Job) Outcome { return Outcome{} }
	for url, warn := range map[string]bool{
		"http://sluice.internal:7480": true,
		"https://sluice.internal":     false,
		"http://127.0.0.1:7480":       false,
		"http://localhost:7480":       false,
	} {
		var log bytes.Buffer
		h, err := New(secret, url, token, run, Logger(slog.New(slog.NewTextHandler(&log, nil))))
		if err != nil {
			t.Fatal(err)
		}
		h.Close()
		if got := strings.Contains(log.String(), "plain http://"); got != warn {
			t.Errorf("%s: warned %v, want %v (log %q)", url, got, warn, log.String())
		}
	}
}
