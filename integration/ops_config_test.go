package integration_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/apitest"
	"github.com/sluicehq/sluice/integration/harness"
)

// TestOpsConfigAPI covers GET/PATCH /v1/config and the history (SPEC §9): every key is shown,
// a valid change writes exactly one version and one log line, an invalid one is refused with the
// key named and writes nothing, changes are all-or-nothing, and concurrent changes serialise.
func TestOpsConfigAPI(t *testing.T) {
	t.Parallel()
	env := startOps(t, opsOptions{})
	ctx := context.Background()

	r := env.Do(t, http.MethodGet, "/v1/config", harness.AdminToken, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET /v1/config: HTTP %d %s", r.Status, r.Raw)
	}
	if v := r.Body["version"].(float64); v != 0 {
		t.Errorf("version of a fresh installation = %v, want 0 (defaults)", v)
	}
	cfg := r.Body["config"].(map[string]any)
	for _, k := range config.Keys() {
		if _, ok := cfg[k]; !ok {
			t.Errorf("GET /v1/config lacks key %s", k)
		}
	}
	if len(cfg) != 26 || cfg["ordering"] != "fair" || cfg["global_in_flight"] != 4.0 || cfg["audit_retention_days"] != 30.0 {
		t.Errorf("defaults = %v, want the 26 keys of SPEC §9 with ordering fair, global_in_flight 4", cfg)
	}
	if r := env.Do(t, http.MethodGet, "/v1/config", harness.ProducerToken, nil); r.Status != http.StatusForbidden {
		t.Errorf("GET /v1/config as producer: HTTP %d, want 403", r.Status)
	}

	// A valid change.
	r = env.Do(t, http.MethodPatch, "/v1/config", harness.AdminToken, map[string]any{
		"changes": map[string]any{"global_in_flight": 8, "ordering": "fifo", "tenant_in_flight_overrides": map[string]int{"acme": 3}},
		"note":    "more room for the burst"})
	if r.Status != http.StatusOK || r.Body["version"].(float64) != 1 {
		t.Fatalf("PATCH: HTTP %d %s, want 200 and version 1", r.Status, r.Raw)
	}
	// Invalid changes: each refused with the key named, nothing written (all or nothing: the
	// valid key beside the invalid one is not applied either).
	for _, tc := range []struct {
		changes map[string]any
		field   string
	}{
		{map[string]any{"global_in_flight": -1, "tenant_in_flight": 5}, "global_in_flight"},
		{map[string]any{"ordering": "lifo"}, "ordering"},
		{map[string]any{"lease_seconds": 0}, "lease_seconds"},
		{map[string]any{"lease_seconds": "10"}, "lease_seconds"},
		{map[string]any{"lease_seconds": 2.5}, "lease_seconds"},
		{map[string]any{"no_such_key": 1}, "no_such_key"},
		{map[string]any{"admission_mode": nil}, "admission_mode"},
		{map[string]any{"tenant_in_flight_overrides": map[string]int{"x": -2}}, "tenant_in_flight_overrides"},
		// Past its bound a day or second count overflows a time.Duration: 213,504 days wrapped to
		// 25 minutes, and the purger took every finished job and audit event.
		{map[string]any{"retention_days": 213504}, "retention_days"},
		{map[string]any{"audit_retention_days": 36501}, "audit_retention_days"},
		{map[string]any{"execution_wall_seconds": 9223372037}, "execution_wall_seconds"},
		{map[string]any{}, "changes"},
	} {
		r := env.Do(t, http.MethodPatch, "/v1/config", harness.AdminToken, map[string]any{"changes": tc.changes})
		if r.Status != http.StatusBadRequest || r.Body["error_code"] != "invalid_request" || r.Body["field"] != tc.field {
			t.Errorf("PATCH %v: HTTP %d %s, want 400 invalid_request naming %s", tc.changes, r.Status, r.Raw, tc.field)
		}
		if msg, _ := r.Body["message"].(string); r.Status == http.StatusBadRequest && !strings.Contains(msg, tc.field) {
			t.Errorf("PATCH %v: message %q does not name the key", tc.changes, msg)
		}
	}
	r = env.Do(t, http.MethodGet, "/v1/config", harness.AdminToken, nil)
	cfg = r.Body["config"].(map[string]any)
	if r.Body["version"].(float64) != 1 || cfg["tenant_in_flight"] != 2.0 || cfg["global_in_flight"] != 8.0 || cfg["ordering"] != "fifo" {
		t.Errorf("after refused changes: version %v config %v, want version 1 unchanged", r.Body["version"], cfg)
	}

	// Concurrent changes: 8 admins each raise a different key; every one gets its own version
	// and the final config has all eight (no change was built on a stale version and lost).
	keys := []string{"tenant_queue_depth", "global_queue_depth", "admission_rate_per_minute", "execution_wall_seconds",
		"max_queue_age_seconds", "nonce_ttl_seconds", "dispatch_attempts", "retention_days"}
	var wg sync.WaitGroup
	versions := make(chan float64, len(keys))
	for i, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, body, err := apiDo(ctx, env.HTTP, http.MethodPatch, env.URL+"/v1/config", harness.AdminToken,
				map[string]any{"changes": map[string]any{k: 1000 + i}, "note": "concurrent " + k})
			if err != nil || code != http.StatusOK {
				t.Errorf("concurrent PATCH %s: HTTP %d %v %v", k, code, body, err)
				return
			}
			versions <- body["version"].(float64)
		}()
	}
	wg.Wait()
	close(versions)
	seen := map[float64]bool{}
	for v := range versions {
		if seen[v] {
			t.Errorf("two concurrent changes both won version %v", v)
		}
		seen[v] = true
	}
	r = env.Do(t, http.MethodGet, "/v1/config", harness.AdminToken, nil)
	cfg = r.Body["config"].(map[string]any)
	if r.Body["version"].(float64) != 9 {
		t.Errorf("version after 1 + 8 changes = %v, want 9", r.Body["version"])
	}
	for i, k := range keys {
		if cfg[k] != float64(1000+i) {
			t.Errorf("%s = %v after the concurrent changes, want %d (a change was lost)", k, cfg[k], 1000+i)
		}
	}

	// History: one row per version, newest first, with who, when, old, new and note.
	r = env.Do(t, http.MethodGet, "/v1/config/history", harness.AdminToken, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("history: HTTP %d %s", r.Status, r.Raw)
	}
	hist := r.Body["history"].([]any)
	if len(hist) != 9 {
		t.Fatalf("history has %d entries, want 9", len(hist))
	}
	first := hist[8].(map[string]any)
	if first["version"] != 1.0 || first["who"] != "admin" || first["note"] != "more room for the burst" || first["when"] == "" {
		t.Errorf("history of version 1 = %v", first)
	}
	oldV, newV := first["old"].(map[string]any), first["new"].(map[string]any)
	if oldV["global_in_flight"] != 4.0 || newV["global_in_flight"] != 8.0 || oldV["ordering"] != "fair" || newV["ordering"] != "fifo" || len(newV) != 3 {
		t.Errorf("history of version 1: old %v new %v, want exactly the three changed keys", oldV, newV)
	}
	for i, h := range hist[:8] {
		if n := len(h.(map[string]any)["new"].(map[string]any)); n != 1 {
			t.Errorf("history entry %d changed %d keys, want 1", i, n)
		}
	}
	// One log line per change.
	if n := strings.Count(env.Log.String(), `"msg":"runtime config changed"`); n != 9 {
		t.Errorf("%d 'runtime config changed' log lines, want 9", n)
	}
	// Picking a change up is not a second line at info level: only the version the process
	// started with is.
	if n := strings.Count(env.Log.String(), `"level":"INFO","msg":"runtime config loaded"`); n != 1 {
		t.Errorf("%d info lines 'runtime config loaded', want 1 (at start-up)", n)
	}
	// A change that changes nothing writes nothing.
	r = env.Do(t, http.MethodPatch, "/v1/config", harness.AdminToken, map[string]any{"changes": map[string]any{"ordering": "fifo"}})
	if r.Status != http.StatusOK || r.Body["version"].(float64) != 9 || r.Body["change"] != nil {
		t.Errorf("no-op PATCH: HTTP %d %s, want 200, version 9, no change", r.Status, r.Raw)
	}
}

// TestOpsConfigTakesEffect: a change made through the API reaches the drainer's very next claim
// (caps are read in the claim transaction) and another process's admission within one re-read
// period (config.ReloadEvery, 5 s).
func TestOpsConfigTakesEffect(t *testing.T) {
	t.Parallel()
	env := startOps(t, opsOptions{})
	ctx := context.Background()

	// Pause dispatch, admit work, and let the drainer pass twice: nothing may be dispatched.
	if r := env.Do(t, http.MethodPatch, "/v1/config", harness.AdminToken, map[string]any{
		"changes": map[string]any{"global_in_flight": 0, "tenant_in_flight": 10}, "note": "pause"}); r.Status != http.StatusOK {
		t.Fatalf("pause: HTTP %d %s", r.Status, r.Raw)
	}
	for i := 0; i < 12; i++ {
		env.Admit(t, "acme", map[string]any{"sleep_ms": 300})
	}
	var admittedAt time.Time
	if err := env.DB.QueryRowContext(ctx, "SELECT MAX(queued_at) FROM jobs").Scan(&admittedAt); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 10*time.Second, "two drainer passes after the admissions", func() (bool, error) {
		var n int
		err := env.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM drainers WHERE last_poll_at > ?", admittedAt.Add(1100*time.Millisecond)).Scan(&n)
		return n > 0, err
	})
	if c, err := env.CountJobs(ctx); err != nil || c["queued"] != 12 {
		t.Fatalf("while paused: jobs %v (%v), want 12 queued", c, err)
	}
	if st := env.Exec.Stats(); st.Received != 0 {
		t.Fatalf("executor received %d dispatches while global_in_flight was 0", st.Received)
	}

	// Unpause with a cap of 3: the drainer uses it within one re-read period (here at once).
	changed := time.Now()
	if r := env.Do(t, http.MethodPatch, "/v1/config", harness.AdminToken, map[string]any{
		"changes": map[string]any{"global_in_flight": 3}, "note": "resume at 3"}); r.Status != http.StatusOK {
		t.Fatalf("resume: HTTP %d %s", r.Status, r.Raw)
	}
	harness.WaitFor(t, config.ReloadEvery+2*time.Second, "the first dispatch after the change", func() (bool, error) {
		return env.Exec.Stats().Received > 0, nil
	})
	t.Logf("first dispatch %s after the change", time.Since(changed))
	harness.WaitFor(t, 30*time.Second, "all 12 jobs to succeed", func() (bool, error) {
		c, err := env.CountJobs(ctx)
		return c["succeeded"] == 12, err
	})
	if st := env.Exec.Stats(); st.MaxInFlight != 3 {
		t.Errorf("executor saw at most %d jobs at once, want exactly the new cap 3", st.MaxInFlight)
	}

	// Another process's change (written straight into the table, as a second sluice would)
	// reaches this process's admission cache within one re-read period.
	if _, _, err := limitsPatchDirect(ctx, env, map[string]any{"max_payload_bytes": 100}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	big := strings.Repeat("x", 200)
	harness.WaitFor(t, config.ReloadEvery+2*time.Second, "admission to apply max_payload_bytes=100", func() (bool, error) {
		code, _, err := apiDo(ctx, env.HTTP, http.MethodPost, env.URL+"/v1/jobs", harness.ProducerToken,
			map[string]any{"tenant": "acme", "payload": map[string]any{"pad": big}})
		if err != nil {
			return false, err
		}
		if code != http.StatusAccepted && code != http.StatusRequestEntityTooLarge {
			return false, fmt.Errorf("HTTP %d", code)
		}
		return code == http.StatusRequestEntityTooLarge, nil
	})
	t.Logf("admission applied another process's change after %s", time.Since(start))
}

// limitsPatchDirect changes the config the way another sluice process would: through
// config.Patch on its own connection, bypassing this process's API (and so its cache).
func limitsPatchDirect(ctx context.Context, env *opsEnv, changes map[string]any) (config.Versioned, config.Change, error) {
	raw := map[string]json.RawMessage{}
	for k, v := range changes {
		b, err := json.Marshal(v)
		if err != nil {
			return config.Versioned{}, config.Change{}, err
		}
		raw[k] = b
	}
	return config.Patch(ctx, env.DB.DB, nil, "other-process", raw, "from another process")
}

// TestOpsConfigHistoryPages: GET /v1/config/history answers a page of changes, newest first (50
// by default, at most 1,000), and next_cursor leads through every change, each still diffed
// against its predecessor across page ends (issue 30, finding 12d: it read every version in one
// request). A limit out of range or a cursor it never gave is a 400 naming the parameter.
func TestOpsConfigHistoryPages(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	const changes = 130
	for i := 1; i <= changes; i++ {
		f.SetConfig(t, map[string]any{"tenant_queue_depth": 1000 + i})
	}
	page := func(query string) ([]any, string) {
		t.Helper()
		r := f.Do(t, http.MethodGet, "/v1/config/history"+query, apitest.AdminToken, nil)
		if r.Status != http.StatusOK {
			t.Fatalf("history%s: HTTP %d %s", query, r.Status, r.Raw)
		}
		next, _ := r.Body["next_cursor"].(string)
		if _, ok := r.Body["next_cursor"]; !ok {
			t.Fatalf("history%s: no next_cursor in %.200s", query, r.Raw)
		}
		return r.Body["history"].([]any), next
	}
	first, next := page("")
	if len(first) != 50 || next == "" {
		t.Fatalf("the first page: %d entries, cursor %q; want the default 50 and a cursor", len(first), next)
	}
	all := first
	for pages := 1; next != ""; pages++ {
		if pages > 3 {
			t.Fatalf("more than 3 pages of 50 for %d changes", changes)
		}
		var h []any
		h, next = page("?limit=50&cursor=" + url.QueryEscape(next))
		all = append(all, h...)
	}
	if len(all) != changes {
		t.Fatalf("the pages hold %d changes, want all %d", len(all), changes)
	}
	for i, e := range all {
		c := e.(map[string]any)
		v := changes - i
		old := 500.0 // version 1's predecessor is the defaults
		if v > 1 {
			old = float64(1000 + v - 1)
		}
		if c["version"] != float64(v) || c["old"].(map[string]any)["tenant_queue_depth"] != old ||
			c["new"].(map[string]any)["tenant_queue_depth"] != float64(1000+v) {
			t.Errorf("entry %d: %v, want version %d changed from %v to %d", i, c, v, old, 1000+v)
		}
	}
	if h, next := page("?limit=1000"); len(h) != changes || next != "" {
		t.Errorf("history?limit=1000: %d entries, cursor %q; want all %d and none", len(h), next, changes)
	}
	for _, bad := range []struct{ query, field string }{
		{"?limit=0", "limit"}, {"?limit=1001", "limit"}, {"?limit=x", "limit"},
		{"?cursor=zz", "cursor"}, {"?cursor=" + base64.RawURLEncoding.EncodeToString([]byte("before:0")), "cursor"},
	} {
		if r := f.Do(t, http.MethodGet, "/v1/config/history"+bad.query, apitest.AdminToken, nil); r.Status != 400 || r.Body["field"] != bad.field {
			t.Errorf("history%s: HTTP %d %s, want 400 naming %s", bad.query, r.Status, r.Raw, bad.field)
		}
	}
}
