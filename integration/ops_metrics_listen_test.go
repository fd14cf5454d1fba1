package integration_test

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/integration/apitest"
	"github.com/sluicehq/sluice/integration/harness"
)

// TestMetricsOwnListener: with SLUICE_METRICS_LISTEN and SLUICE_METRICS_TOKEN a process serves
// /metrics on its own address, to a scrape with the token only, and the API's /metrics answers
// 404; with SLUICE_METRICS_TENANT_LABELS=false no tenant name is a label (SPEC §9).
func TestMetricsOwnListener(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{MetricsListen: "127.0.0.1:0", MetricsToken: "scrape-token-0123456789", NoTenantLabels: true})
	env.Admit(t, "visible-tenant-name", map[string]any{"sleep_ms": 0})
	scrape := func(url, token string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := env.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	metrics := "http://" + env.App.MetricsAddr() + "/metrics"
	if code, body := scrape(metrics, "scrape-token-0123456789"); code != http.StatusOK || !strings.Contains(body, "sluice_queue_depth") {
		t.Fatalf("scrape with the token: HTTP %d, want the metrics:\n%.300s", code, body)
	} else if strings.Contains(body, "visible-tenant-name") {
		t.Errorf("a tenant name is a label with tenant labels off")
	}
	if code, _ := scrape(metrics, ""); code != http.StatusUnauthorized {
		t.Errorf("scrape without the token: HTTP %d, want 401", code)
	}
	if code, body := scrape(env.URL+"/metrics", "scrape-token-0123456789"); code != http.StatusNotFound || !strings.Contains(body, env.App.MetricsAddr()) {
		t.Errorf("the API's /metrics: HTTP %d %s, want 404 naming the metrics listener", code, body)
	}
}

// TestMetricsOpenWarns: a process that serves /metrics on its API listener without a token says
// so once at start, at warn (issue 30, finding 12b): anyone who reaches the API then reads queue
// depths and the deepest tenants' names. A metrics token, or a listener of its own, silences it.
func TestMetricsOpenWarns(t *testing.T) {
	t.Parallel()
	logs := &apitest.LogBuffer{}
	env := harness.Start(t, harness.Options{API: true, Log: slog.New(slog.NewJSONHandler(logs, nil))})
	// warned counts the warn lines that tell the operator how to close /metrics.
	warned := func() int {
		n := 0
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, `"level":"WARN"`) && strings.Contains(line, "SLUICE_METRICS_TOKEN") {
				n++
			}
		}
		return n
	}
	if n := warned(); n != 1 {
		t.Fatalf("open /metrics: %d warn lines naming SLUICE_METRICS_TOKEN, want 1:\n%s", n, logs.String())
	}
	env.StartApp(t, harness.Options{API: true, MetricsToken: "scrape-token-0123456789"})
	env.StartApp(t, harness.Options{API: true, MetricsListen: "127.0.0.1:0"})
	if n := warned(); n != 1 {
		t.Errorf("after two more processes, with a metrics token and with a listener of their own: %d warn lines, want still 1", n)
	}
}
