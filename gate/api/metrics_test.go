package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestMetricsToken: with SLUICE_METRICS_TOKEN set a scrape needs it (401 unauthorized without it
// or with another), and without one /metrics is open.
func TestMetricsToken(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_test_total", Help: "test"}))
	scrape := func(h http.Handler, auth string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "/metrics", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	guarded := MetricsHandler(reg, "metrics-secret")
	for _, auth := range []string{"", "Bearer wrong", "metrics-secret", "Basic metrics-secret"} {
		if w := scrape(guarded, auth); w.Code != http.StatusUnauthorized || !strings.Contains(w.Body.String(), `"unauthorized"`) {
			t.Errorf("Authorization %q: HTTP %d %s, want 401 unauthorized", auth, w.Code, w.Body)
		}
	}
	if w := scrape(guarded, "Bearer metrics-secret"); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "sluice_test_total") {
		t.Errorf("the token: HTTP %d %s, want the metrics", w.Code, w.Body)
	}
	if w := scrape(MetricsHandler(reg, ""), ""); w.Code != http.StatusOK {
		t.Errorf("no token configured: HTTP %d, want 200", w.Code)
	}
}

// TestMetricsElsewhere: with metrics on their own listener, the API's /metrics answers 404
// naming it.
func TestMetricsElsewhere(t *testing.T) {
	s := testServer(t)
	cfg := s.cfg
	cfg.MetricsElsewhere = "10.0.0.5:9480"
	s2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	s2.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	if w.Code != http.StatusNotFound || !strings.Contains(w.Body.String(), "10.0.0.5:9480") {
		t.Fatalf("HTTP %d %s, want 404 naming the metrics listener", w.Code, w.Body)
	}
}
