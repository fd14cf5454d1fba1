package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestNewTokensRules: a token is at least MinTokenLength characters (a Builtin one, sluice
// dev's dev token, aside), and names and values are unique (SPEC §9).
func TestNewTokensRules(t *testing.T) {
	long := func(c string) string { return strings.Repeat(c, MinTokenLength) }
	cases := []struct {
		name string
		list []Token
		want string // "" accepts; else a fragment of the refusal
	}{
		{"long tokens", []Token{{Name: "a", Token: long("a"), Role: Admin}, {Name: "b", Token: long("b"), Role: Executor}}, ""},
		{"one short of the minimum", []Token{{Name: "a", Token: long("a")[1:], Role: Admin}}, "at least 32"},
		{"short", []Token{{Name: "a", Token: "secret", Role: Admin}}, "at least 32"},
		{"missing", []Token{{Name: "a", Role: Admin}}, "missing"},
		{"the builtin dev token", []Token{{Name: "dev", Token: "dev", Role: Admin, Builtin: true}}, ""},
		{"a duplicate name", []Token{{Name: "ops", Token: long("a"), Role: Admin}, {Name: "ops", Token: long("b"), Role: Executor}}, "tokens[0]; names must be unique"},
		{"a duplicate value", []Token{{Name: "a", Token: long("a"), Role: Admin}, {Name: "b", Token: long("a"), Role: Admin}}, "used twice"},
	}
	for _, c := range cases {
		_, err := NewTokens(c.list)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v, want accepted", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want a refusal saying %q", c.name, err, c.want)
		}
	}
	// Configuration never sets Builtin.
	list, err := DecodeTokens([]byte(`[{"name":"dev","token":"dev","role":"admin","Builtin":true,"builtin":true}]`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewTokens(list); err == nil {
		t.Error("a configured short token was accepted by claiming to be builtin")
	}
}

// fakeNow is a settable clock for the failed-authentication limit.
type fakeNow struct {
	mu sync.Mutex
	t  time.Time
}

func (f *fakeNow) now() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.t }
func (f *fakeNow) add(d time.Duration) {
	f.mu.Lock()
	f.t = f.t.Add(d)
	f.mu.Unlock()
}

// TestFailedAuthLimited: past 20 failed authentications a minute from one address, its failing
// requests answer 429 rate_limited with Retry-After; a valid token from that address is never
// limited, another address is not affected, and the bucket refills with time.
func TestFailedAuthLimited(t *testing.T) {
	spec, err := ParseSpec(OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	s := testServer(t)
	clk := &fakeNow{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	s.authFails = newBucketLimiter(s.cfg.FailedAuthPerMinute, s.cfg.FailedAuthSources, clk.now)
	do := func(addr, token string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "/v1/status", nil)
		req.RemoteAddr = addr
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		return w
	}
	const guesser = "203.0.113.7:40000"
	for i := range DefaultFailedAuthPerMinute {
		if w := do(guesser, fmt.Sprintf("guess-%d", i)); w.Code != http.StatusUnauthorized {
			t.Fatalf("failure %d: HTTP %d %s, want 401", i+1, w.Code, w.Body)
		}
	}
	w := do("203.0.113.7:40001", "guess-x") // another port of the same host
	var body map[string]any
	_ = json.Unmarshal(w.Body.Bytes(), &body)
	if w.Code != http.StatusTooManyRequests || body["error_code"] != "rate_limited" || w.Header().Get("Retry-After") != "3" || body["retry_after"] != float64(3) {
		t.Fatalf("failure %d: HTTP %d %s Retry-After %q, want 429 rate_limited, Retry-After 3", DefaultFailedAuthPerMinute+1, w.Code, w.Body, w.Header().Get("Retry-After"))
	}
	if err := spec.CheckAnswer("GET", "/v1/status", w.Code, w.Body.Bytes()); err != nil {
		t.Error(err)
	}
	if w := do("", ""); w.Code != http.StatusUnauthorized {
		t.Errorf("no address, no token: HTTP %d, want 401", w.Code)
	}
	// A valid token from the limited address is served (503: testServer's database is down).
	if w := do(guesser, testAdminToken); w.Code != http.StatusServiceUnavailable {
		t.Errorf("a valid token from a limited address: HTTP %d %s, want it served (503)", w.Code, w.Body)
	}
	if w := do("198.51.100.1:1234", "guess"); w.Code != http.StatusUnauthorized {
		t.Errorf("another address: HTTP %d, want 401", w.Code)
	}
	// IPv6 addresses count by /64.
	for i := range DefaultFailedAuthPerMinute {
		do(fmt.Sprintf("[2001:db8::%x]:1", i+1), "guess")
	}
	if w := do("[2001:db8::ffff]:1", "guess"); w.Code != http.StatusTooManyRequests {
		t.Errorf("an IPv6 /64 past the limit: HTTP %d, want 429", w.Code)
	}
	clk.add(3 * time.Second)
	if w := do(guesser, "guess"); w.Code != http.StatusUnauthorized {
		t.Errorf("3 s later: HTTP %d, want 401 (one failure refilled)", w.Code)
	}
	if w := do(guesser, "guess"); w.Code != http.StatusTooManyRequests {
		t.Errorf("the refill spent: HTTP %d, want 429", w.Code)
	}
	clk.add(time.Minute)
	for i := range DefaultFailedAuthPerMinute {
		if w := do(guesser, "guess"); w.Code != http.StatusUnauthorized {
			t.Fatalf("a minute later, failure %d: HTTP %d, want 401", i+1, w.Code)
		}
	}
}

// TestFailedAuthSourcesBounded: the limit remembers at most FailedAuthSources addresses,
// forgetting the least recently failing one first.
func TestFailedAuthSourcesBounded(t *testing.T) {
	l := newBucketLimiter(2, 3, func() time.Time { return time.Unix(0, 0) })
	for _, src := range []string{"a", "a", "b", "c", "d"} {
		l.take(src)
	}
	if l.len() != 3 {
		t.Fatalf("%d sources remembered, want 3", l.len())
	}
	if _, limited := l.take("a"); limited {
		t.Error("the least recently failing source was not the one forgotten")
	}
	if _, limited := l.take("d"); limited {
		t.Error("d's second failure is limited, want its bucket of 2")
	}
	if _, limited := l.take("d"); !limited {
		t.Error("d's third failure is not limited")
	}
	if newBucketLimiter(-1, 0, nil) != nil {
		t.Error("a negative limit should turn limiting off")
	}
}

// TestOpenAPIDescribesAuthLimit: every authenticated route describes the 429 rate_limited
// answer to an address past the failed-authentication limit.
func TestOpenAPIDescribesAuthLimit(t *testing.T) {
	spec, err := ParseSpec(OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	s := testServer(t)
	s.authFails = newBucketLimiter(1, 0, nil)
	samples := map[string]string{"GET /healthz": "/healthz", "GET /readyz": "/readyz", "GET /metrics": "/metrics"}
	for _, route := range s.Routes() {
		method, path, _ := strings.Cut(route, " ")
		if samples[route] != "" {
			continue // no token needed
		}
		p := strings.NewReplacer("{id}", "7", "{rate_key_sha256}", strings.Repeat("0", 64)).Replace(path)
		var w *httptest.ResponseRecorder
		for range 2 {
			req := httptest.NewRequest(method, p, strings.NewReader("{}"))
			req.RemoteAddr = "192.0.2.1:1"
			req.Header.Set("Authorization", "Bearer wrong")
			w = httptest.NewRecorder()
			s.ServeHTTP(w, req)
		}
		if w.Code != http.StatusTooManyRequests {
			t.Errorf("%s: HTTP %d, want 429", route, w.Code)
			continue
		}
		if err := spec.CheckAnswer(method, path, w.Code, w.Body.Bytes()); err != nil {
			t.Errorf("%s: %v", route, err)
		}
	}
}

// TestReleasesLimited: past its allowance a caller's POST /v1/releases answers 429 rate_limited
// with Retry-After and reaches nothing behind it (testServer's database is unreachable, so a call
// that got there answers 503); another caller keeps its own allowance, and time refills it.
func TestReleasesLimited(t *testing.T) {
	spec, err := ParseSpec(OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	s := testServer(t)
	const execA, execB = "executor-a-token-0123456789abcdefgh", "executor-b-token-0123456789abcdefgh"
	toks, err := NewTokens([]Token{{Name: "admin", Token: testAdminToken, Role: Admin},
		{Name: "exec-a", Token: execA, Role: Executor}, {Name: "exec-b", Token: execB, Role: Executor}})
	if err != nil {
		t.Fatal(err)
	}
	s.cfg.Tokens = toks
	clk := &fakeNow{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	s.releases = newBucketLimiter(3, releaseCallers, clk.now) // 3 a minute: one every 20 s
	do := func(token string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/v1/releases", strings.NewReader(`{"tenant": "acme"}`))
		req.Header.Set("Authorization", "Bearer "+token)
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		return w
	}
	for i := range 3 {
		if w := do(execA); w.Code != http.StatusServiceUnavailable {
			t.Fatalf("release %d: HTTP %d %s, want 503 (within the allowance, the unreachable database answers)", i+1, w.Code, w.Body)
		}
	}
	w := do(execA)
	var body map[string]any
	_ = json.Unmarshal(w.Body.Bytes(), &body)
	if w.Code != http.StatusTooManyRequests || body["error_code"] != "rate_limited" || w.Header().Get("Retry-After") != "20" {
		t.Fatalf("release 4: HTTP %d %s Retry-After %q, want 429 rate_limited, Retry-After 20", w.Code, w.Body, w.Header().Get("Retry-After"))
	}
	if err := spec.CheckAnswer("POST", "/v1/releases", w.Code, w.Body.Bytes()); err != nil {
		t.Error(err)
	}
	if w := do(execB); w.Code != http.StatusServiceUnavailable {
		t.Errorf("another caller: HTTP %d, want 503", w.Code)
	}
	clk.add(20 * time.Second)
	if w := do(execA); w.Code != http.StatusServiceUnavailable {
		t.Errorf("20 s later: HTTP %d, want 503", w.Code)
	}
}
