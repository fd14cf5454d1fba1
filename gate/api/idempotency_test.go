package api_test

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/integration/apitest"
)

// TestFrontDoorIdempotency: a replay by the same caller with the same request answers 200 with
// the job as it is now; a different request is 409; another caller gets 403 without the job's
// identity; 50 racing duplicates make exactly one job; a rejected admission leaves its key free.
func TestFrontDoorIdempotency(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	ctx := context.Background()
	req := map[string]any{"tenant": "acme", "payload": map[string]any{"a": 1, "b": 2}, "idempotency_key": "order-17"}

	first := f.Do(t, http.MethodPost, "/v1/jobs", apitest.AlphaToken, req)
	if first.Status != 202 {
		t.Fatalf("first: %d %s", first.Status, first.Raw)
	}
	id := apitest.JobID(t, first.Body)
	// Same request, key order and whitespace in the payload do not matter.
	again := f.Do(t, http.MethodPost, "/v1/jobs", apitest.AlphaToken,
		[]byte(`{"idempotency_key":"order-17","payload":{"a": 1,   "b": 2},"tenant":"acme"}`))
	if again.Status != 200 || again.Header.Get("Idempotent-Replayed") != "true" || apitest.JobID(t, again.Body) != id {
		t.Errorf("replay: %d %v %s, want 200, Idempotent-Replayed: true, id %d", again.Status, again.Header, again.Raw, id)
	}
	if again.Body["position"] != float64(1) {
		t.Errorf("replay of a queued job: position %v, want 1", again.Body["position"])
	}
	// It answers like the admission it repeats, capacity headers included (SPEC §5).
	for h, want := range map[string]string{"Sluice-Capacity-Decision": "admitted", "Sluice-Capacity-Limit": "2",
		"Sluice-Capacity-In-Flight": "0", "Sluice-Queue-Position": "1"} {
		if got := again.Header.Get(h); got != want {
			t.Errorf("replay: %s %q, want %q", h, got, want)
		}
	}
	// The job as it is now: after a cancel the replay shows canceled.
	if _, err := f.Alpha.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	again = f.Do(t, http.MethodPost, "/v1/jobs", apitest.AlphaToken, req)
	if again.Status != 200 || again.Body["status"] != "canceled" {
		t.Errorf("replay after cancel: %d %s, want 200 canceled", again.Status, again.Raw)
	}
	before := f.RowCounts(t)
	diff := map[string]any{"tenant": "acme", "payload": map[string]any{"a": 2}, "idempotency_key": "order-17"}
	if r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.AlphaToken, diff); r.Status != 409 || r.Body["error_code"] != "idempotency_conflict" {
		t.Errorf("different request: %d %s, want 409 idempotency_conflict", r.Status, r.Raw)
	}
	for _, q := range []bool{false} {
		d := map[string]any{"tenant": "acme", "payload": map[string]any{"a": 1, "b": 2}, "idempotency_key": "order-17", "queue": q}
		if r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.AlphaToken, d); r.Status != 409 {
			t.Errorf("same payload, queue=%v: %d, want 409", q, r.Status)
		}
	}
	other := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, req)
	if other.Status != 403 || other.Body["error_code"] != "forbidden" {
		t.Errorf("another caller: %d %s, want 403 forbidden", other.Status, other.Raw)
	}
	if _, ok := other.Body["id"]; ok || other.Header.Get("Location") != "" {
		t.Errorf("another caller learned the job's identity: %s %v", other.Raw, other.Header)
	}
	if after := f.RowCounts(t); after != before {
		t.Errorf("conflicting replays wrote rows: %v → %v", before, after)
	}

	// 50 goroutines race one key: exactly one job, one 202 and 49 replays of it.
	var wg sync.WaitGroup
	statuses := make([]int, 50)
	ids := make([]int64, 50)
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j, r, err := f.Alpha.Admit(ctx, client.AdmitRequest{Tenant: "globex", Payload: map[string]int{"x": 1}, IdempotencyKey: "race"})
			if err != nil {
				t.Errorf("racer %d: %v", i, err)
				return
			}
			statuses[i], ids[i] = r.HTTPStatus, j.ID
		}()
	}
	wg.Wait()
	created := 0
	for i := range 50 {
		if statuses[i] == 202 {
			created++
		}
		if ids[i] != ids[0] {
			t.Errorf("racer %d got job %d, racer 0 job %d", i, ids[i], ids[0])
		}
	}
	var n int
	if err := f.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE tenant = 'globex'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if created != 1 || n != 1 {
		t.Errorf("50 racers: %d answered 202, %d rows; want exactly one job", created, n)
	}

	// A rejected admission does not consume its key.
	f.SetConfig(t, map[string]any{"tenant_queue_depth": 1})
	blocker, _, err := f.Beta.Admit(ctx, client.AdmitRequest{Tenant: "initech"})
	if err != nil {
		t.Fatal(err)
	}
	kreq := client.AdmitRequest{Tenant: "initech", IdempotencyKey: "retry-me", Payload: "p"}
	if _, _, err := f.Beta.Admit(ctx, kreq); client.Code(err) != "queue_full" {
		t.Fatalf("admission at depth: %v, want queue_full", err)
	}
	if _, err := f.Beta.Cancel(ctx, blocker.ID); err != nil {
		t.Fatal(err)
	}
	j, r, err := f.Beta.Admit(ctx, kreq)
	if err != nil || r.HTTPStatus != 202 {
		t.Fatalf("retry of the rejected key: %v %v, want 202", r.HTTPStatus, err)
	}
	if got := f.Do(t, http.MethodGet, "/v1/jobs/"+strconv.FormatInt(j.ID, 10), apitest.BetaToken, nil); got.Body["status"] != "queued" {
		t.Errorf("the retried job: %s", got.Raw)
	}
}
