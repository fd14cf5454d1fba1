package integration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/integration/harness"
)

// TestOpsLogsHaveNoSecrets drives admissions with rate keys, starts and completions with nonces,
// refused tokens, a bad nonce and a config change through a sluice logging at debug level, then
// greps the captured log: no token, raw rate key or nonce may appear (SPEC §2, §10), and every
// line is JSON with one line per job transition.
func TestOpsLogsHaveNoSecrets(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var nonces []string
	env := startOps(t, opsOptions{WrapExec: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			var d struct {
				Nonce string `json:"nonce"`
			}
			if json.Unmarshal(body, &d) == nil && d.Nonce != "" {
				mu.Lock()
				nonces = append(nonces, d.Nonce)
				mu.Unlock()
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			h.ServeHTTP(w, r)
		})
	}})
	ctx := context.Background()
	rateKeys := []string{"sk_live_RAWRATEKEY_one", "sk_live_RAWRATEKEY_two"}
	var job string // the first job's path: a succeeded job
	for i := 0; i < 6; i++ {
		r := env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, map[string]any{"tenant": "acme",
			"rate_key": rateKeys[i%2], "idempotency_key": "idem-" + rateKeys[i%2][:7] + string(rune('a'+i)), "payload": map[string]any{"sleep_ms": 5}})
		if r.Status != http.StatusAccepted {
			t.Fatalf("admit: HTTP %d %s", r.Status, r.Raw)
		}
		if i == 0 {
			var j struct{ ID int64 }
			if err := json.Unmarshal(r.Raw, &j); err != nil || j.ID == 0 {
				t.Fatalf("admit: %s: %v", r.Raw, err)
			}
			job = "/v1/jobs/" + strconv.FormatInt(j.ID, 10)
		}
	}
	env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, map[string]any{"tenant": "acme", "rate_key": rateKeys[0],
		"payload": map[string]any{"retry_after": 30}})
	harness.WaitFor(t, 20*time.Second, "6 jobs to succeed and the 429 to requeue", func() (bool, error) {
		c, err := env.CountJobs(ctx)
		return c["succeeded"] == 6 && c["queued"] == 1 && env.Exec.Stats().Received >= 7, err
	})
	const wrongToken = "wrong-token-NOTASECRET-but-must-not-show"
	env.Do(t, http.MethodGet, job, wrongToken, nil)
	env.Do(t, http.MethodGet, "/v1/status", harness.ProducerToken, nil)
	const badNonce = "bogus-nonce-value-that-must-not-show"
	if r := env.Do(t, http.MethodPost, job+"/start", harness.ExecutorToken, map[string]any{"nonce": badNonce}); r.Status != http.StatusConflict {
		t.Errorf("start with a bad nonce: HTTP %d %s, want 409", r.Status, r.Raw)
	}
	env.Do(t, http.MethodPost, job+"/complete", harness.ExecutorToken, map[string]any{"nonce": badNonce, "status": "succeeded"})
	env.Do(t, http.MethodPatch, "/v1/config", harness.AdminToken, map[string]any{"changes": map[string]any{"global_in_flight": 5}, "note": "log test"})
	env.Do(t, http.MethodPatch, "/v1/config", harness.AdminToken, map[string]any{"changes": map[string]any{"bogus": harness.AdminToken}})

	log := env.Log.String()
	mu.Lock()
	defer mu.Unlock()
	if len(nonces) < 7 {
		t.Fatalf("captured %d nonces, want at least 7", len(nonces))
	}
	secrets := append([]string{harness.ProducerToken, harness.ExecutorToken, harness.AdminToken, harness.Secret, wrongToken, badNonce}, rateKeys...)
	secrets = append(secrets, nonces...)
	for _, s := range secrets {
		if strings.Contains(log, s) {
			for _, line := range strings.Split(log, "\n") {
				if strings.Contains(line, s) {
					t.Errorf("the log contains a secret (%.12s...): %s", s, line)
					break
				}
			}
		}
	}
	transitions := 0
	for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Errorf("log line is not JSON: %s", line)
			continue
		}
		if m["msg"] == "job transition" {
			transitions++
			for _, k := range []string{"job_id", "tenant", "from", "to", "version"} {
				if _, ok := m[k]; !ok {
					t.Errorf("transition line lacks %s: %s", k, line)
				}
			}
		}
	}
	// Per succeeded job: admitted→queued, queued→dispatched, dispatched→running, running→succeeded.
	if transitions < 6*4 {
		t.Errorf("%d job transition lines, want at least %d", transitions, 6*4)
	}
}
