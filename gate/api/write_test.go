package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/job"
)

// TestWritersMatchWriteJSON holds writeJob and writeBatch to writeJSON's answer, byte for byte:
// they write what it wrote, without encoding/json's second pass over each job.
func TestWritersMatchWriteJSON(t *testing.T) {
	at := time.Date(2026, 12, 7, 23, 40, 0, 5000, time.UTC)
	pos, msg := int64(3), "<not> & \"done\""
	ok := job.Job{ID: 12, Tenant: "acme & co", Status: job.Succeeded, Position: &pos, QueuedAt: at, FinishedAt: &at,
		ErrorMessage: &msg, Result: json.RawMessage(` {"a": "<b>"} `), Lanes: []string{"gpu"}}
	bad := job.Job{ID: 13, Result: json.RawMessage(`{"open":`)}
	answer := func(write func(http.ResponseWriter)) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		write(rec)
		return rec
	}
	same := func(name string, got, want *httptest.ResponseRecorder) {
		t.Helper()
		if got.Code != want.Code || got.Header().Get("Content-Type") != want.Header().Get("Content-Type") ||
			got.Body.String() != want.Body.String() {
			t.Errorf("%s: got %d %q %q\nwant %d %q %q", name, got.Code, got.Header().Get("Content-Type"), got.Body,
				want.Code, want.Header().Get("Content-Type"), want.Body)
		}
	}
	for name, j := range map[string]job.Job{"a job": ok, "an unencodable job": bad} {
		same(name, answer(func(w http.ResponseWriter) { writeJob(w, http.StatusAccepted, j) }),
			answer(func(w http.ResponseWriter) { writeJSON(w, http.StatusAccepted, j) }))
	}
	items := []job.BatchItem{{Status: 202, Decision: "admitted", Job: &ok},
		{Status: 429, Decision: "refused", Error: map[string]any{"error_code": job.CodeQueueFull, "message": "full"}}}
	for name, items := range map[string][]job.BatchItem{"a batch": items, "an empty batch": {},
		"a batch with an unencodable job": append(items, job.BatchItem{Status: 202, Job: &bad})} {
		same(name, answer(func(w http.ResponseWriter) { writeBatch(w, items) }),
			answer(func(w http.ResponseWriter) { writeJSON(w, http.StatusOK, map[string]any{"results": items}) }))
	}
}
