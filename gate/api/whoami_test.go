package api

import (
	"encoding/json"
	"net/http/httptest"
	"slices"
	"testing"
)

// TestWhoAmI: GET /v1/whoami answers every role with its name, role and (producers only) its
// tenants, and a request without a valid token 401.
func TestWhoAmI(t *testing.T) {
	s := testServer(t)
	toks, err := NewTokens([]Token{{Name: "admin", Token: testAdminToken, Role: Admin},
		{Name: "portal", Token: "producer-token-0123456789abcdefghijkl", Role: Producer, Tenants: []string{"acme", "globex"}},
		{Name: "runner", Token: "executor-token-0123456789abcdefghijkl", Role: Executor}})
	if err != nil {
		t.Fatal(err)
	}
	s.cfg.Tokens = toks
	for _, c := range []struct {
		token  string
		status int
		want   WhoAmI
	}{
		{testAdminToken, 200, WhoAmI{Name: "admin", Role: Admin, Tenants: []string{}}},
		{"producer-token-0123456789abcdefghijkl", 200, WhoAmI{Name: "portal", Role: Producer, Tenants: []string{"acme", "globex"}}},
		{"executor-token-0123456789abcdefghijkl", 200, WhoAmI{Name: "runner", Role: Executor, Tenants: []string{}}},
		{"not-a-token", 401, WhoAmI{}},
	} {
		req := httptest.NewRequest("GET", "/v1/whoami", nil)
		req.Header.Set("Authorization", "Bearer "+c.token)
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		if w.Code != c.status {
			t.Errorf("%s: HTTP %d %s, want %d", c.token, w.Code, w.Body, c.status)
			continue
		}
		if c.status != 200 {
			continue
		}
		var got WhoAmI
		if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
			t.Fatal(err)
		}
		if got.Name != c.want.Name || got.Role != c.want.Role || !slices.Equal(got.Tenants, c.want.Tenants) || got.Tenants == nil {
			t.Errorf("%s: %+v, want %+v", c.token, got, c.want)
		}
	}
}
