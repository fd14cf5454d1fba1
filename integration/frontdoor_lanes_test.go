package integration_test

import (
	"context"
	"net/http"
	"reflect"
	"strconv"
	"testing"
)

// TestFrontDoorLanes: an admission's lanes must be configured lanes (else 400 naming `lanes`,
// nothing written, in a batch too); they are stored sorted and without repeats with the
// interactive flag, shown on every read of the job ([] when none), and part of the request an
// idempotency key replays.
func TestFrontDoorLanes(t *testing.T) {
	t.Parallel()
	f := startFrontDoor(t, fdOptions{})
	f.setConfig(t, map[string]any{"lanes": map[string]any{"gpu": 2, "search": 3}})

	before := f.rowCounts(t)
	for _, body := range []map[string]any{
		{"tenant": "acme", "lanes": []string{"gpu", "nope"}},
		{"tenant": "acme", "lanes": []string{""}},
		{"tenant": "acme", "lanes": []string{"a", "b", "c", "d", "e", "f", "g", "h", "i"}},
		{"tenant": "acme", "lanes": "gpu"},
	} {
		r := f.do(t, http.MethodPost, "/v1/jobs", fdStarToken, body)
		if r.Status != 400 || r.Body["error_code"] != "invalid_request" || r.Body["field"] != "lanes" {
			t.Errorf("%v: HTTP %d %s, want 400 invalid_request naming lanes", body, r.Status, r.Raw)
		}
	}
	r := f.do(t, http.MethodPost, "/v1/jobs:batch", fdStarToken, map[string]any{"jobs": []any{
		map[string]any{"tenant": "acme", "lanes": []string{"nope"}}}})
	if item := r.Body["results"].([]any)[0].(map[string]any); item["status"] != float64(400) {
		t.Errorf("batch item with an unknown lane: %v", item)
	}
	if after := f.rowCounts(t); after != before {
		t.Fatalf("refused admissions wrote rows: %v → %v", before, after)
	}

	r = f.do(t, http.MethodPost, "/v1/jobs", fdStarToken, map[string]any{"tenant": "acme",
		"lanes": []string{"search", "gpu", "search"}, "interactive": true, "idempotency_key": "k1"})
	if r.Status != 202 {
		t.Fatalf("admit: HTTP %d %s", r.Status, r.Raw)
	}
	id := jobID(t, r.Body)
	want := []any{"gpu", "search"}
	if !reflect.DeepEqual(r.Body["lanes"], want) || r.Body["interactive"] != true {
		t.Errorf("admitted job: lanes %v interactive %v, want %v true", r.Body["lanes"], r.Body["interactive"], want)
	}
	var lanes string
	var interactive bool
	if err := f.db.QueryRowContext(context.Background(), "SELECT lanes, interactive FROM jobs WHERE id = ?", id).Scan(&lanes, &interactive); err != nil {
		t.Fatal(err)
	}
	if lanes != "gpu,search" || !interactive {
		t.Errorf("stored lanes %q interactive %v", lanes, interactive)
	}
	got := f.do(t, http.MethodGet, "/v1/jobs/"+strconv.FormatInt(id, 10), fdStarToken, nil)
	if !reflect.DeepEqual(got.Body["lanes"], want) || got.Body["interactive"] != true {
		t.Errorf("GET: %s", got.Raw)
	}
	list := f.do(t, http.MethodGet, "/v1/jobs?tenant=acme", fdStarToken, nil)
	if j := list.Body["jobs"].([]any)[0].(map[string]any); !reflect.DeepEqual(j["lanes"], want) || j["interactive"] != true {
		t.Errorf("list: %s", list.Raw)
	}

	// The same request (lanes in another order, repeated) replays; other lanes or another
	// interactive flag is a different request.
	same := f.do(t, http.MethodPost, "/v1/jobs", fdStarToken, map[string]any{"tenant": "acme",
		"lanes": []string{"gpu", "search"}, "interactive": true, "idempotency_key": "k1"})
	if same.Status != 200 || same.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: HTTP %d %s", same.Status, same.Raw)
	}
	for _, body := range []map[string]any{
		{"tenant": "acme", "lanes": []string{"gpu"}, "interactive": true, "idempotency_key": "k1"},
		{"tenant": "acme", "lanes": []string{"gpu", "search"}, "idempotency_key": "k1"},
	} {
		if r := f.do(t, http.MethodPost, "/v1/jobs", fdStarToken, body); r.Status != 409 || r.Body["error_code"] != "idempotency_conflict" {
			t.Errorf("%v: HTTP %d %s, want 409 idempotency_conflict", body, r.Status, r.Raw)
		}
	}

	plain := f.do(t, http.MethodPost, "/v1/jobs", fdStarToken, map[string]any{"tenant": "acme"})
	if l, ok := plain.Body["lanes"].([]any); !ok || len(l) != 0 || plain.Body["interactive"] != false {
		t.Errorf("a job without lanes: %s", plain.Raw)
	}
}
