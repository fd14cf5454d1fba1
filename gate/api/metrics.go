package api

import (
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/gate/job"
)

// MetricsHandler serves g in the Prometheus text format. With a token (SLUICE_METRICS_TOKEN) a
// scrape must carry it as `Authorization: Bearer <token>`, compared in constant time, or is
// answered 401; without one, /metrics is open (SPEC §6, §9).
func MetricsHandler(g prometheus.Gatherer, token string) http.Handler {
	h := promhttp.HandlerFor(g, promhttp.HandlerOpts{})
	if token == "" {
		return h
	}
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			writeJSON(w, statusOf[job.CodeUnauthorized], map[string]any{"error_code": job.CodeUnauthorized,
				"message": "/metrics needs the metrics token (SLUICE_METRICS_TOKEN)"})
			return
		}
		h.ServeHTTP(w, r)
	})
}
