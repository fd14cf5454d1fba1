package integration_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/gate/api"
	"github.com/sluicehq/sluice/gate/client"
)

// TestFrontDoorContract checks real answers of the handlers, successes and errors, against the
// schemas openapi.json gives for that operation and status.
func TestFrontDoorContract(t *testing.T) {
	t.Parallel()
	f := startFrontDoor(t, fdOptions{})
	ctx := context.Background()
	spec, err := api.ParseSpec(api.OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(api.OpenAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	check := func(method, template, path, token string, body any, want int) map[string]any {
		t.Helper()
		r := f.do(t, method, path, token, body)
		if r.Status != want {
			t.Fatalf("%s %s: HTTP %d %s, want %d", method, path, r.Status, r.Raw, want)
		}
		var op struct {
			Responses map[string]struct {
				Content map[string]struct {
					Schema json.RawMessage `json:"schema"`
				} `json:"content"`
			} `json:"responses"`
		}
		if err := json.Unmarshal(doc.Paths[template][strings.ToLower(method)], &op); err != nil {
			t.Fatalf("%s %s: not described: %v", method, template, err)
		}
		resp, ok := op.Responses[strconv.Itoa(r.Status)]
		if !ok {
			t.Fatalf("%s %s: status %d is not described", method, template, r.Status)
		}
		var v any
		if err := json.Unmarshal(r.Raw, &v); err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		if err := spec.ValidateSchema(resp.Content["application/json"].Schema, v); err != nil {
			t.Errorf("%s %s → %d: answer does not match the contract: %v\n%s", method, path, r.Status, err, r.Raw)
		}
		m, _ := v.(map[string]any)
		return m
	}
	admit := map[string]any{"tenant": "acme", "rate_key": "k", "payload": map[string]any{"x": 1}, "idempotency_key": "c1"}
	j := check("POST", "/v1/jobs", "/v1/jobs", fdAlphaToken, admit, 202)
	id := strconv.FormatInt(jobID(t, j), 10)
	check("POST", "/v1/jobs", "/v1/jobs", fdAlphaToken, admit, 200)
	check("POST", "/v1/jobs", "/v1/jobs", fdAlphaToken, map[string]any{"tenant": "acme", "idempotency_key": "c1"}, 409)
	check("POST", "/v1/jobs", "/v1/jobs", fdAlphaToken, map[string]any{"tenant": 1}, 400)
	check("POST", "/v1/jobs", "/v1/jobs", "", admit, 401)
	check("POST", "/v1/jobs", "/v1/jobs", fdBetaToken, admit, 403)
	check("POST", "/v1/jobs", "/v1/jobs", fdAlphaToken, map[string]any{"tenant": "acme", "payload": strings.Repeat("x", 300000)}, 413)
	check("POST", "/v1/jobs", "/v1/jobs", fdAlphaToken, map[string]any{"tenant": "acme", "queue": false}, 429)
	check("GET", "/v1/jobs", "/v1/jobs?limit=1", fdAlphaToken, nil, 200)
	check("GET", "/v1/jobs", "/v1/jobs?limit=0", fdAlphaToken, nil, 400)
	check("GET", "/v1/jobs/{id}", "/v1/jobs/"+id, fdAlphaToken, nil, 200)
	check("GET", "/v1/jobs/{id}", "/v1/jobs/"+id, fdBetaToken, nil, 404)
	check("POST", "/v1/jobs:batch", "/v1/jobs:batch", fdAlphaToken, map[string]any{"jobs": []any{map[string]any{"tenant": "acme"}, map[string]any{"tenant": "initech"}}}, 200)
	check("POST", "/v1/jobs/{id}/redrive", "/v1/jobs/"+id+"/redrive", fdAdminToken, nil, 409)
	check("DELETE", "/v1/jobs/{id}", "/v1/jobs/"+id, fdAlphaToken, nil, 200)
	if _, err := f.db.ExecContext(ctx, "UPDATE jobs SET status = 'failed' WHERE id = ?", id); err != nil {
		t.Fatal(err)
	}
	check("POST", "/v1/jobs/{id}/redrive", "/v1/jobs/"+id+"/redrive", fdAdminToken, nil, 201)
	check("POST", "/v1/jobs/{id}/redrive", "/v1/jobs/"+id+"/redrive", fdAdminToken, nil, 200)
	check("DELETE", "/v1/jobs/{id}", "/v1/jobs/"+id, fdAlphaToken, nil, 409)
	f.setConfig(t, map[string]any{"tenant_queue_depth": 0})
	check("POST", "/v1/jobs", "/v1/jobs", fdAlphaToken, map[string]any{"tenant": "acme"}, 429)
	f.setConfig(t, map[string]any{"tenant_queue_depth": 500, "admission_rate_per_minute": 0})
	if _, err := f.exec.Start(ctx, 1, "nonce"); client.Code(err) == "" {
		t.Errorf("start of a queued job accepted")
	}
	check("POST", "/v1/jobs/{id}/start", "/v1/jobs/"+id+"/start", fdExecToken, map[string]any{}, 400)
	check("GET", "/healthz", "/healthz", "", nil, 200)
}
