package api_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/rategate"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/apitest"
	"github.com/sluicehq/sluice/integration/memcachedtest"
)

// TestFrontDoorDatabaseDownEveryEndpoint: with the database unreachable, every endpoint that
// reads or writes it answers 503 unavailable with retryable: true and writes nothing, as SPEC §6
// asks of admission, so that no caller is handed a 500 for an outage. Every answer is one
// openapi.json describes. The table must name every registered route that touches the
// database; the routes it leaves out are listed with the reason, so that a new route forces a
// decision here.
func TestFrontDoorDatabaseDownEveryEndpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	probe := apitest.Setup(t, apitest.Options{}) // only for its database
	proxy, viaProxy := apitest.DBThroughCutter(t, probe.DB)
	// GET /v1/gates reads the database only when a gate store is configured.
	gates, err := rategate.New(rategate.Config{Servers: []string{memcachedtest.Shared(t)}, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	f := apitest.SetupOn(t, probe, apitest.Options{AdmitDB: viaProxy, APIDB: viaProxy, APIGates: gates})

	admit := func() int64 {
		t.Helper()
		r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": "acme", "rate_key": "k"})
		if r.Status != http.StatusAccepted {
			t.Fatalf("admit: HTTP %d %s", r.Status, r.Raw)
		}
		return apitest.JobID(t, r.Body)
	}
	queued := admit()
	running := admit() // as a drainer leaves it once it has sent it
	if _, err := f.DB.ExecContext(ctx, `UPDATE jobs SET status = 'dispatched', version = version + 1,
		attempt = attempt + 1, claimed_at = UTC_TIMESTAMP(6), dispatched_at = UTC_TIMESTAMP(6),
		lease_until = UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE, drainer_id = 'test', nonce_sha256 = ?,
		nonce_expires_at = UTC_TIMESTAMP(6) + INTERVAL 5 MINUTE WHERE id = ?`, store.HashNonce("n1"), running); err != nil {
		t.Fatal(err)
	}
	failed := admit() // a redrivable job
	if _, err := f.DB.ExecContext(ctx, `UPDATE jobs SET status = 'failed', version = version + 1,
		finished_at = UTC_TIMESTAMP(6), error_code = 'boom' WHERE id = ?`, failed); err != nil {
		t.Fatal(err)
	}
	jobPath := func(id int64, suffix string) string { return "/v1/jobs/" + strconv.FormatInt(id, 10) + suffix }
	calls := []struct {
		method, template, path, token string
		body                          any
	}{
		{http.MethodPost, "/v1/jobs", "/v1/jobs", apitest.StarToken, map[string]any{"tenant": "acme"}},
		{http.MethodPost, "/v1/jobs:batch", "/v1/jobs:batch", apitest.StarToken, map[string]any{"jobs": []any{map[string]any{"tenant": "acme"}}}},
		{http.MethodGet, "/v1/jobs", "/v1/jobs?tenant=acme", apitest.AlphaToken, nil},
		{http.MethodGet, "/v1/jobs/{id}", jobPath(queued, ""), apitest.AlphaToken, nil},
		{http.MethodGet, "/v1/jobs/{id}/events", jobPath(queued, "/events"), apitest.AlphaToken, nil},
		{http.MethodGet, "/v1/audit", "/v1/audit?tenant=acme", apitest.AdminToken, nil},
		{http.MethodDelete, "/v1/jobs/{id}", jobPath(queued, ""), apitest.AlphaToken, nil},
		{http.MethodPost, "/v1/jobs/{id}/redrive", jobPath(failed, "/redrive"), apitest.AdminToken, nil},
		{http.MethodPost, "/v1/jobs/{id}/start", jobPath(running, "/start"), apitest.ExecToken, map[string]any{"nonce": "n1"}},
		{http.MethodPost, "/v1/jobs/{id}/complete", jobPath(running, "/complete"), apitest.ExecToken,
			map[string]any{"nonce": "n1", "status": "succeeded"}},
		{http.MethodPost, "/v1/releases", "/v1/releases", apitest.ExecToken, map[string]any{"tenant": "acme"}},
		{http.MethodGet, "/v1/gates", "/v1/gates", apitest.AdminToken, nil},
		{http.MethodGet, "/v1/status", "/v1/status", apitest.AdminToken, nil},
		{http.MethodGet, "/v1/tenants", "/v1/tenants?order=depth", apitest.AdminToken, nil},
		{http.MethodGet, "/v1/config", "/v1/config", apitest.AdminToken, nil},
		{http.MethodPatch, "/v1/config", "/v1/config", apitest.AdminToken, map[string]any{"changes": map[string]any{"global_in_flight": 7}}},
		{http.MethodGet, "/v1/config/history", "/v1/config/history", apitest.AdminToken, nil},
		{http.MethodPost, "/v1/config/simulate", "/v1/config/simulate", apitest.AdminToken, map[string]any{"changes": map[string]any{"global_in_flight": 7}}},
		{http.MethodPost, "/v1/slots", "/v1/slots", apitest.StarToken, map[string]any{"tenant": "acme"}},
		{http.MethodGet, "/v1/slots", "/v1/slots?tenant=acme", apitest.AdminToken, nil},
		{http.MethodPost, "/v1/slots/{id}/renew", "/v1/slots/1/renew", apitest.StarToken, nil},
		{http.MethodDelete, "/v1/slots/{id}", "/v1/slots/1", apitest.StarToken, nil},
	}
	// The routes that never touch the database, and so have no database outage to answer.
	noDatabase := map[string]string{
		"POST /v1/gates":                     "memcached only",
		"DELETE /v1/gates/{rate_key_sha256}": "memcached only",
		"GET /healthz":                       "process alive, by definition without dependencies",
		"GET /readyz":                        "its own documented 503, status unavailable",
		"GET /metrics":                       "collectors report sluice_status_read_success 0 instead of failing the scrape",
		"GET /v1/whoami":                     "the token's own caller, from the process's configuration",
	}
	covered := map[string]bool{}
	for _, c := range calls {
		covered[c.method+" "+c.template] = true
	}
	for _, route := range f.API.Routes() {
		if !covered[route] && noDatabase[route] == "" {
			t.Errorf("route %s is neither called with the database down nor listed as not using it", route)
		}
	}

	configVersions := func() int {
		t.Helper()
		var n int
		if err := f.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM config_versions").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before, versions := f.RowCounts(t), configVersions()
	proxy.SetDown(true)
	for _, c := range calls {
		r := f.Do(t, c.method, c.path, c.token, c.body)
		if r.Status != http.StatusServiceUnavailable || r.Body["error_code"] != "unavailable" || r.Body["retryable"] != true {
			t.Errorf("%s %s with the database unreachable: HTTP %d %s, want 503 unavailable retryable", c.method, c.path, r.Status, r.Raw)
		}
		checkDescribed(t, c.method, c.template, r)
	}
	if after := f.RowCounts(t); after != before {
		t.Errorf("rows (jobs, outbox, tenants) went from %v to %v during the outage", before, after)
	}
	if n := configVersions(); n != versions {
		t.Errorf("config versions went from %d to %d during the outage", versions, n)
	}
}

// TestFrontDoorConfigPatchCommitCut: PATCH /v1/config whose connection breaks during COMMIT
// cannot know whether the new version was written, so it answers 503 outcome_unknown with
// retryable: true (the same PATCH again sets the same values), not "unavailable, nothing was
// written". Its repeat answers 200, and the change exists once.
func TestFrontDoorConfigPatchCommitCut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	probe := apitest.Setup(t, apitest.Options{}) // only for its database
	proxy, viaProxy := apitest.DBThroughCutter(t, probe.DB)
	f := apitest.SetupOn(t, probe, apitest.Options{APIDB: viaProxy})
	var before int
	if err := f.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM config_versions").Scan(&before); err != nil {
		t.Fatal(err)
	}
	patch := map[string]any{"changes": map[string]any{"global_in_flight": 7}, "note": "cut"}

	proxy.Armed.Store(true)
	r := f.Do(t, http.MethodPatch, "/v1/config", apitest.AdminToken, patch)
	if proxy.Cuts.Load() != 1 {
		t.Fatalf("the proxy cut %d connections, want 1", proxy.Cuts.Load())
	}
	if r.Status != http.StatusServiceUnavailable || r.Body["error_code"] != "outcome_unknown" || r.Body["retryable"] != true {
		t.Errorf("PATCH cut at COMMIT: HTTP %d %s, want 503 outcome_unknown retryable", r.Status, r.Raw)
	}
	checkDescribed(t, http.MethodPatch, "/v1/config", r)
	r = f.Do(t, http.MethodPatch, "/v1/config", apitest.AdminToken, patch)
	if r.Status != http.StatusOK {
		t.Fatalf("PATCH repeated: HTTP %d %s", r.Status, r.Raw)
	}
	var after int
	if err := f.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM config_versions").Scan(&after); err != nil {
		t.Fatal(err)
	}
	v, err := config.Load(ctx, f.DB)
	if err != nil {
		t.Fatal(err)
	}
	if after != before+1 || v.Config.GlobalInFlight != 7 {
		t.Errorf("after the cut and the repeat: %d new config versions, global_in_flight %d; want 1 and 7",
			after-before, v.Config.GlobalInFlight)
	}
}
