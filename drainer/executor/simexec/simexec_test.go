package simexec

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer/executor"
)

// TestCallsToAPI: which API calls a dispatch leads to. With starts confirmed, /start comes
// before the work; with UnconfirmedStarts, /start is skipped but an async job still reports
// through /complete.
func TestCallsToAPI(t *testing.T) {
	for _, tc := range []struct {
		name        string
		unconfirmed bool
		payload     string
		want        []string
	}{
		{"confirmed", false, `{}`, []string{"/v1/jobs/7/start"}},
		{"confirmed async", false, `{"async": true}`, []string{"/v1/jobs/7/start", "/v1/jobs/7/complete"}},
		{"unconfirmed", true, `{}`, nil},
		{"unconfirmed async", true, `{"async": true}`, []string{"/v1/jobs/7/complete"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var calls []string
			completed := make(chan struct{}, 1)
			api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Authorization") != "Bearer exec-token" {
					http.Error(w, "no token", http.StatusUnauthorized)
					return
				}
				mu.Lock()
				calls = append(calls, r.URL.Path)
				mu.Unlock()
				_, _ = w.Write([]byte("{}"))
				if strings.HasSuffix(r.URL.Path, "/complete") {
					completed <- struct{}{}
				}
			}))
			defer api.Close()
			s := New(Config{APIURL: api.URL, Token: "exec-token", UnconfirmedStarts: tc.unconfirmed})
			body, _ := json.Marshal(executor.Dispatch{JobID: 7, Tenant: "acme", Nonce: "n", Payload: json.RawMessage(tc.payload)})
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/dispatch", bytes.NewReader(body)))
			if rec.Code != http.StatusOK && rec.Code != http.StatusAccepted {
				t.Fatalf("dispatch: HTTP %d %s", rec.Code, rec.Body)
			}
			if rec.Code == http.StatusAccepted {
				select {
				case <-completed:
				case <-time.After(10 * time.Second):
					t.Error("no /complete within 10 s of an async dispatch")
				}
			}
			s.Close()
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(calls, tc.want) {
				t.Fatalf("API calls %q, want %q", calls, tc.want)
			}
		})
	}
}

// TestStartAnswerLost: a /start whose answer may have been lost (503 with retryable: true, as the
// API answers when the database is unreachable or a COMMIT's outcome is unknown) is asked again
// with the same nonce, and the job runs once; a refusal (409, or a 503 that is not retryable) is
// final and the job does not run.
func TestStartAnswerLost(t *testing.T) {
	for _, tc := range []struct {
		name    string
		answers []int // status codes of successive /start calls; the last repeats
		body    string
		runs    bool
		calls   int
	}{
		{"retryable 503 then 200", []int{503, 503, 200}, `{"error_code":"outcome_unknown","retryable":true}`, true, 3},
		{"409 is final", []int{409}, `{"error_code":"dispatch_void"}`, false, 1},
		{"503 not retryable is final", []int{503}, `{"error_code":"outcome_unknown","retryable":false}`, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var nonces []string
			api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var b struct{ Nonce string }
				_ = json.NewDecoder(r.Body).Decode(&b)
				mu.Lock()
				nonces = append(nonces, b.Nonce)
				code := tc.answers[min(len(nonces), len(tc.answers))-1]
				mu.Unlock()
				w.WriteHeader(code)
				if code == http.StatusOK {
					_, _ = w.Write([]byte(`{"status":"running"}`))
					return
				}
				_, _ = w.Write([]byte(tc.body))
			}))
			defer api.Close()
			s := New(Config{APIURL: api.URL, Token: "exec-token"})
			defer s.Close()
			body, _ := json.Marshal(executor.Dispatch{JobID: 7, Tenant: "acme", Nonce: "n7", Payload: json.RawMessage(`{}`)})
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/dispatch", bytes.NewReader(body)))
			if ran := rec.Code == http.StatusOK; ran != tc.runs {
				t.Fatalf("dispatch answered HTTP %d %s; want the job run: %v", rec.Code, rec.Body, tc.runs)
			}
			if got := s.Stats().Starts["7"]; got != map[bool]int{true: 1}[tc.runs] {
				t.Fatalf("job 7 started %d times", got)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(nonces) != tc.calls {
				t.Fatalf("%d /start calls, want %d", len(nonces), tc.calls)
			}
			for _, n := range nonces {
				if n != "n7" {
					t.Fatalf("a /start carried nonce %q, want the dispatch's n7 every time", n)
				}
			}
		})
	}
}
