package api_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/gate/api"
	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/integration/apitest"
	"github.com/sluicehq/sluice/integration/harness"
)

// TestFrontDoorContract checks real answers of the handlers, successes and errors, against the
// schemas openapi.json gives for that operation and status.
func TestFrontDoorContract(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	ctx := context.Background()
	check := func(method, template, path, token string, body any, want int) map[string]any {
		t.Helper()
		r := f.Do(t, method, path, token, body)
		if r.Status != want {
			t.Fatalf("%s %s: HTTP %d %s, want %d", method, path, r.Status, r.Raw, want)
		}
		checkDescribed(t, method, template, r)
		var m map[string]any
		_ = json.Unmarshal(r.Raw, &m) // a JSON array or a bad body is reported by checkDescribed
		return m
	}
	admit := map[string]any{"tenant": "acme", "rate_key": "k", "payload": map[string]any{"x": 1}, "idempotency_key": "c1"}
	j := check("POST", "/v1/jobs", "/v1/jobs", apitest.AlphaToken, admit, 202)
	id := strconv.FormatInt(apitest.JobID(t, j), 10)
	check("POST", "/v1/jobs", "/v1/jobs", apitest.AlphaToken, admit, 200)
	check("POST", "/v1/jobs", "/v1/jobs", apitest.AlphaToken, map[string]any{"tenant": "acme", "idempotency_key": "c1"}, 409)
	check("POST", "/v1/jobs", "/v1/jobs", apitest.AlphaToken, map[string]any{"tenant": 1}, 400)
	check("POST", "/v1/jobs", "/v1/jobs", "", admit, 401)
	check("POST", "/v1/jobs", "/v1/jobs", apitest.BetaToken, admit, 403)
	check("POST", "/v1/jobs", "/v1/jobs", apitest.AlphaToken, map[string]any{"tenant": "acme", "payload": strings.Repeat("x", 300000)}, 413)
	check("POST", "/v1/jobs", "/v1/jobs", apitest.AlphaToken, map[string]any{"tenant": "acme", "queue": false}, 429)
	check("GET", "/v1/jobs", "/v1/jobs?limit=1", apitest.AlphaToken, nil, 200)
	check("GET", "/v1/jobs", "/v1/jobs?limit=0", apitest.AlphaToken, nil, 400)
	check("GET", "/v1/jobs/{id}", "/v1/jobs/"+id, apitest.AlphaToken, nil, 200)
	check("GET", "/v1/jobs/{id}", "/v1/jobs/"+id, apitest.BetaToken, nil, 404)
	check("POST", "/v1/jobs:batch", "/v1/jobs:batch", apitest.AlphaToken, map[string]any{"jobs": []any{map[string]any{"tenant": "acme"}, map[string]any{"tenant": "initech"}}}, 200)
	check("POST", "/v1/jobs/{id}/redrive", "/v1/jobs/"+id+"/redrive", apitest.AdminToken, nil, 409)
	check("DELETE", "/v1/jobs/{id}", "/v1/jobs/"+id, apitest.AlphaToken, nil, 200)
	if _, err := f.DB.ExecContext(ctx, "UPDATE jobs SET status = 'failed' WHERE id = ?", id); err != nil {
		t.Fatal(err)
	}
	check("POST", "/v1/jobs/{id}/redrive", "/v1/jobs/"+id+"/redrive", apitest.AdminToken, nil, 201)
	check("POST", "/v1/jobs/{id}/redrive", "/v1/jobs/"+id+"/redrive", apitest.AdminToken, nil, 200)
	check("DELETE", "/v1/jobs/{id}", "/v1/jobs/"+id, apitest.AlphaToken, nil, 409)
	f.SetConfig(t, map[string]any{"tenant_queue_depth": 0})
	check("POST", "/v1/jobs", "/v1/jobs", apitest.AlphaToken, map[string]any{"tenant": "acme"}, 429)
	f.SetConfig(t, map[string]any{"tenant_queue_depth": 500, "admission_rate_per_minute": 0})
	if _, err := f.Exec.Start(ctx, 1, "nonce", ""); client.Code(err) == "" {
		t.Errorf("start of a queued job accepted")
	}
	check("POST", "/v1/jobs/{id}/start", "/v1/jobs/"+id+"/start", apitest.ExecToken, map[string]any{}, 400)
	check("GET", "/healthz", "/healthz", "", nil, 200)
}

// checkDescribed fails t unless openapi.json describes r's status for method template and r's
// body matches the schema it gives.
func checkDescribed(t *testing.T, method, template string, r harness.Response) {
	t.Helper()
	spec, err := api.ParseSpec(api.OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.CheckAnswer(method, template, r.Status, r.Raw); err != nil {
		t.Errorf("%v\n%s", err, r.Raw)
	}
}

// TestFrontDoorMethodNotAllowed: a known path called with a method it does not take answers
// 405 method_not_allowed in JSON with an Allow header, before authentication and without
// writing anything; openapi.json describes that answer for every operation of the path. An
// unknown path stays 404 not_found.
func TestFrontDoorMethodNotAllowed(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	before := f.RowCounts(t)
	for _, c := range []struct {
		method, path, template, token, allow string
	}{
		{"PUT", "/v1/jobs", "/v1/jobs", apitest.AlphaToken, "GET, HEAD, POST"},
		{"PUT", "/v1/jobs", "/v1/jobs", "", "GET, HEAD, POST"},
		{"POST", "/healthz", "/healthz", "", "GET, HEAD"},
		{"GET", "/v1/jobs:batch", "/v1/jobs:batch", apitest.AlphaToken, "POST"},
		{"GET", "/v1/jobs/1/complete", "/v1/jobs/{id}/complete", apitest.ExecToken, "POST"},
		{"POST", "/v1/jobs/1", "/v1/jobs/{id}", apitest.AdminToken, "DELETE, GET, HEAD"},
	} {
		r := f.Do(t, c.method, c.path, c.token, map[string]any{"tenant": "acme"})
		if r.Status != 405 || r.Body["error_code"] != "method_not_allowed" {
			t.Errorf("%s %s (token %q): HTTP %d %s, want 405 method_not_allowed", c.method, c.path, c.token, r.Status, r.Raw)
			continue
		}
		if got := r.Header.Get("Allow"); got != c.allow {
			t.Errorf("%s %s: Allow %q, want %q", c.method, c.path, got, c.allow)
		}
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s %s: Content-Type %q", c.method, c.path, ct)
		}
		for _, m := range strings.Split(c.allow, ", ") {
			if m != "HEAD" {
				checkDescribed(t, m, c.template, r)
			}
		}
	}
	r := f.Do(t, "GET", "/v1/nothing-here", apitest.AdminToken, nil)
	if r.Status != 404 || r.Body["error_code"] != "not_found" || r.Header.Get("Content-Type") != "application/json" {
		t.Errorf("GET /v1/nothing-here: HTTP %d %s, want 404 not_found in JSON", r.Status, r.Raw)
	}
	if after := f.RowCounts(t); after != before {
		t.Errorf("rows (jobs, outbox, tenants) went from %v to %v", before, after)
	}
}
