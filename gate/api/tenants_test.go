package api

import (
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice/gate/status"
)

// TestTenantsRequests: GET /v1/tenants needs a token (401) of an admin (403), and refuses a bad
// order, limit or cursor with 400 invalid_request naming the field, before reading anything
// (testServer's database is unreachable, so a request that got that far would answer 503).
func TestTenantsRequests(t *testing.T) {
	s := testServer(t)
	prod, err := NewTokens([]Token{{Name: "admin", Token: testAdminToken, Role: Admin},
		{Name: "p", Token: "producer-token-0123456789abcdefghijkl", Role: Producer, Tenants: []string{"*"}}})
	if err != nil {
		t.Fatal(err)
	}
	s.cfg.Tokens = prod
	nameCursor := tenantsCursor(status.ByName, status.TenantKey{Tenant: "acme"})
	depthCursor := tenantsCursor(status.ByDepth, status.TenantKey{Depth: 3, Tenant: "acme"})
	for _, c := range []struct {
		token, query string
		status       int
		code, field  string
	}{
		{"", "", 401, "unauthorized", ""},
		{"producer-token-0123456789abcdefghijkl", "", 403, "forbidden", ""},
		{testAdminToken, "?order=size", 400, "invalid_request", "order"},
		{testAdminToken, "?limit=0", 400, "invalid_request", "limit"},
		{testAdminToken, "?limit=1001", 400, "invalid_request", "limit"},
		{testAdminToken, "?limit=x", 400, "invalid_request", "limit"},
		{testAdminToken, "?cursor=%25%25", 400, "invalid_request", "cursor"},
		{testAdminToken, "?cursor=" + encodeCursor(7), 400, "invalid_request", "cursor"},
		{testAdminToken, "?order=depth&cursor=" + nameCursor, 400, "invalid_request", "cursor"},
		{testAdminToken, "?cursor=" + depthCursor, 400, "invalid_request", "cursor"},
		{testAdminToken, "?tenant=", 400, "invalid_request", "tenant"},
		{testAdminToken, "?tenant=%E2%80%8Bzw", 400, "invalid_request", "tenant"},
		{testAdminToken, "?tenant=acme&cursor=ignored", 503, "unavailable", ""},
		{testAdminToken, "?order=depth&limit=1000&cursor=" + depthCursor, 503, "unavailable", ""},
		{testAdminToken, "?cursor=" + nameCursor, 503, "unavailable", ""},
	} {
		req := httptest.NewRequest("GET", "/v1/tenants"+c.query, nil)
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		var body map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatalf("%s: %q: %v", c.query, w.Body, err)
		}
		field, _ := body["field"].(string)
		if w.Code != c.status || body["error_code"] != c.code || field != c.field {
			t.Errorf("%s with %q: HTTP %d %v, want %d %s field %q", c.query, c.token, w.Code, body, c.status, c.code, c.field)
		}
	}
}

// TestTenantsCursorRoundTrip: a cursor decodes, in its own order, to the key it was made of,
// whatever the tenant name holds.
func TestTenantsCursorRoundTrip(t *testing.T) {
	for _, k := range []status.TenantKey{{Depth: 1, Tenant: "a"}, {Depth: 4294967295, Tenant: "we:ird name/é"}} {
		for _, order := range []string{status.ByName, status.ByDepth} {
			got, err := decodeTenantsCursor(order, tenantsCursor(order, k))
			want := k
			if order == status.ByName {
				want.Depth = 0
			}
			if err != nil || *got != want {
				t.Errorf("%s %+v: decoded %+v, %v", order, k, got, err)
			}
		}
	}
}
