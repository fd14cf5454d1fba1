package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/config"
)

// fakeComparison is a comparison as simulate.Comparison.WriteJSON writes one, with no shifts
// (no tenant's figures changed).
const fakeComparison = `{
  "changes": {"global_in_flight": 8},
  "current": {"start": "2026-01-02T14:10:00Z", "end": "2026-01-02T14:20:00Z", "tenants": {"acme": {"arrivals": 3,
    "admitted": 3, "started": 3, "never_started": 0, "slots": 0, "slots_granted": 0,
    "wait": {"p50_ms": 1, "p95_ms": 2, "p99_ms": 2, "max_ms": 2}, "depth_max": 1}},
    "total": {"arrivals": 3, "admitted": 3, "started": 3, "never_started": 0, "slots": 0, "slots_granted": 0,
    "wait": {"p50_ms": 1, "p95_ms": 2, "p99_ms": 2, "max_ms": 2}, "depth_max": 1}, "utilisation": 0.5, "depth": [1, 0], "depth_max": 1},
  "changed": {"start": "2026-01-02T14:10:00Z", "end": "2026-01-02T14:20:00Z", "tenants": {"acme": {"arrivals": 3,
    "admitted": 3, "started": 3, "never_started": 0, "slots": 0, "slots_granted": 0,
    "wait": {"p50_ms": 1, "p95_ms": 2, "p99_ms": 2, "max_ms": 2}, "depth_max": 1}},
    "total": {"arrivals": 3, "admitted": 3, "started": 3, "never_started": 0, "slots": 0, "slots_granted": 0,
    "wait": {"p50_ms": 1, "p95_ms": 2, "p99_ms": 2, "max_ms": 2}, "depth_max": 1}, "utilisation": 0.25, "depth": [1, 0], "depth_max": 1},
  "shifts": [],
  "tenants_total": 1
}
`

// simulateServer is testServer with a fixed clock and a Simulate that validates the changes as
// the real one does (config.Apply, wrapped), finds arrivals only after arrivalsFrom, and records
// the window it was asked for.
func simulateServer(t *testing.T, now, arrivalsFrom time.Time) (*Server, *[2]time.Time) {
	t.Helper()
	s := testServer(t)
	toks, err := NewTokens([]Token{{Name: "admin", Token: testAdminToken, Role: Admin},
		{Name: "p", Token: "producer-token-0123456789abcdefghijkl", Role: Producer, Tenants: []string{"*"}}})
	if err != nil {
		t.Fatal(err)
	}
	s.cfg.Tokens = toks
	s.cfg.Clock = clock.NewFake(now)
	var asked [2]time.Time
	s.cfg.Simulate = func(ctx context.Context, changes map[string]json.RawMessage, since, until time.Time) (*Simulation, error) {
		asked = [2]time.Time{since, until}
		if len(changes) > 0 {
			if _, err := config.Apply(config.Default(), changes); err != nil {
				return nil, fmt.Errorf("--set: %w", err)
			}
		}
		if until.Before(arrivalsFrom) {
			return nil, fmt.Errorf("%w: no arrivals to simulate", ErrNoArrivals)
		}
		return &Simulation{Comparison: json.RawMessage(fakeComparison), Table: "replayed 3 job arrivals\n"}, nil
	}
	return s, &asked
}

// TestSimulateConfigRequests: POST /v1/config/simulate is for admins (401, 403), resolves the
// window (since default 1h, until default now, a duration ago or an RFC 3339 time, a future
// until counted as now), refuses a bad since or until, a window over 24 h and an invalid change
// with 400 naming the field, answers an empty window 404 not_found, and a good request 200 with
// the comparison, its table and the window, as openapi.json describes each answer.
func TestSimulateConfigRequests(t *testing.T) {
	spec, err := ParseSpec(OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 2, 15, 0, 0, 0, time.UTC)
	s, asked := simulateServer(t, now, now.Add(-2*time.Hour))
	const producer = "producer-token-0123456789abcdefghijkl"
	for _, c := range []struct {
		token, body string
		status      int
		code, field string
		since       time.Time // for 200: the window the simulation was asked for
		until       time.Time
	}{
		{"", `{}`, 401, "unauthorized", "", time.Time{}, time.Time{}},
		{producer, `{}`, 403, "forbidden", "", time.Time{}, time.Time{}},
		{testAdminToken, `{}`, 200, "", "", now.Add(-time.Hour), now},
		{testAdminToken, `{"changes":{"global_in_flight":8},"since":"15m"}`, 200, "", "", now.Add(-15 * time.Minute), now},
		{testAdminToken, `{"changes":{"global_in_flight":8},"since":"-24h"}`, 200, "", "", now.Add(-24 * time.Hour), now},
		{testAdminToken, `{"since":"2026-01-02T13:00:00Z","until":"30m"}`, 200, "", "", now.Add(-2 * time.Hour), now.Add(-30 * time.Minute)},
		{testAdminToken, `{"since":"1h","until":"2026-01-03T00:00:00Z"}`, 200, "", "", now.Add(-time.Hour), now},
		{testAdminToken, `{"changes":{"no_such_key":1}}`, 400, "invalid_request", "no_such_key", time.Time{}, time.Time{}},
		{testAdminToken, `{"changes":{"tenant_in_flight":-1}}`, 400, "invalid_request", "tenant_in_flight", time.Time{}, time.Time{}},
		{testAdminToken, `{"changes":{"global_in_flight":8},"since":"yesterday"}`, 400, "invalid_request", "since", time.Time{}, time.Time{}},
		{testAdminToken, `{"since":"0s"}`, 400, "invalid_request", "since", time.Time{}, time.Time{}},
		{testAdminToken, `{"since":7}`, 400, "invalid_request", "since", time.Time{}, time.Time{}},
		{testAdminToken, `{"until":"soon"}`, 400, "invalid_request", "until", time.Time{}, time.Time{}},
		{testAdminToken, `{"since":"25h"}`, 400, "invalid_request", "since", time.Time{}, time.Time{}},
		{testAdminToken, `{"since":"1h","until":"2h"}`, 400, "invalid_request", "since", time.Time{}, time.Time{}},
		{testAdminToken, `{"since":"2026-01-03T00:00:00Z"}`, 400, "invalid_request", "since", time.Time{}, time.Time{}},
		{testAdminToken, `{"changes":[]}`, 400, "invalid_request", "changes", time.Time{}, time.Time{}},
		{testAdminToken, `{"since":"4h","until":"3h"}`, 404, "not_found", "", time.Time{}, time.Time{}},
	} {
		*asked = [2]time.Time{}
		req := httptest.NewRequest("POST", "/v1/config/simulate", strings.NewReader(c.body))
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		if err := spec.CheckAnswer("POST", "/v1/config/simulate", w.Code, w.Body.Bytes()); err != nil {
			t.Errorf("%s: %v\n%.300s", c.body, err, w.Body)
		}
		var body map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatalf("%s: %q: %v", c.body, w.Body, err)
		}
		if c.status != 200 {
			field, _ := body["field"].(string)
			msg, _ := body["message"].(string)
			if w.Code != c.status || body["error_code"] != c.code || field != c.field || !strings.Contains(msg, c.field) {
				t.Errorf("%s with %q: HTTP %d %v, want %d %s naming %q", c.body, c.token, w.Code, body, c.status, c.code, c.field)
			}
			continue
		}
		if w.Code != 200 {
			t.Errorf("%s: HTTP %d %s, want 200", c.body, w.Code, w.Body)
			continue
		}
		if !asked[0].Equal(c.since) || !asked[1].Equal(c.until) {
			t.Errorf("%s: simulated %v to %v, want %v to %v", c.body, asked[0], asked[1], c.since, c.until)
		}
		if body["table"] != "replayed 3 job arrivals\n" || body["since"] != c.since.Format(time.RFC3339Nano) ||
			body["until"] != c.until.Format(time.RFC3339Nano) || body["current"] == nil || body["changed"] == nil {
			t.Errorf("%s: answer %v lacks the comparison, its table or its window", c.body, body)
		}
	}
}

// TestSimulateConfigUnavailable: a process without a simulation answers 503 unavailable, not
// retryable; one with the most simulations in progress answers another 503 busy at once, and
// takes it again once one of them ends.
func TestSimulateConfigUnavailable(t *testing.T) {
	now := time.Date(2026, 1, 2, 15, 0, 0, 0, time.UTC)
	s, _ := simulateServer(t, now, time.Time{})
	post := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/v1/config/simulate", strings.NewReader(`{"since":"15m"}`))
		req.Header.Set("Authorization", "Bearer "+testAdminToken)
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		return w
	}
	fake := s.cfg.Simulate
	entered, release := make(chan struct{}), make(chan struct{})
	s.cfg.Simulate = func(ctx context.Context, changes map[string]json.RawMessage, since, until time.Time) (*Simulation, error) {
		entered <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return &Simulation{Comparison: json.RawMessage(fakeComparison)}, nil
	}
	var wg sync.WaitGroup
	codes := make(chan int, maxSimulations)
	for range maxSimulations {
		wg.Add(1)
		go func() { defer wg.Done(); codes <- post().Code }()
	}
	for range maxSimulations {
		<-entered
	}
	if w := post(); w.Code != 503 || !strings.Contains(w.Body.String(), `"busy"`) || w.Header().Get("Retry-After") != "1" {
		t.Errorf("a simulation past the bound: HTTP %d %s %v, want 503 busy with Retry-After", w.Code, w.Body, w.Header())
	}
	close(release)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != 200 {
			t.Errorf("a simulation within the bound: HTTP %d, want 200", c)
		}
	}
	s.cfg.Simulate = fake
	if w := post(); w.Code != 200 {
		t.Errorf("after the others ended: HTTP %d %s, want 200", w.Code, w.Body)
	}

	s.cfg.Simulate = nil
	w := post()
	var body map[string]any
	_ = json.Unmarshal(w.Body.Bytes(), &body)
	if w.Code != 503 || body["error_code"] != "unavailable" || body["retryable"] != false {
		t.Errorf("without a simulation: HTTP %d %s, want 503 unavailable, retryable false", w.Code, w.Body)
	}
}
