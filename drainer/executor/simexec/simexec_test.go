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
