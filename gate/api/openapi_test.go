package api

import (
	"database/sql"
	"encoding/json"
	"regexp"
	"sort"
	"testing"

	_ "github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/limits"
)

var wildcard = regexp.MustCompile(`\{[^}]*\}`)

// normalize makes "DELETE /v1/gates/{hash}" and "DELETE /v1/gates/{rate_key_sha256}" equal.
func normalize(route string) string { return wildcard.ReplaceAllString(route, "{}") }

func testServer(t *testing.T) *Server {
	t.Helper()
	// The handlers are never called: sql.Open does not connect.
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/none")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	lim := limits.NewCache(db, nil)
	adm, err := gate.New(gate.Config{DB: db, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	toks, err := NewTokens(nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{DB: db, Admitter: adm, Limits: lim, Tokens: toks})
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
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(OpenAPI(), &doc); err != nil {
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
	for path, item := range doc.Paths {
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
		"error_code":null,"error_message":null,"result":null,"retry_of":null}`
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
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(OpenAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	for path, item := range doc.Paths {
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
