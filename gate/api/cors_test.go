package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestCORS: an allowed origin's requests carry Access-Control-Allow-Origin, Vary and the
// capacity headers exposed, and its preflight is answered before authentication; another
// origin, or none, gets no CORS header.
func TestCORS(t *testing.T) {
	s := testServer(t)
	s.cfg.CORSOrigins = []string{"https://console.example.com"}
	send := func(method, origin string, preflight bool) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, "/v1/slots", nil)
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		if preflight {
			req.Header.Set("Access-Control-Request-Method", "POST")
			req.Header.Set("Access-Control-Request-Headers", "authorization, content-type, sluice-capacity-aware")
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		return w
	}
	w := send(http.MethodOptions, "https://console.example.com", true)
	h := w.Header()
	if w.Code != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "https://console.example.com" ||
		!strings.Contains(h.Get("Access-Control-Allow-Headers"), "Sluice-Capacity-Aware") ||
		!strings.Contains(h.Get("Access-Control-Allow-Headers"), "Authorization") ||
		!strings.Contains(h.Get("Access-Control-Allow-Methods"), "DELETE") || h.Get("Vary") != "Origin" {
		t.Errorf("preflight: HTTP %d %v", w.Code, h)
	}
	w = send(http.MethodGet, "https://console.example.com", false)
	if w.Code != http.StatusUnauthorized || w.Header().Get("Access-Control-Allow-Origin") == "" ||
		!strings.Contains(w.Header().Get("Access-Control-Expose-Headers"), "Sluice-Capacity-Suggested-Concurrency") {
		t.Errorf("an allowed origin's request: HTTP %d %v", w.Code, w.Header())
	}
	for _, origin := range []string{"https://evil.example.com", ""} {
		w = send(http.MethodOptions, origin, true)
		if w.Header().Get("Access-Control-Allow-Origin") != "" || w.Code == http.StatusNoContent {
			t.Errorf("origin %q: HTTP %d %v", origin, w.Code, w.Header())
		}
	}
	s.cfg.CORSOrigins = []string{"*"}
	if w = send(http.MethodGet, "https://any.example.com", false); w.Header().Get("Access-Control-Allow-Origin") != "https://any.example.com" {
		t.Errorf("with *: %v", w.Header())
	}
}
