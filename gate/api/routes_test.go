package api

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestRouteMisses: a known path with another method is 405 method_not_allowed with the mux's
// Allow header, an unknown path 404 not_found, both JSON and both before authentication; a
// routed request still authenticates.
func TestRouteMisses(t *testing.T) {
	s := testServer(t)
	for _, c := range []struct {
		method, path string
		status       int
		code, allow  string
	}{
		{"PUT", "/v1/jobs", 405, "method_not_allowed", "GET, HEAD, POST"},
		{"POST", "/healthz", 405, "method_not_allowed", "GET, HEAD"},
		{"GET", "/v1/jobs:batch", 405, "method_not_allowed", "POST"},
		{"GET", "/v1/jobs/7/start", 405, "method_not_allowed", "POST"},
		{"PATCH", "/v1/jobs/7", 405, "method_not_allowed", "DELETE, GET, HEAD"},
		{"DELETE", "/v1/config", 405, "method_not_allowed", "GET, HEAD, PATCH"},
		{"GET", "/v1/nope", 404, "not_found", ""},
		{"POST", "/", 404, "not_found", ""},
		{"GET", "/v1/jobs/7", 401, "unauthorized", ""},
	} {
		req := httptest.NewRequest(c.method, c.path, strings.NewReader("{}"))
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		var body map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Errorf("%s %s: body %q is not JSON: %v", c.method, c.path, w.Body, err)
			continue
		}
		if w.Code != c.status || body["error_code"] != c.code || body["message"] == "" {
			t.Errorf("%s %s: HTTP %d %v, want %d %s with a message", c.method, c.path, w.Code, body, c.status, c.code)
		}
		if ct := w.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s %s: Content-Type %q", c.method, c.path, ct)
		}
		if got := w.Header().Get("Allow"); got != c.allow {
			t.Errorf("%s %s: Allow %q, want %q", c.method, c.path, got, c.allow)
		}
	}
}
