package api_test

import (
	"context"
	"net/http"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/integration/apitest"
	"github.com/sluicehq/sluice/integration/harness"
)

// TestFrontDoorLanes: an admission's lanes must be configured lanes (else 400 naming `lanes`,
// nothing written, in a batch too); they are stored sorted and without repeats with the
// interactive flag, shown on every read of the job ([] when none), and part of the request an
// idempotency key replays.
func TestFrontDoorLanes(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	f.SetConfig(t, map[string]any{"lanes": map[string]any{"gpu": 2, "search": 3}})

	before := f.RowCounts(t)
	for _, body := range []map[string]any{
		{"tenant": "acme", "lanes": []string{"gpu", "nope"}},
		{"tenant": "acme", "lanes": []string{""}},
		{"tenant": "acme", "lanes": []string{"a", "b", "c", "d", "e", "f", "g", "h", "i"}},
		{"tenant": "acme", "lanes": "gpu"},
	} {
		r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, body)
		if r.Status != 400 || r.Body["error_code"] != "invalid_request" || r.Body["field"] != "lanes" {
			t.Errorf("%v: HTTP %d %s, want 400 invalid_request naming lanes", body, r.Status, r.Raw)
		}
	}
	r := f.Do(t, http.MethodPost, "/v1/jobs:batch", apitest.StarToken, map[string]any{"jobs": []any{
		map[string]any{"tenant": "acme", "lanes": []string{"nope"}}}})
	if item := r.Body["results"].([]any)[0].(map[string]any); item["status"] != float64(400) {
		t.Errorf("batch item with an unknown lane: %v", item)
	}
	if after := f.RowCounts(t); after != before {
		t.Fatalf("refused admissions wrote rows: %v → %v", before, after)
	}

	r = f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": "acme",
		"lanes": []string{"search", "gpu", "search"}, "interactive": true, "idempotency_key": "k1"})
	if r.Status != 202 {
		t.Fatalf("admit: HTTP %d %s", r.Status, r.Raw)
	}
	id := apitest.JobID(t, r.Body)
	want := []any{"gpu", "search"}
	if !reflect.DeepEqual(r.Body["lanes"], want) || r.Body["interactive"] != true {
		t.Errorf("admitted job: lanes %v interactive %v, want %v true", r.Body["lanes"], r.Body["interactive"], want)
	}
	var lanes string
	var interactive bool
	if err := f.DB.QueryRowContext(context.Background(), "SELECT lanes, interactive FROM jobs WHERE id = ?", id).Scan(&lanes, &interactive); err != nil {
		t.Fatal(err)
	}
	if lanes != "gpu,search" || !interactive {
		t.Errorf("stored lanes %q interactive %v", lanes, interactive)
	}
	got := f.Do(t, http.MethodGet, "/v1/jobs/"+strconv.FormatInt(id, 10), apitest.StarToken, nil)
	if !reflect.DeepEqual(got.Body["lanes"], want) || got.Body["interactive"] != true {
		t.Errorf("GET: %s", got.Raw)
	}
	list := f.Do(t, http.MethodGet, "/v1/jobs?tenant=acme", apitest.StarToken, nil)
	if j := list.Body["jobs"].([]any)[0].(map[string]any); !reflect.DeepEqual(j["lanes"], want) || j["interactive"] != true {
		t.Errorf("list: %s", list.Raw)
	}

	// The same request (lanes in another order, repeated) replays; other lanes or another
	// interactive flag is a different request.
	same := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": "acme",
		"lanes": []string{"gpu", "search"}, "interactive": true, "idempotency_key": "k1"})
	if same.Status != 200 || same.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: HTTP %d %s", same.Status, same.Raw)
	}
	for _, body := range []map[string]any{
		{"tenant": "acme", "lanes": []string{"gpu"}, "interactive": true, "idempotency_key": "k1"},
		{"tenant": "acme", "lanes": []string{"gpu", "search"}, "idempotency_key": "k1"},
	} {
		if r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, body); r.Status != 409 || r.Body["error_code"] != "idempotency_conflict" {
			t.Errorf("%v: HTTP %d %s, want 409 idempotency_conflict", body, r.Status, r.Raw)
		}
	}

	plain := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": "acme"})
	if l, ok := plain.Body["lanes"].([]any); !ok || len(l) != 0 || plain.Body["interactive"] != false {
		t.Errorf("a job without lanes: %s", plain.Raw)
	}
}

// TestFrontDoorImmediateCapacity: queue=false is decided by every limit of SPEC §5a over what is
// in flight: a full lane, a paused lane, the tenant's cap, its tier's ceiling, the interactive
// reserve (which an interactive job may take) and the global cap each refuse with their scope
// and Retry-After, write nothing, and say so in the headers; with enforce_for=aware only a
// request carrying Sluice-Capacity-Aware: true is refused, others are admitted as in shadow.
// Every admission answer carries the §5a headers with the fullest scope's figures.
func TestFrontDoorImmediateCapacity(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	f.SetConfig(t, map[string]any{"global_in_flight": 5, "tenant_in_flight": 2,
		"lanes":        map[string]any{"gpu": 1, "off": 0},
		"tenant_tiers": map[string]any{"g1": "gold", "g2": "gold"}, "tier_in_flight": map[string]any{"gold": 1},
		"tenant_in_flight_overrides": map[string]any{"t2": 1}, "interactive_reserve": 1})
	running := func(tenant, lanes string, interactive bool) {
		t.Helper()
		f.FillQueued(t, tenant, 1, "running")
		if _, err := f.DB.ExecContext(context.Background(), "UPDATE jobs SET lanes = ?, interactive = ? WHERE id = LAST_INSERT_ID()", lanes, interactive); err != nil {
			t.Fatal(err)
		}
	}
	immediate := func(tenant string, extra map[string]any) map[string]any {
		b := map[string]any{"tenant": tenant, "queue": false}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	refused := func(name string, body map[string]any, aware bool, scope string, retry int, paused bool) {
		t.Helper()
		before := f.RowCounts(t)
		e := &harness.Env{URL: f.URL, HTTP: &http.Client{Timeout: 30 * time.Second}}
		h := http.Header{}
		if aware {
			h.Set("Sluice-Capacity-Aware", "true")
		}
		r := e.DoHeader(t, http.MethodPost, "/v1/jobs", apitest.StarToken, body, h)
		if r.Status != 429 || r.Body["error_code"] != "capacity_exceeded" || r.Body["scope"] != scope ||
			r.Body["retry_after"] != float64(retry) || r.Body["paused"] != paused || r.Header.Get("Retry-After") != strconv.Itoa(retry) ||
			r.Header.Get("Sluice-Capacity-Decision") != "refused" || r.Header.Get("Sluice-Capacity-Scope") != scope {
			t.Errorf("%s: HTTP %d %s, Retry-After %q, headers %v; want 429 scope %s retry %d paused %v",
				name, r.Status, r.Raw, r.Header.Get("Retry-After"), r.Header, scope, retry, paused)
		}
		if after := f.RowCounts(t); after != before {
			t.Errorf("%s: refusal wrote rows: %v → %v", name, before, after)
		}
	}

	running("x", "gpu", false)
	// The headers of an admission: the fullest scope is the tenant's (2 of room, the global 4,
	// what the reserve leaves 3); the default tier has no ceiling of its own (the global cap).
	r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": "fresh"})
	for h, want := range map[string]string{"Sluice-Capacity-Decision": "admitted", "Sluice-Capacity-Scope": "tenant",
		"Sluice-Capacity-Limit": "2", "Sluice-Capacity-In-Flight": "0", "Sluice-Capacity-Tier": "default",
		"Sluice-Capacity-Tier-Limit": "5", "Sluice-Capacity-Tier-In-Flight": "1",
		"Sluice-Capacity-Suggested-Concurrency": "2", "Sluice-Queue-Position": "1"} {
		if got := r.Header.Get(h); got != want {
			t.Errorf("admission header %s = %q, want %q", h, got, want)
		}
	}
	// One job queued overall (fresh's): scopes other than the tenant's wait 5 × (1 + 1) s.
	refused("lane full", immediate("acme", map[string]any{"lanes": []string{"gpu"}}), false, "lane:gpu", 10, false)
	refused("lane paused", immediate("acme", map[string]any{"lanes": []string{"off"}}), false, "lane:off", 120, true)
	running("t2", "", false)
	refused("tenant at its cap", immediate("t2", nil), false, "tenant", 5, false)
	running("g2", "", false)
	refused("tier at its ceiling", immediate("g1", nil), false, "tier", 10, false)
	running("y", "", false) // 4 plain jobs in flight: all the reserve leaves
	refused("the reserve", immediate("acme", nil), false, "reserve", 10, false)
	r = f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, immediate("acme", map[string]any{"interactive": true}))
	if r.Status != 202 || r.Header.Get("Sluice-Capacity-Decision") != "admitted" {
		t.Errorf("an interactive job in the reserve: HTTP %d %s", r.Status, r.Raw)
	}
	running("z", "", true) // the reserve taken: the box is full; 2 queued (fresh, acme)
	refused("global cap", immediate("other", map[string]any{"interactive": true}), false, "global", 15, false)

	// aware: refused only when the request says it handles a refusal.
	f.SetConfig(t, map[string]any{"enforce_for": "aware"})
	refused("aware request", immediate("other", nil), true, "global", 15, false)
	r = f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, immediate("other", nil))
	if r.Status != 202 || r.Header.Get("Sluice-Capacity-Decision") != "shadow-refused" || r.Header.Get("Sluice-Capacity-Scope") != "global" {
		t.Errorf("a request not aware under enforce_for=aware: HTTP %d %v, want 202 shadow-refused scope global", r.Status, r.Header)
	}
	f.SetConfig(t, map[string]any{"enforce_for": "all", "global_in_flight": 0})
	refused("paused", immediate("other2", nil), false, "global", 120, true)
	if r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": "q"}); r.Header.Get("Sluice-Capacity-Suggested-Concurrency") != "0" {
		t.Errorf("suggested concurrency while paused: %q, want 0", r.Header.Get("Sluice-Capacity-Suggested-Concurrency"))
	}
	f.SetConfig(t, map[string]any{"admission_mode": "off"})
	if r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": "q"}); r.Header.Get("Sluice-Capacity-Scope") != "" || r.Header.Get("Sluice-Capacity-Decision") != "" {
		t.Errorf("headers with the rollout mode off: %v", r.Header)
	}
}
