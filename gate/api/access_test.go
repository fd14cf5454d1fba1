package api_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/integration/apitest"
)

// TestFrontDoorAuth: 401 without a valid token, 403 for a role that may not call the endpoint or
// a tenant outside a producer's scope, the same 404 for another tenant's job as for a missing
// id, listings restricted to the caller's tenants, and no token ever in the log.
func TestFrontDoorAuth(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	ctx := context.Background()
	body := map[string]any{"tenant": "acme", "payload": map[string]any{"n": 1}}

	for name, header := range map[string]string{
		"no header":     "",
		"unknown token": "Bearer not-a-token",
		"wrong scheme":  "Basic " + apitest.AlphaToken,
		"empty bearer":  "Bearer ",
	} {
		req, _ := http.NewRequest(http.MethodPost, f.URL+"/v1/jobs", strings.NewReader(`{"tenant":"acme"}`))
		if header != "" {
			req.Header.Set("Authorization", header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: HTTP %d, want 401", name, resp.StatusCode)
		}
	}
	// The scheme is case-insensitive (RFC 9110 §11.1).
	for _, scheme := range []string{"bearer", "BEARER"} {
		req, _ := http.NewRequest(http.MethodGet, f.URL+"/v1/jobs", nil)
		req.Header.Set("Authorization", scheme+" "+apitest.AlphaToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("scheme %q: HTTP %d, want 200", scheme, resp.StatusCode)
		}
	}
	if r := f.Do(t, http.MethodGet, "/v1/jobs", "", nil); r.Status != 401 || r.Body["error_code"] != "unauthorized" {
		t.Errorf("list without token: %d %s, want 401 unauthorized", r.Status, r.Raw)
	}

	before := f.RowCounts(t)
	// Role not allowed: an executor may not admit or list; a producer may not redrive.
	if r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.ExecToken, body); r.Status != 403 || r.Body["error_code"] != "forbidden" {
		t.Errorf("executor admits: %d %s, want 403 forbidden", r.Status, r.Raw)
	}
	if r := f.Do(t, http.MethodGet, "/v1/jobs", apitest.ExecToken, nil); r.Status != 403 {
		t.Errorf("executor lists: %d %s, want 403", r.Status, r.Raw)
	}
	// Tenant outside the producer's scope, single and batch.
	if r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.BetaToken, body); r.Status != 403 || r.Body["error_code"] != "forbidden" {
		t.Errorf("beta admits for acme: %d %s, want 403 forbidden", r.Status, r.Raw)
	}
	res, err := f.Beta.AdmitBatch(ctx, []client.AdmitRequest{{Tenant: "acme"}})
	if err != nil || len(res) != 1 || res[0].Status != 403 {
		t.Errorf("beta batch-admits for acme: %+v %v, want one 403 item", res, err)
	}
	// Validation comes before the tenant's scope (SPEC §5's order): a request that is invalid
	// is a 400 naming its field whoever it is for, also when its tenant is not a valid one.
	for _, c := range []struct {
		body  map[string]any
		field string
	}{
		{map[string]any{"tenant": "bad\u0001tenant"}, "tenant"},
		{map[string]any{"tenant": ""}, "tenant"},
		{map[string]any{"tenant": "acme", "rate_key": ""}, "rate_key"},
	} {
		r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.BetaToken, c.body)
		if r.Status != 400 || r.Body["error_code"] != "invalid_request" || r.Body["field"] != c.field {
			t.Errorf("beta admits %v: %d %s, want 400 invalid_request naming %s", c.body, r.Status, r.Raw, c.field)
		}
	}
	if after := f.RowCounts(t); after != before {
		t.Errorf("refused requests wrote rows: %v → %v", before, after)
	}

	// Isolation: a job of acme is invisible to beta, exactly like a missing id.
	j, _, err := f.Alpha.Admit(ctx, client.AdmitRequest{Tenant: "acme", Payload: map[string]any{"n": 1}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.Beta.Admit(ctx, client.AdmitRequest{Tenant: "initech"}); err != nil {
		t.Fatal(err)
	}
	path := "/v1/jobs/" + strconv.FormatInt(j.ID, 10)
	missing := f.Do(t, http.MethodGet, "/v1/jobs/999999", apitest.BetaToken, nil)
	other := f.Do(t, http.MethodGet, path, apitest.BetaToken, nil)
	if other.Status != 404 || missing.Status != 404 || string(other.Raw) != string(missing.Raw) {
		t.Errorf("another tenant's job: %d %s; missing id: %d %s; want identical 404s", other.Status, other.Raw, missing.Status, missing.Raw)
	}
	if r := f.Do(t, http.MethodDelete, path, apitest.BetaToken, nil); r.Status != 404 || string(r.Raw) != string(missing.Raw) {
		t.Errorf("beta cancels acme's job: %d %s, want the missing-id 404", r.Status, r.Raw)
	}
	if got, err := f.Alpha.Job(ctx, j.ID); err != nil || got.Status != "queued" {
		t.Errorf("acme's job after beta's attempts: %+v %v, want still queued", got, err)
	}
	if r := f.Do(t, http.MethodGet, path, apitest.AdminToken, nil); r.Status != 200 {
		t.Errorf("admin reads any job: %d", r.Status)
	}
	// Listings: beta sees only initech, alpha only acme/globex, asking for another tenant is 403.
	p, err := f.Beta.List(ctx, client.ListOptions{})
	if err != nil || len(p.Jobs) != 1 || p.Jobs[0].Tenant != "initech" {
		t.Errorf("beta's listing: %+v %v, want initech's one job", p.Jobs, err)
	}
	p, err = f.Alpha.List(ctx, client.ListOptions{})
	if err != nil || len(p.Jobs) != 1 || p.Jobs[0].Tenant != "acme" {
		t.Errorf("alpha's listing: %+v %v, want acme's one job", p.Jobs, err)
	}
	if _, err := f.Beta.List(ctx, client.ListOptions{Tenant: "acme"}); client.Code(err) != "forbidden" {
		t.Errorf("beta lists acme: %v, want forbidden", err)
	}
	if p, err := f.Admin.List(ctx, client.ListOptions{}); err != nil || len(p.Jobs) != 2 {
		t.Errorf("admin's listing: %d jobs, %v; want 2", len(p.Jobs), err)
	}

	// No token ever reaches the log, whatever happened above.
	logs := f.Logs.String()
	for _, tok := range []string{apitest.AlphaToken, apitest.BetaToken, apitest.StarToken, apitest.ExecToken, apitest.AdminToken, "not-a-token"} {
		if strings.Contains(logs, tok) {
			t.Errorf("the log contains token %q", tok)
		}
	}
}
