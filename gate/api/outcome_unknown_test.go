package api_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/apitest"
)

// TestFrontDoorOutcomeUnknown cuts the database connection at COMMIT: an unkeyed admission
// answers 503 outcome_unknown retryable:false; a keyed one retryable:true, and its replay
// returns the one job that exists.
func TestFrontDoorOutcomeUnknown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	probe := apitest.Setup(t, apitest.Options{}) // only for its database
	proxy, viaProxy := apitest.DBThroughCutter(t, probe.DB)
	f := apitest.SetupOn(t, probe, apitest.Options{AdmitDB: viaProxy})

	proxy.Armed.Store(true)
	r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": "cut", "payload": 1})
	if proxy.Cuts.Load() != 1 {
		t.Fatalf("the proxy cut %d connections, want 1", proxy.Cuts.Load())
	}
	if r.Status != 503 || r.Body["error_code"] != "outcome_unknown" || r.Body["retryable"] != false {
		t.Errorf("unkeyed admission cut at COMMIT: %d %s, want 503 outcome_unknown retryable false", r.Status, r.Raw)
	}
	var n int
	if err := f.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE tenant = 'cut'").Scan(&n); err != nil || n > 1 {
		t.Errorf("%d jobs after one cut admission (%v)", n, err)
	}

	keyed := map[string]any{"tenant": "cut-keyed", "payload": 2, "idempotency_key": "once"}
	proxy.Armed.Store(true)
	r = f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, keyed)
	if r.Status != 503 || r.Body["error_code"] != "outcome_unknown" || r.Body["retryable"] != true {
		t.Errorf("keyed admission cut at COMMIT: %d %s, want 503 outcome_unknown retryable true", r.Status, r.Raw)
	}
	replay := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, keyed)
	if replay.Status != 200 && replay.Status != 202 {
		t.Fatalf("replay: %d %s", replay.Status, replay.Raw)
	}
	var id int64
	if err := f.DB.QueryRowContext(ctx, "SELECT COUNT(*), MAX(id) FROM jobs WHERE tenant = 'cut-keyed'").Scan(&n, &id); err != nil {
		t.Fatal(err)
	}
	if n != 1 || apitest.JobID(t, replay.Body) != id {
		t.Errorf("after the replay: %d jobs (want 1), replay answered job %v, the row is %d", n, replay.Body["id"], id)
	}
	if replay.Status == 200 && replay.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("a replay of the committed job without Idempotent-Replayed")
	}
	t.Logf("keyed cut: the server had %s the transaction", map[int]string{200: "committed", 202: "not committed"}[replay.Status])
}

// TestFrontDoorExecutorCallsDatabaseDown: the API's own transactions (/start, /complete, the
// cancel of DELETE /v1/jobs/{id}, /v1/releases) answer a database outage as admission does, so
// that an executor is told to retry rather than handed a 500. With the database unreachable
// each answers 503 unavailable, retryable, and writes nothing; with the connection cut during
// COMMIT each answers 503 outcome_unknown, retryable, and its repeat succeeds. Every answer is
// one openapi.json describes.
func TestFrontDoorExecutorCallsDatabaseDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	probe := apitest.Setup(t, apitest.Options{}) // only for its database
	proxy, viaProxy := apitest.DBThroughCutter(t, probe.DB)
	f := apitest.SetupOn(t, probe, apitest.Options{APIDB: viaProxy})

	admit := func() int64 {
		t.Helper()
		r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": "acme"})
		if r.Status != http.StatusAccepted {
			t.Fatalf("admit: HTTP %d %s", r.Status, r.Raw)
		}
		return apitest.JobID(t, r.Body)
	}
	queued := admit()
	// A job as a drainer leaves it once it has sent it: dispatched under a nonce's hash.
	running := admit()
	if _, err := f.DB.ExecContext(ctx, `UPDATE jobs SET status = 'dispatched', version = version + 1,
		attempt = attempt + 1, claimed_at = UTC_TIMESTAMP(6), dispatched_at = UTC_TIMESTAMP(6),
		lease_until = UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE, drainer_id = 'test', nonce_sha256 = ?,
		nonce_expires_at = UTC_TIMESTAMP(6) + INTERVAL 5 MINUTE WHERE id = ?`, store.HashNonce("n1"), running); err != nil {
		t.Fatal(err)
	}
	jobPath := func(id int64, suffix string) string { return "/v1/jobs/" + strconv.FormatInt(id, 10) + suffix }
	calls := []struct {
		name, method, template, path, token string
		body                                any
		ok                                  int
		status                              string // the job's status after the call succeeded
		id                                  int64
	}{
		{"start", http.MethodPost, "/v1/jobs/{id}/start", jobPath(running, "/start"), apitest.ExecToken,
			map[string]any{"nonce": "n1", "start_id": "attempt-1"}, http.StatusOK, "running", running},
		{"complete", http.MethodPost, "/v1/jobs/{id}/complete", jobPath(running, "/complete"), apitest.ExecToken,
			map[string]any{"nonce": "n1", "status": "succeeded"}, http.StatusOK, "succeeded", running},
		{"cancel", http.MethodDelete, "/v1/jobs/{id}", jobPath(queued, ""), apitest.AlphaToken,
			nil, http.StatusOK, "canceled", queued},
		{"release", http.MethodPost, "/v1/releases", "/v1/releases", apitest.ExecToken,
			map[string]any{"tenant": "acme"}, http.StatusAccepted, "", 0},
	}
	status := func(id int64) string {
		t.Helper()
		var s string
		if err := f.DB.QueryRowContext(ctx, "SELECT status FROM jobs WHERE id = ?", id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}

	proxy.SetDown(true)
	before := f.RowCounts(t)
	for _, c := range calls {
		r := f.Do(t, c.method, c.path, c.token, c.body)
		if r.Status != http.StatusServiceUnavailable || r.Body["error_code"] != "unavailable" || r.Body["retryable"] != true {
			t.Errorf("%s with the database unreachable: HTTP %d %s, want 503 unavailable retryable", c.name, r.Status, r.Raw)
		}
		checkDescribed(t, c.method, c.template, r)
	}
	if after := f.RowCounts(t); after != before {
		t.Errorf("rows (jobs, outbox, tenants) went from %v to %v during the outage", before, after)
	}
	if s, q := status(running), status(queued); s != "dispatched" || q != "queued" {
		t.Errorf("after the outage the jobs are %s and %s, want dispatched and queued", s, q)
	}

	proxy.SetDown(false)
	for _, c := range calls {
		cuts := proxy.Cuts.Load()
		proxy.Armed.Store(true)
		r := f.Do(t, c.method, c.path, c.token, c.body)
		if proxy.Cuts.Load() != cuts+1 {
			t.Fatalf("%s: the proxy cut %d connections, want 1", c.name, proxy.Cuts.Load()-cuts)
		}
		if r.Status != http.StatusServiceUnavailable || r.Body["error_code"] != "outcome_unknown" || r.Body["retryable"] != true {
			t.Errorf("%s cut at COMMIT: HTTP %d %s, want 503 outcome_unknown retryable", c.name, r.Status, r.Raw)
		}
		checkDescribed(t, c.method, c.template, r)
		r = f.Do(t, c.method, c.path, c.token, c.body)
		if r.Status != c.ok {
			t.Errorf("%s repeated after the cut: HTTP %d %s, want %d", c.name, r.Status, r.Raw, c.ok)
		}
		if c.id != 0 {
			if s := status(c.id); s != c.status {
				t.Errorf("%s repeated after the cut left the job %s, want %s", c.name, s, c.status)
			}
		}
	}
}
