package api_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/integration/apitest"
)

// TestFrontDoorValidation: every kind of bad input gets a clear 4xx naming the field and writes
// nothing; unknown fields are ignored; any JSON value is a payload; the raw rate key is stored
// and logged only as its SHA-256.
func TestFrontDoorValidation(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	big := strings.Repeat("x", 262144)
	cases := []struct {
		name   string
		body   []byte
		status int
		code   string
		field  string
	}{
		{"malformed JSON", []byte(`{"tenant": "acme",`), 400, "invalid_request", "body"},
		{"not an object", []byte(`[1,2]`), 400, "invalid_request", "body"},
		{"empty body", []byte(``), 400, "invalid_request", "body"},
		{"tenant missing", []byte(`{"payload": 1}`), 400, "invalid_request", "tenant"},
		{"tenant empty", []byte(`{"tenant": ""}`), 400, "invalid_request", "tenant"},
		{"tenant a number", []byte(`{"tenant": 42}`), 400, "invalid_request", "tenant"},
		{"tenant too long", []byte(`{"tenant": "` + strings.Repeat("t", 192) + `"}`), 400, "invalid_request", "tenant"},
		{"tenant control char", []byte(`{"tenant": "ac\u0007me"}`), 400, "invalid_request", "tenant"},
		{"tenant C1 control char", []byte(`{"tenant": "ac\u0085me"}`), 400, "invalid_request", "tenant"},
		{"tenant invalid UTF-8", []byte("{\"tenant\": \"ac\xffme\"}"), 400, "invalid_request", "tenant"},
		{"payload invalid UTF-8", []byte("{\"tenant\": \"acme\", \"payload\": {\"a\": \"\xc3\x28\"}}"), 400, "invalid_request", "payload"},
		{"rate_key a number", []byte(`{"tenant": "acme", "rate_key": 7}`), 400, "invalid_request", "rate_key"},
		{"rate_key too long", []byte(`{"tenant": "acme", "rate_key": "` + strings.Repeat("k", 1025) + `"}`), 400, "invalid_request", "rate_key"},
		{"rate_key empty", []byte(`{"tenant": "acme", "rate_key": ""}`), 400, "invalid_request", "rate_key"},
		{"queue a string", []byte(`{"tenant": "acme", "queue": "no"}`), 400, "invalid_request", "queue"},
		{"idempotency_key an object", []byte(`{"tenant": "acme", "idempotency_key": {}}`), 400, "invalid_request", "idempotency_key"},
		{"idempotency_key too long", []byte(`{"tenant": "acme", "idempotency_key": "` + strings.Repeat("i", 256) + `"}`), 400, "invalid_request", "idempotency_key"},
		{"payload too large", []byte(`{"tenant": "acme", "payload": "` + big + `"}`), 413, "payload_too_large", "payload"},
		{"body far too large", []byte(`{"tenant": "acme", "payload": "` + big + big + `"}`), 413, "payload_too_large", ""},
	}
	before := f.RowCounts(t)
	for _, c := range cases {
		r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, c.body)
		if r.Status != c.status || r.Body["error_code"] != c.code {
			t.Errorf("%s: HTTP %d %s, want %d %s", c.name, r.Status, r.Raw, c.status, c.code)
			continue
		}
		if c.field != "" && r.Body["field"] != c.field {
			t.Errorf("%s: field %v, want %q (%s)", c.name, r.Body["field"], c.field, r.Raw)
		}
		if msg, _ := r.Body["message"].(string); msg == "" {
			t.Errorf("%s: no message", c.name)
		}
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q", c.name, ct)
		}
	}
	// The same rules in a batch: each bad item refused with its field, the good one admitted.
	r := f.Do(t, http.MethodPost, "/v1/jobs:batch", apitest.StarToken, []byte("{\"jobs\": [{\"tenant\": 42}, {\"tenant\": \"a\xffb\"}, {\"queue\": 1, \"tenant\": \"acme\"}]}"))
	if r.Status != 200 {
		t.Fatalf("batch: HTTP %d %s", r.Status, r.Raw)
	}
	for i, want := range []string{"tenant", "tenant", "queue"} {
		item := r.Body["results"].([]any)[i].(map[string]any)
		e, _ := item["error"].(map[string]any)
		if item["status"] != float64(400) || e["field"] != want {
			t.Errorf("batch item %d: %v, want 400 naming %s", i, item, want)
		}
	}
	if after := f.RowCounts(t); after != before {
		t.Fatalf("refused requests wrote rows: %v → %v", before, after)
	}

	// The payload limit is runtime config.
	f.SetConfig(t, map[string]any{"max_payload_bytes": 100})
	if r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": "acme", "payload": strings.Repeat("p", 99)}); r.Status != 413 {
		t.Errorf("101-byte payload with max_payload_bytes 100: HTTP %d, want 413", r.Status)
	}
	if r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": "acme", "payload": strings.Repeat("p", 98)}); r.Status != 202 {
		t.Errorf("100-byte payload with max_payload_bytes 100: HTTP %d %s, want 202", r.Status, r.Raw)
	}
	f.SetConfig(t, map[string]any{"max_payload_bytes": 262144})

	// Accepted shapes: unknown fields ignored, any JSON value as payload, hostile tenant names.
	for _, body := range []string{
		`{"tenant": "acme", "surprise": {"deep": [1]}, "payload": {"a": 1}}`,
		`{"tenant": "acme", "payload": "just a string"}`,
		`{"tenant": "acme", "payload": 3.14}`,
		`{"tenant": "acme", "payload": [1, "two", null]}`,
		`{"tenant": "acme", "payload": null}`,
		`{"tenant": "acme"}`,
		`{"tenant": "a.b*c > d ü 日本"}`,
		`{"tenant": "` + strings.Repeat("é", 95) + `"}`, // 190 bytes
	} {
		if r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, []byte(body)); r.Status != 202 {
			t.Errorf("%s: HTTP %d %s, want 202", body, r.Status, r.Raw)
		}
	}

	// The rate key: stored as its SHA-256 hex, never raw, and never logged.
	raw := "sk_live_very-secret-api-key"
	r = f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": "acme", "rate_key": raw})
	if r.Status != 202 {
		t.Fatalf("admit with rate key: %d %s", r.Status, r.Raw)
	}
	sum := sha256.Sum256([]byte(raw))
	if r.Body["rate_key_sha256"] != hex.EncodeToString(sum[:]) {
		t.Errorf("rate_key_sha256 = %v, want %s", r.Body["rate_key_sha256"], hex.EncodeToString(sum[:]))
	}
	var n int
	if err := f.DB.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM jobs WHERE
		LOCATE(?, CONCAT_WS('|', tenant, rate_key_sha256, COALESCE(payload, ''), caller, COALESCE(idempotency_key, ''))) > 0`, raw).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 || strings.Contains(string(r.Raw), raw) || strings.Contains(f.Logs.String(), raw) {
		t.Errorf("the raw rate key is stored (%d rows), answered or logged", n)
	}
}
