package integration_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/harness"
)

// TestPayloadCapFitsTheDatabase: max_payload_bytes may be raised only as far as the database
// can store (config.MaxPayloadCap), and at the cap the worst payload for the statement's size,
// a JSON string of escaped quotes that doubles when the statement escapes it, is stored: alone,
// in a batch, and as an executor's result. The old cap, 16 MiB, was admitted by the
// configuration, and its payloads made the server drop the connection (larger than
// max_allowed_packet): the admission answered 500, or 503 outcome_unknown.
func TestPayloadCapFitsTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := harness.Start(t, harness.Options{API: true})
	patch := func(n int) harness.Response {
		return env.Do(t, http.MethodPatch, "/v1/config", harness.AdminToken,
			map[string]any{"changes": map[string]any{"max_payload_bytes": n}})
	}
	if r := patch(config.MaxPayloadCap + 1); r.Status != http.StatusBadRequest || r.Body["field"] != "max_payload_bytes" {
		t.Fatalf("max_payload_bytes above the cap: HTTP %d %s, want 400 naming the field", r.Status, r.Raw)
	}
	if r := patch(config.MaxPayloadCap); r.Status != http.StatusOK {
		t.Fatalf("max_payload_bytes at the cap: HTTP %d %s", r.Status, r.Raw)
	}
	worst := `"` + strings.Repeat(`\"`, (config.MaxPayloadCap-2)/2) + `"`
	stored := func(what string, id int64, column string) {
		t.Helper()
		var n int
		if err := env.DB.QueryRowContext(ctx, "SELECT LENGTH("+column+") FROM jobs WHERE id = ?", id).Scan(&n); err != nil || n != len(worst) {
			t.Errorf("%s: %s of %d bytes stored, %v; want %d", what, column, n, err, len(worst))
		}
	}
	r := env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, []byte(`{"tenant":"big","payload":`+worst+`}`))
	if r.Status != http.StatusAccepted {
		t.Fatalf("admit a payload at the cap: HTTP %d %s", r.Status, r.Raw)
	}
	stored("single admission", int64(r.Body["id"].(float64)), "payload")
	r = env.Do(t, http.MethodPost, "/v1/jobs:batch", harness.ProducerToken,
		[]byte(`{"jobs":[{"tenant":"big"},{"tenant":"big","payload":`+worst+`}]}`))
	if r.Status != http.StatusOK {
		t.Fatalf("batch with a payload at the cap: HTTP %d %s", r.Status, r.Raw)
	}
	item := r.Body["results"].([]any)[1].(map[string]any)
	if item["status"] != float64(http.StatusAccepted) {
		t.Fatalf("batch item with a payload at the cap: %v", item)
	}
	stored("batch", int64(item["job"].(map[string]any)["id"].(float64)), "payload")

	res, err := env.DB.ExecContext(ctx, `INSERT INTO jobs (tenant, status, version, attempt, queued_at, claimed_at,
		dispatched_at, lease_until, drainer_id, nonce_sha256, nonce_expires_at)
		VALUES ('big', 'dispatched', 1, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
		UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, 'd', ?, UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)`, store.HashNonce("n-big"))
	if err != nil {
		t.Fatal(err)
	}
	id, _ := res.LastInsertId()
	r = env.Do(t, http.MethodPost, fmt.Sprintf("/v1/jobs/%d/complete", id), harness.ExecutorToken,
		[]byte(`{"nonce":"n-big","status":"succeeded","result":`+worst+`}`))
	if r.Status != http.StatusOK {
		t.Fatalf("complete with a result at the cap: HTTP %d %s", r.Status, r.Raw)
	}
	stored("result", id, "result")
}
