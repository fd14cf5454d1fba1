package integration_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/integration/publishertest"
	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/outbox"
)

// loadResult is what a load generator saw.
type loadResult struct {
	mu          sync.Mutex
	admitted    map[string]int64 // idempotency key → job id
	unavailable int              // 503 unavailable, retryable
	unknown     int              // 503 outcome_unknown (retried with the same key)
	other       []string
	done        chan struct{} // closed when the workers have returned
}

// runLoad admits jobs with idempotency keys from 2 workers until stop is closed. A 503 is
// retried with the same key (a keyed request is safe to replay); everything else is recorded.
func runLoad(ctx context.Context, url string, hc *http.Client, stop <-chan struct{}, sleepMS int) *loadResult {
	res := &loadResult{admitted: map[string]int64{}, done: make(chan struct{})}
	var wg sync.WaitGroup
	var seq atomic.Int64
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key, tenant := "", ""
			for {
				select {
				case <-stop:
					return
				default:
				}
				if key == "" { // a retry after a 503 replays the very same request
					n := seq.Add(1)
					key, tenant = "k"+strconv.FormatInt(n, 10), fmt.Sprintf("tenant-%d", n%3)
				}
				code, body, err := apiDo(ctx, hc, http.MethodPost, url+"/v1/jobs", harness.ProducerToken, map[string]any{
					"tenant": tenant, "idempotency_key": key, "payload": map[string]any{"sleep_ms": sleepMS}})
				res.mu.Lock()
				switch {
				case err != nil:
					res.other = append(res.other, err.Error())
				case code == http.StatusAccepted || code == http.StatusOK:
					res.admitted[key] = int64(body["id"].(float64))
					key = ""
				case code == http.StatusServiceUnavailable && body["error_code"] == "unavailable" && body["retryable"] == true:
					res.unavailable++
				case code == http.StatusServiceUnavailable && body["error_code"] == "outcome_unknown" && body["retryable"] == true:
					res.unknown++
				default:
					res.other = append(res.other, fmt.Sprintf("HTTP %d %v", code, body))
				}
				res.mu.Unlock()
				if code == http.StatusServiceUnavailable || err != nil {
					select { // pace retries during the outage; not synchronisation
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
				}
			}
		}()
	}
	go func() { wg.Wait(); close(res.done) }()
	return res
}

func (r *loadResult) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.admitted)
}

// TestOpsMariaDBRestart kills a test-owned mariadbd (SIGKILL) under load and restarts it on the
// same port and data directory (SPEC §12 invariant 6): admissions during the outage get 503
// unavailable with retryable:true, API, relay and drainer recover by themselves within a few
// seconds, and every admitted job runs exactly once.
func TestOpsMariaDBRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := startMariaDB(t)
	admin, err := store.Open(ctx, m.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE sluice CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		t.Fatal(err)
	}
	admin.Close()
	db, err := store.Open(ctx, m.DSN("sluice"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Up(ctx, db, nil); err != nil {
		t.Fatal(err)
	}
	db.Close()
	env := startOps(t, opsOptions{DSN: m.DSN("sluice")})
	// The outage below outlasts a config re-read (5 s); leases of 30 s keep it shorter than a
	// lease, the case the drainer rides out with the real outcome of every job.
	if r := env.Do(t, http.MethodPatch, "/v1/config", harness.AdminToken, map[string]any{
		"changes": map[string]any{"lease_seconds": 30}, "note": "outage test"}); r.Status != http.StatusOK {
		t.Fatalf("PATCH: HTTP %d %s", r.Status, r.Raw)
	}

	stop := make(chan struct{})
	load := runLoad(ctx, env.URL, env.HTTP, stop, 200)
	harness.WaitFor(t, 20*time.Second, "some admissions before the kill", func() (bool, error) { return load.count() >= 30, nil })

	m.kill()
	killedAt := time.Now()
	harness.WaitFor(t, 20*time.Second, "admissions to be refused with 503 unavailable", func() (bool, error) {
		load.mu.Lock()
		defer load.mu.Unlock()
		return load.unavailable >= 100, nil // an outage of a second or more, jobs in flight across it
	})
	// /readyz answers from a reading at most a second old.
	harness.WaitFor(t, 5*time.Second, "/readyz to answer 503 with the database down", func() (bool, error) {
		code, _, _ := getJSON(t, env.URL+"/readyz")
		return code == http.StatusServiceUnavailable, nil
	})
	if v, ok := metricValue(scrape(t, env.URL), "sluice_status_read_success"); !ok || v != 0 {
		t.Errorf("sluice_status_read_success with the database down = %v (present %v), want 0", v, ok)
	}
	// The process keeps its last good config and says so once a re-read has failed.
	harness.WaitFor(t, 10*time.Second, "sluice_config_stale to report the failed re-read", func() (bool, error) {
		m := scrape(t, env.URL)
		stale, _ := metricValue(m, "sluice_config_stale")
		version, _ := metricValue(m, "sluice_config_version")
		return stale == 1 && version == 1, nil
	})
	before := load.count()
	m.start()
	restartedAt := time.Now()
	t.Logf("database down for %s", restartedAt.Sub(killedAt))

	harness.WaitFor(t, 30*time.Second, "admissions to succeed again", func() (bool, error) { return load.count() >= before+30, nil })
	recovered := time.Since(restartedAt)
	close(stop)
	<-load.done
	t.Logf("admissions recovered within %s of the restart; %d admitted, %d unavailable, %d outcome_unknown",
		recovered, len(load.admitted), load.unavailable, load.unknown)
	if len(load.other) > 0 {
		t.Errorf("%d unexpected answers, first: %s", len(load.other), load.other[0])
	}

	// Re-open our own handle: the old one's pool died with the server.
	check, err := store.Open(ctx, m.DSN("sluice"))
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close()
	harness.WaitFor(t, 60*time.Second, "every admitted job to finish and the outbox to drain", func() (bool, error) {
		var open, unpublished int
		err := check.QueryRowContext(ctx, `SELECT
			(SELECT COUNT(*) FROM jobs WHERE status IN ('queued','claimed','dispatched','running')),
			(SELECT COUNT(*) FROM outbox WHERE published_at = `+outbox.Unpublished+`)`).Scan(&open, &unpublished)
		return open == 0 && unpublished == 0, err
	})
	rows, err := check.QueryContext(ctx, "SELECT id, status, idempotency_key FROM jobs")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	byKey := map[string]int64{}
	states := map[string]int{}
	for rows.Next() {
		var id int64
		var st, key string
		if err := rows.Scan(&id, &st, &key); err != nil {
			t.Fatal(err)
		}
		if _, dup := byKey[key]; dup {
			t.Errorf("idempotency key %s has two jobs", key)
		}
		byKey[key] = id
		states[st]++
	}
	for key, id := range load.admitted {
		if byKey[key] != id {
			t.Errorf("admitted job %d (key %s) is missing (found %d)", id, key, byKey[key])
		}
	}
	if states["succeeded"] != len(byKey) {
		t.Errorf("job states %v: want every one of the %d jobs succeeded", states, len(byKey))
	}
	st := env.Exec.Stats()
	if st.DuplicateStarts != 0 {
		t.Errorf("executor saw %d duplicate starts", st.DuplicateStarts)
	}
	for key, id := range byKey {
		if n := st.Starts[strconv.FormatInt(id, 10)]; n != 1 {
			t.Errorf("job %d (key %s) started %d times, want 1", id, key, n)
		}
	}
	harness.WaitFor(t, 5*time.Second, "/readyz to answer 200 after the restart", func() (bool, error) {
		code, _, _ := getJSON(t, env.URL+"/readyz")
		return code == http.StatusOK, nil
	})
	// The status and metrics read again from the restarted database, and the config is fresh.
	harness.WaitFor(t, 10*time.Second, "status to read again with a fresh config", func() (bool, error) {
		r := env.Do(t, http.MethodGet, "/v1/status", harness.AdminToken, nil)
		cfg, _ := r.Body["config"].(map[string]any)
		return r.Status == http.StatusOK && cfg["stale"] == false, nil
	})
}

// TestOpsNATSRestart stops the broker under traffic and starts it again on the same port and
// store (SPEC §12 invariant 5): admission and drain go on without it (the poll is the backstop),
// the status shows the broker down, and once it is back the client reconnects by itself, the
// outbox is published completely, each row once in the stream, and pokes flow again.
func TestOpsNATSRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := natstest.Start(t) // restarted below on the same port and store
	env := startOps(t, opsOptions{NATSURL: ns.URL()})
	brokerConnected := func() (bool, error) {
		r := env.Do(t, http.MethodGet, "/v1/status", harness.AdminToken, nil)
		b, _ := r.Body["broker"].(map[string]any)
		if r.Status != http.StatusOK || b == nil {
			return false, fmt.Errorf("status: HTTP %d %s", r.Status, r.Raw)
		}
		return b["connected"] == true, nil
	}
	succeeded := func(n int) func() (bool, error) {
		return func() (bool, error) {
			c, err := env.CountJobs(ctx)
			return c["succeeded"] == n, err
		}
	}
	for i := 0; i < 10; i++ {
		env.Admit(t, fmt.Sprintf("t%d", i%3), map[string]any{"sleep_ms": 10})
	}
	harness.WaitFor(t, 20*time.Second, "10 jobs to succeed with the broker up", succeeded(10))

	ns.Stop()
	harness.WaitFor(t, 10*time.Second, "status to show the broker disconnected", func() (bool, error) {
		up, err := brokerConnected()
		return !up, err
	})
	for i := 0; i < 20; i++ {
		env.Admit(t, fmt.Sprintf("t%d", i%3), map[string]any{"sleep_ms": 10})
	}
	harness.WaitFor(t, 30*time.Second, "20 more jobs to succeed without the broker (poll backstop)", succeeded(30))
	var waiting int
	if err := env.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox WHERE published_at = "+outbox.Unpublished).Scan(&waiting); err != nil {
		t.Fatal(err)
	}
	if waiting < 20 {
		t.Errorf("%d outbox rows unpublished during the outage, want at least the 20 enqueue pokes", waiting)
	}

	ns.Restart(t)
	harness.WaitFor(t, 15*time.Second, "the client to reconnect by itself", brokerConnected)
	harness.WaitFor(t, 15*time.Second, "the outbox to be published after the outage", func() (bool, error) {
		var n int
		err := env.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox WHERE published_at = "+outbox.Unpublished).Scan(&n)
		return n == 0, err
	})
	pokesBefore, _ := metricValue(scrape(t, env.URL), "sluice_pokes_received_total")
	for i := 0; i < 5; i++ {
		env.Admit(t, "after", map[string]any{"sleep_ms": 10})
	}
	harness.WaitFor(t, 20*time.Second, "5 jobs after the restart", succeeded(35))
	harness.WaitFor(t, 10*time.Second, "pokes to flow again", func() (bool, error) {
		v, _ := metricValue(scrape(t, env.URL), "sluice_pokes_received_total")
		return v >= pokesBefore+5, nil
	})
	harness.WaitFor(t, 10*time.Second, "the outbox to be empty", func() (bool, error) {
		var n int
		err := env.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox WHERE published_at = "+outbox.Unpublished).Scan(&n)
		return n == 0, err
	})

	var rows uint64
	if err := env.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if msgs := publishertest.StreamMessages(t, ns.URL()); msgs != rows {
		t.Errorf("stream holds %d messages, want one per outbox row (%d)", msgs, rows)
	}
	if st := env.Exec.Stats(); st.DuplicateStarts != 0 || st.TotalStarts != 35 {
		t.Errorf("executor: %d starts, %d duplicates; want 35 and 0", st.TotalStarts, st.DuplicateStarts)
	}
}
