package api

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/gate/console"
)

// TestConsoleMounted: the API's listener serves the console at /ui/ without a token, under its
// Content-Security-Policy, and sends /ui to /ui/.
func TestConsoleMounted(t *testing.T) {
	s := testServer(t)
	w := httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest("GET", "/ui/", nil))
	if w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") ||
		w.Header().Get("Content-Security-Policy") != console.ContentSecurityPolicy {
		t.Errorf("GET /ui/: HTTP %d %v", w.Code, w.Header())
	}
	w = httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest("GET", "/ui", nil))
	if w.Code != 307 || w.Header().Get("Location") != "/ui/" {
		t.Errorf("GET /ui: HTTP %d Location %q, want 307 to /ui/", w.Code, w.Header().Get("Location"))
	}
}
