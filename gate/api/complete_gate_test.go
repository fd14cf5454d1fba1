package api_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/gate/rategate"
	"github.com/sluicehq/sluice/integration/apitest"
	"github.com/sluicehq/sluice/integration/memcachedtest"
)

// TestCompleteGateNeedsTheDispatchNonce: the gate field of POST /v1/jobs/{id}/complete gates the
// job's rate key only when the report carries a nonce sluice sent with that job's dispatch
// (issue 30, finding 10). An executor token with a made-up nonce, on a dispatched job
// (nonce_invalid), on a queued one (dispatch_void) or on a missing id (not_found), gates nothing:
// it could otherwise stop any tenant's key for 24 hours. A legitimate report gates, and so does
// its repeat (a retried lost answer), a repeated not_started, and a late report on a dispatch
// sluice voided: the nonce proves the executor was sent the job, so its quota news is true.
func TestCompleteGateNeedsTheDispatchNonce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addr := memcachedtest.Shared(t)
	gates, err := rategate.New(rategate.Config{Servers: []string{addr}, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	mc := memcache.New(addr)
	f := apitest.Setup(t, apitest.Options{APIGates: gates})

	// keyed inserts a job of tenant acme under a fresh rate key, dispatched with nonce (queued
	// when nonce is ""), and returns its id and the key's hash.
	keyed := func(nonce string) (int64, string) {
		t.Helper()
		_, hash := apitest.RateKey(t, mc)
		var id int64
		if nonce == "" {
			r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": "acme"})
			if r.Status != http.StatusAccepted {
				t.Fatalf("admit: HTTP %d %s", r.Status, r.Raw)
			}
			id = apitest.JobID(t, r.Body)
		} else if id, err = apitest.DispatchedJob(ctx, f.DB.DB, "acme", nonce); err != nil {
			t.Fatal(err)
		}
		if _, err := f.DB.ExecContext(ctx, "UPDATE jobs SET rate_key_sha256 = ? WHERE id = ?", hash, id); err != nil {
			t.Fatal(err)
		}
		return id, hash
	}
	complete := func(id int64, nonce, status string, retryAfter int) (int, string) {
		t.Helper()
		r := f.Do(t, http.MethodPost, "/v1/jobs/"+strconv.FormatInt(id, 10)+"/complete", apitest.ExecToken,
			map[string]any{"nonce": nonce, "status": status, "gate": map[string]any{"retry_after": retryAfter}})
		code, _ := r.Body["error_code"].(string)
		return r.Status, code
	}
	// gatedFor is how long the key's gate has left, 0 when it has none.
	gatedFor := func(hash string) time.Duration {
		t.Helper()
		nb, ok, err := gates.Get(ctx, hash)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return 0
		}
		return time.Until(nb)
	}

	t.Run("a made-up nonce gates nothing", func(t *testing.T) {
		dispatched, hd := keyed("the-real-nonce")
		queued, hq := keyed("")
		for _, c := range []struct {
			name   string
			id     int64
			hash   string
			status int
			code   string
		}{
			{"dispatched job", dispatched, hd, http.StatusConflict, "nonce_invalid"},
			{"queued job", queued, hq, http.StatusConflict, "dispatch_void"},
			{"missing job", dispatched + 1000, "", http.StatusNotFound, "not_found"}, // no key to gate
		} {
			if st, code := complete(c.id, "made-up", "failed", 86400); st != c.status || code != c.code {
				t.Errorf("%s: HTTP %d %s, want %d %s", c.name, st, code, c.status, c.code)
			}
			if c.hash == "" {
				continue
			}
			if d := gatedFor(c.hash); d != 0 {
				t.Errorf("%s: a /complete with a made-up nonce gated the job's key for %s", c.name, d)
			}
		}
	})

	t.Run("the dispatch's own report gates, and so does its repeat", func(t *testing.T) {
		id, hash := keyed("n-done")
		if st, code := complete(id, "n-done", "succeeded", 60); st != http.StatusOK {
			t.Fatalf("report: HTTP %d %s", st, code)
		}
		if d := gatedFor(hash); d < 50*time.Second || d > 66*time.Second {
			t.Errorf("after the report the key is gated for %s, want about 60s", d)
		}
		// The same outcome again, with newer quota news: a retried answer still gates.
		if st, code := complete(id, "n-done", "succeeded", 600); st != http.StatusOK {
			t.Fatalf("repeat: HTTP %d %s", st, code)
		}
		if d := gatedFor(hash); d < 590*time.Second || d > 606*time.Second {
			t.Errorf("after the repeated report the key is gated for %s, want about 600s", d)
		}
		// A different outcome on the same nonce is refused; the nonce is still the dispatch's.
		if st, code := complete(id, "n-done", "failed", 900); st != http.StatusConflict || code != "outcome_conflict" {
			t.Errorf("another outcome: HTTP %d %s, want 409 outcome_conflict", st, code)
		}
		if d := gatedFor(hash); d < 890*time.Second {
			t.Errorf("after a conflicting report with the dispatch's nonce the key is gated for %s, want about 900s", d)
		}
	})

	t.Run("a repeated not_started gates", func(t *testing.T) {
		id, hash := keyed("n-later")
		if st, code := complete(id, "n-later", "not_started", 60); st != http.StatusOK {
			t.Fatalf("not_started: HTTP %d %s", st, code)
		}
		if d := gatedFor(hash); d < 50*time.Second {
			t.Errorf("after not_started the key is gated for %s, want about 60s", d)
		}
		// The requeue voided the nonce: its repeat matches the recorded dispatch only.
		if st, code := complete(id, "n-later", "not_started", 600); st != http.StatusOK {
			t.Fatalf("repeated not_started: HTTP %d %s", st, code)
		}
		if d := gatedFor(hash); d < 590*time.Second {
			t.Errorf("after the repeated not_started the key is gated for %s, want about 600s", d)
		}
	})

	t.Run("a late report on a voided dispatch gates", func(t *testing.T) {
		id, hash := keyed("n-late")
		// As recovery leaves a dispatch whose lease ran out: queued again, its nonce voided.
		if _, err := f.DB.ExecContext(ctx, `UPDATE jobs SET status = 'queued', version = version + 1,
			voided_nonce_sha256 = nonce_sha256, nonce_sha256 = NULL, nonce_expires_at = NULL, error_code = 'lease_expired'
			WHERE id = ?`, id); err != nil {
			t.Fatal(err)
		}
		f.DB.RecountQueues(t, "acme")
		if st, code := complete(id, "n-late", "failed", 120); st != http.StatusConflict || code != "dispatch_void" {
			t.Fatalf("late report: HTTP %d %s, want 409 dispatch_void", st, code)
		}
		if d := gatedFor(hash); d < 110*time.Second {
			t.Errorf("after a late report with the voided dispatch's nonce the key is gated for %s, want about 120s", d)
		}
	})
}
