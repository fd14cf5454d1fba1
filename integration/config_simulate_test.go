package integration_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/api"
	"github.com/sluicehq/sluice/integration/harness"
)

// TestConfigSimulateAPI covers POST /v1/config/simulate against a running sluice: the jobs that
// went through in the last minutes, replayed from the audit trail, all start under the
// configuration in force and none with dispatch paused (global_in_flight 0), side by side with
// the table; an unknown key and a bad since are 400 naming the field, a window in which nothing
// arrived is 404, and the endpoint is an admin's. Nothing is changed: the config stays at
// version 0.
func TestConfigSimulateAPI(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{})
	for i := range 9 {
		env.Admit(t, []string{"acme", "acme", "globex"}[i%3], map[string]any{"sleep_ms": 20})
	}
	harness.WaitFor(t, 30*time.Second, "the 9 jobs to finish", func() (bool, error) {
		n, err := env.CountJobs(context.Background())
		return n["succeeded"] == 9, err
	})

	r := env.Do(t, http.MethodPost, "/v1/config/simulate", harness.AdminToken,
		map[string]any{"changes": map[string]any{"global_in_flight": 0}, "since": "15m"})
	if r.Status != http.StatusOK {
		t.Fatalf("simulate: HTTP %d %s", r.Status, r.Raw)
	}
	spec, err := api.ParseSpec(api.OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.CheckAnswer(http.MethodPost, "/v1/config/simulate", r.Status, r.Raw); err != nil {
		t.Errorf("%v\n%s", err, r.Raw)
	}
	total := func(side string) map[string]any {
		res, _ := r.Body[side].(map[string]any)
		tot, _ := res["total"].(map[string]any)
		return tot
	}
	cur, ch := total("current"), total("changed")
	if cur["arrivals"] != 9.0 || cur["started"] != 9.0 || cur["never_started"] != 0.0 {
		t.Errorf("current: %v, want the 9 arrivals all started", cur)
	}
	if ch["arrivals"] != 9.0 || ch["started"] != 0.0 || ch["never_started"] != 9.0 {
		t.Errorf("changed (global_in_flight 0): %v, want the 9 arrivals never started", ch)
	}
	acme, _ := r.Body["current"].(map[string]any)["tenants"].(map[string]any)["acme"].(map[string]any)
	if acme["arrivals"] != 6.0 {
		t.Errorf("current acme: %v, want 6 arrivals", acme)
	}
	table, _ := r.Body["table"].(string)
	if !strings.Contains(table, "replayed 9 job arrivals") || !strings.Contains(table, "changes: global_in_flight=0") ||
		!strings.Contains(table, "never started: 0 → 9") {
		t.Errorf("table:\n%s", table)
	}
	since, err1 := time.Parse(time.RFC3339Nano, fmt.Sprint(r.Body["since"]))
	until, err2 := time.Parse(time.RFC3339Nano, fmt.Sprint(r.Body["until"]))
	if err1 != nil || err2 != nil || until.Sub(since) != 15*time.Minute {
		t.Errorf("window %v to %v, want 15 minutes", r.Body["since"], r.Body["until"])
	}

	for _, c := range []struct {
		token string
		body  map[string]any
		want  int
		code  string
		field string
	}{
		{harness.AdminToken, map[string]any{"changes": map[string]any{"no_such_key": 1}}, http.StatusBadRequest, "invalid_request", "no_such_key"},
		{harness.AdminToken, map[string]any{"changes": map[string]any{"ordering": "lifo"}}, http.StatusBadRequest, "invalid_request", "ordering"},
		{harness.AdminToken, map[string]any{"changes": map[string]any{"global_in_flight": 8}, "since": "last tuesday"}, http.StatusBadRequest, "invalid_request", "since"},
		{harness.AdminToken, map[string]any{"since": "48h"}, http.StatusBadRequest, "invalid_request", "since"},
		// Before the test's database existed: nothing arrived.
		{harness.AdminToken, map[string]any{"changes": map[string]any{"global_in_flight": 8}, "since": "3h", "until": "2h"}, http.StatusNotFound, "not_found", ""},
		{"", map[string]any{"changes": map[string]any{"global_in_flight": 8}}, http.StatusUnauthorized, "unauthorized", ""},
		{harness.ProducerToken, map[string]any{"changes": map[string]any{"global_in_flight": 8}}, http.StatusForbidden, "forbidden", ""},
		{harness.ExecutorToken, map[string]any{"changes": map[string]any{"global_in_flight": 8}}, http.StatusForbidden, "forbidden", ""},
	} {
		r := env.Do(t, http.MethodPost, "/v1/config/simulate", c.token, c.body)
		field, _ := r.Body["field"].(string)
		msg, _ := r.Body["message"].(string)
		if r.Status != c.want || r.Body["error_code"] != c.code || field != c.field || !strings.Contains(msg, c.field) {
			t.Errorf("simulate %v as %q: HTTP %d %s, want %d %s naming %q", c.body, c.token, r.Status, r.Raw, c.want, c.code, c.field)
		}
	}

	if r := env.Do(t, http.MethodGet, "/v1/config", harness.AdminToken, nil); r.Status != http.StatusOK || r.Body["version"] != 0.0 {
		t.Errorf("after simulating, GET /v1/config: HTTP %d %s, want version 0 still", r.Status, r.Raw)
	}
}
