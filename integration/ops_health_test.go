package integration_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cmd/sluice/app"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/integration/testdb"
	"github.com/sluicehq/sluice/migrations"
)

func getJSON(t *testing.T, url string) (int, map[string]any, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return resp.StatusCode, m, string(raw)
}

// TestOpsHealth: /healthz is liveness; /readyz needs the database and a current schema, and
// reports NATS and memcached without requiring them; a process without the API role still serves
// /metrics and the health endpoints, and its clean stop removes it from the status.
func TestOpsHealth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	deadMemcached := natstest.FreePort(t) // nothing listens there
	env := startOps(t, opsOptions{Memcached: []string{"127.0.0.1:" + itoa(deadMemcached)}})

	if code, body, raw := getJSON(t, env.URL+"/healthz"); code != http.StatusOK || body["status"] != "ok" {
		t.Errorf("/healthz: HTTP %d %s", code, raw)
	}
	code, body, raw := getJSON(t, env.URL+"/readyz")
	if code != http.StatusOK || body["status"] != "ready" {
		t.Errorf("/readyz with memcached down: HTTP %d %s, want 200 (memcached is optional)", code, raw)
	}
	if b, _ := body["broker"].(map[string]any); b["connected"] != true {
		t.Errorf("/readyz broker: %s", raw)
	}
	if m, _ := body["memcached"].(map[string]any); m["reachable"] != false {
		t.Errorf("/readyz memcached: %s, want reachable false", raw)
	}
	st := env.Do(t, http.MethodGet, "/v1/status", harness.AdminToken, nil)
	if m, _ := st.Body["memcached"].(map[string]any); m["reachable"] != false {
		t.Errorf("/v1/status memcached: %s, want reachable false", st.Raw)
	}

	// A schema behind the binary makes the process unready.
	latest := migrations.Latest()
	var name string
	var applied time.Time
	if err := env.DB.QueryRowContext(ctx, "SELECT name, applied_at FROM schema_migrations WHERE version = ?", latest).Scan(&name, &applied); err != nil {
		t.Fatal(err)
	}
	if _, err := env.DB.ExecContext(ctx, "DELETE FROM schema_migrations WHERE version = ?", latest); err != nil {
		t.Fatal(err)
	}
	// /readyz answers from a reading at most a second old: the change shows within it.
	harness.WaitFor(t, 5*time.Second, "/readyz to answer 503 naming the schema", func() (bool, error) {
		code, _, raw = getJSON(t, env.URL+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(raw, "schema"), nil
	})
	if _, err := env.DB.ExecContext(ctx, "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)", latest, name, applied); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 5*time.Second, "/readyz to answer 200 after restoring the schema", func() (bool, error) {
		code, _, _ := getJSON(t, env.URL+"/readyz")
		return code == http.StatusOK, nil
	})

	// A drainer-only process on the same database.
	nctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	d, err := app.Start(nctx, app.Options{MySQLDSN: env.DB.DSN, NATSURL: env.NATS.URL(), Listen: "127.0.0.1:0",
		ExecutorURL: env.ExecURL, ExecutorSecret: harness.Secret, Drainer: true, DrainerID: "drainer-only",
		Log: slog.New(slog.NewJSONHandler(testLogSink(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = d.Stop(ctx)
		}
	})
	base := "http://" + d.Addr()
	harness.WaitFor(t, 10*time.Second, "the drainer-only process to export its last pass", func() (bool, error) {
		v, ok := metricValue(scrape(t, base), "sluice_drainer_last_poll_timestamp_seconds")
		return ok && v > 0, nil
	})
	if code, _, raw := getJSON(t, base+"/readyz"); code != http.StatusOK {
		t.Errorf("drainer-only /readyz: HTTP %d %s", code, raw)
	}
	if code, _, _ := getJSON(t, base+"/v1/status"); code != http.StatusNotFound {
		t.Errorf("drainer-only process serves /v1/status (HTTP %d): it has no API", code)
	}
	drainerIDs := func() []string {
		r := env.Do(t, http.MethodGet, "/v1/status", harness.AdminToken, nil)
		var ids []string
		for _, d := range r.Body["drainers"].([]any) {
			ids = append(ids, d.(map[string]any)["id"].(string))
		}
		return ids
	}
	harness.WaitFor(t, 10*time.Second, "both drainers in the status", func() (bool, error) { return len(drainerIDs()) == 2, nil })
	if err := d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	stopped = true
	if ids := drainerIDs(); len(ids) != 1 || ids[0] == "drainer-only" {
		t.Errorf("drainers after a clean stop: %v, want only the API process's", ids)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestOpsSchemaGapIsNotCurrent: a database that has a later migration but lacks an earlier one
// (branches merged out of order) is not current, so /readyz and start-up refuse it.
func TestOpsSchemaGapIsNotCurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	all, err := migrations.All()
	if err != nil || len(all) < 2 {
		t.Fatalf("migrations: %v (%d)", err, len(all))
	}
	if ok, err := migrations.Current(ctx, db.DB); err != nil || !ok {
		t.Fatalf("fresh database: current %v (%v), want true", ok, err)
	}
	gap := all[len(all)-2].Version // not the latest: MAX(version) stays the latest
	if _, err := db.ExecContext(ctx, "DELETE FROM schema_migrations WHERE version = ?", gap); err != nil {
		t.Fatal(err)
	}
	if ok, err := migrations.Current(ctx, db.DB); err != nil || ok {
		t.Errorf("database lacking migration %d: current %v (%v), want false", gap, ok, err)
	}
}
