package api

import (
	"database/sql"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sort"
	"strings"
	"testing"

	_ "github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/rategate"
)

var wildcard = regexp.MustCompile(`\{[^}]*\}`)

// normalize makes "DELETE /v1/gates/{hash}" and "DELETE /v1/gates/{rate_key_sha256}" equal.
func normalize(route string) string { return wildcard.ReplaceAllString(route, "{}") }

// testAdminToken is the one token testServer accepts.
const testAdminToken = "test-admin-token-0123456789abcdef"

// testServer returns a server whose database and gate store cannot be reached: nothing listens
// on port 1, so a handler that reaches either fails at once (sql.Open and rategate.New do not
// connect).
func testServer(t *testing.T) *Server {
	t.Helper()
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/none")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	lim := config.NewCache(db, nil)
	adm, err := gate.New(gate.Config{DB: db, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	toks, err := NewTokens([]Token{{Name: "admin", Token: testAdminToken, Role: Admin}})
	if err != nil {
		t.Fatal(err)
	}
	gates, err := rategate.New(rategate.Config{Servers: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{DB: db, Admitter: adm, Limits: lim, Tokens: toks, RateGates: gates})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	spec, err := ParseSpec(OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	described := map[string]bool{}
	for _, op := range spec.Operations() {
		described[normalize(op)] = true
	}
	registered := map[string]bool{}
	for _, r := range testServer(t).Routes() {
		registered[normalize(r)] = true
		if !described[normalize(r)] {
			t.Errorf("route %q is registered but not described in openapi.json", r)
		}
	}
	var missing []string
	for op := range described {
		if !registered[op] {
			missing = append(missing, op)
		}
	}
	sort.Strings(missing)
	for _, op := range missing {
		t.Errorf("openapi.json describes %q but the server does not register it", op)
	}
}

// TestOpenAPIExamplesValidate checks every request and response example against its schema.
func TestOpenAPIExamplesValidate(t *testing.T) {
	spec, err := ParseSpec(OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	type media struct {
		Schema  json.RawMessage `json:"schema"`
		Example any             `json:"example"`
	}
	type op struct {
		RequestBody *struct {
			Content map[string]media `json:"content"`
		} `json:"requestBody"`
		Responses map[string]struct {
			Content map[string]media `json:"content"`
		} `json:"responses"`
	}
	checked := 0
	for path, item := range spec.doc.Paths {
		for method, raw := range item {
			if method == "parameters" {
				continue
			}
			var o op
			if err := json.Unmarshal(raw, &o); err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			if len(o.Responses) == 0 {
				t.Errorf("%s %s: no responses", method, path)
			}
			check := func(where string, m media, needExample bool) {
				if m.Example == nil {
					if needExample {
						t.Errorf("%s %s %s: no example", method, path, where)
					}
					return
				}
				if err := spec.ValidateSchema(m.Schema, m.Example); err != nil {
					t.Errorf("%s %s %s: example does not match its schema: %v", method, path, where, err)
				}
				checked++
			}
			if o.RequestBody != nil {
				for ct, m := range o.RequestBody.Content {
					check("request "+ct, m, true)
				}
			}
			for code, r := range o.Responses {
				for ct, m := range r.Content {
					check("response "+code+" "+ct, m, ct == "application/json")
				}
			}
		}
	}
	if checked < 40 {
		t.Errorf("only %d examples checked", checked)
	}
}

// TestOpenAPIValidatorRejects: the validator used above can fail.
func TestOpenAPIValidatorRejects(t *testing.T) {
	spec, err := ParseSpec(OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	good := `{"id":1,"tenant":"a","rate_key_sha256":null,"status":"queued","version":0,"attempt":0,"position":1,
		"queued_at":"2026-01-01T00:00:00Z","claimed_at":null,"dispatched_at":null,"started_at":null,"finished_at":null,
		"error_code":null,"error_message":null,"result":null,"retry_of":null,"lanes":[],"interactive":false,"priority":5}`
	if err := spec.ValidateJSON("Job", []byte(good)); err != nil {
		t.Fatalf("a valid job: %v", err)
	}
	var base map[string]any
	_ = json.Unmarshal([]byte(good), &base)
	for name, mutate := range map[string]func(map[string]any){
		"missing id":        func(m map[string]any) { delete(m, "id") },
		"status not enum":   func(m map[string]any) { m["status"] = "done" },
		"id a string":       func(m map[string]any) { m["id"] = "1" },
		"id fractional":     func(m map[string]any) { m["id"] = 1.5 },
		"position 0":        func(m map[string]any) { m["position"] = 0.0 },
		"bad date":          func(m map[string]any) { m["queued_at"] = "yesterday" },
		"bad hash":          func(m map[string]any) { m["rate_key_sha256"] = "XYZ" },
		"tenant too long":   func(m map[string]any) { m["tenant"] = string(make([]byte, 192)) },
		"claimed_at number": func(m map[string]any) { m["claimed_at"] = 3.0 },
	} {
		m := map[string]any{}
		for k, v := range base {
			m[k] = v
		}
		mutate(m)
		if err := spec.Validate("Job", m); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := spec.Validate("JobList", map[string]any{"jobs": []any{base}}); err == nil {
		t.Errorf("JobList without next_cursor accepted")
	}
}

// TestOpenAPIDescribesMethodNotAllowed: every path answers another method with 405 (see
// ServeHTTP), so every operation lists it.
func TestOpenAPIDescribesMethodNotAllowed(t *testing.T) {
	spec, err := ParseSpec(OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	for path, item := range spec.doc.Paths {
		for method, raw := range item {
			if method == "parameters" {
				continue
			}
			var op struct {
				Responses map[string]json.RawMessage `json:"responses"`
			}
			if err := json.Unmarshal(raw, &op); err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			if _, ok := op.Responses["405"]; !ok {
				t.Errorf("%s %s: no 405 response", method, path)
			}
		}
	}
}

// TestOpenAPIDescribesFailures calls every route of testServer, whose database and gate store
// are unreachable, with a request that would succeed were they up, and each route that takes a
// body also with a body over every limit. Every route but the four that need neither must
// answer 503, every oversized body 413, and each answer must be one its operation describes,
// body included: the handlers, not a list kept by hand, say which operations touch the
// database or memcached and which bound their body.
func TestOpenAPIDescribesFailures(t *testing.T) {
	spec, err := ParseSpec(OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	s := testServer(t)
	samples := map[string]struct{ path, body string }{
		"POST /v1/jobs":                      {"/v1/jobs", `{"tenant":"acme"}`},
		"POST /v1/jobs:batch":                {"/v1/jobs:batch", `{"jobs":[{"tenant":"acme"}]}`},
		"GET /v1/jobs":                       {"/v1/jobs?tenant=acme", ""},
		"POST /v1/jobs/{id}/redrive":         {"/v1/jobs/7/redrive", ""},
		"GET /v1/jobs/{id}":                  {"/v1/jobs/7", ""},
		"GET /v1/jobs/{id}/events":           {"/v1/jobs/7/events", ""},
		"GET /v1/audit":                      {"/v1/audit?tenant=acme&event=refused&since=2026-01-02T15:04:05Z", ""},
		"DELETE /v1/jobs/{id}":               {"/v1/jobs/7", ""},
		"POST /v1/jobs/{id}/start":           {"/v1/jobs/7/start", `{"nonce":"n"}`},
		"POST /v1/jobs/{id}/complete":        {"/v1/jobs/7/complete", `{"nonce":"n","status":"succeeded"}`},
		"POST /v1/gates":                     {"/v1/gates", `{"rate_key":"k","retry_after":60}`},
		"GET /v1/gates":                      {"/v1/gates", ""},
		"DELETE /v1/gates/{rate_key_sha256}": {"/v1/gates/" + strings.Repeat("0", 64), ""},
		"GET /healthz":                       {"/healthz", ""},
		"GET /readyz":                        {"/readyz", ""},
		"GET /metrics":                       {"/metrics", ""},
		"POST /v1/releases":                  {"/v1/releases", `{"tenant":"acme"}`},
		"GET /v1/status":                     {"/v1/status", ""},
		"GET /v1/tenants":                    {"/v1/tenants?order=depth&limit=5", ""},
		"GET /v1/config":                     {"/v1/config", ""},
		"PATCH /v1/config":                   {"/v1/config", `{"changes":{"global_in_flight":7}}`},
		"POST /v1/config/simulate":           {"/v1/config/simulate", `{"changes":{"global_in_flight":7},"since":"1h"}`},
		"GET /v1/config/history":             {"/v1/config/history", ""},
		"GET /v1/whoami":                     {"/v1/whoami", ""},
		"POST /v1/slots":                     {"/v1/slots", `{"tenant":"acme"}`},
		"GET /v1/slots":                      {"/v1/slots?tenant=acme", ""},
		"POST /v1/slots/{id}/renew":          {"/v1/slots/7/renew", ""},
		"DELETE /v1/slots/{id}":              {"/v1/slots/7", ""},
	}
	// Alive, ready (testServer has no readiness check), metrics (an empty registry) and the
	// token's own caller.
	independent := map[string]bool{"GET /healthz": true, "GET /readyz": true, "GET /metrics": true, "GET /v1/whoami": true}
	call := func(route string, want int, method, path string, body io.Reader) {
		t.Helper()
		req := httptest.NewRequest(method, path, body)
		req.Header.Set("Authorization", "Bearer "+testAdminToken)
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		if w.Code != want {
			t.Errorf("%s (%s): HTTP %d %.300s, want %d", route, path, w.Code, w.Body, want)
		}
		if err := spec.CheckAnswer(method, strings.TrimPrefix(route, method+" "), w.Code, w.Body.Bytes()); err != nil {
			t.Errorf("%s: %v\n%.300s", route, err, w.Body)
		}
	}
	for _, route := range s.Routes() {
		sample, ok := samples[route]
		if !ok {
			t.Errorf("route %s has no sample request in this test", route)
			continue
		}
		method, _, _ := strings.Cut(route, " ")
		want := http.StatusServiceUnavailable
		if independent[route] {
			want = http.StatusOK
		}
		call(route, want, method, sample.path, strings.NewReader(sample.body))
		if sample.body != "" {
			// Longer than the largest limit (a batch's); the body is never valid JSON.
			call(route, http.StatusRequestEntityTooLarge, method, sample.path, io.LimitReader(filler{}, maxBatchBody+1))
		}
	}
}

// filler is an endless reader of 'x'.
type filler struct{}

func (filler) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}
