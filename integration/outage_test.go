package integration_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/integration/publishertest"
	"github.com/sluicehq/sluice/outbox"
	"github.com/sluicehq/sluice/publisher"
)

// TestBrokerOutageScenario9 is SPEC §13 scenario 9 and §12 invariant 5: with the broker down,
// 2,000 admissions succeed and drain through the poll; a job admitted to an idle drainer during
// the outage is dispatched within the poll period (under 1.5 s); when the broker returns every
// outbox row is published, and a JetStream consumer sees each message id exactly once.
func TestBrokerOutageScenario9(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	// Split roles: a drainer in the API's process is woken by its own admissions, so only a
	// drainer elsewhere shows what the broker's absence costs.
	env := harness.Start(t, harness.Options{NATSURL: ns.URL(), API: true, Relay: true})
	env.StartApp(t, harness.Options{Drainer: true})
	ctx := context.Background()
	// The caps are not what this test is about: raise them so that 2,000 jobs drain quickly on a
	// shared machine. The drain still has no pokes: only the poll and local wake-ups.
	raiseCaps(t, env, 16, 4)
	ns.Stop()

	const jobs = 2000
	var wg sync.WaitGroup
	errs := make(chan error, jobs)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < jobs; i += 8 {
				r := env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken,
					map[string]any{"tenant": fmt.Sprintf("t%d", i%8), "payload": map[string]any{"n": i}})
				if r.Status != http.StatusAccepted {
					errs <- fmt.Errorf("admission %d during the outage: HTTP %d %s", i, r.Status, r.Raw)
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	harness.WaitFor(t, 120*time.Second, "the 2,000 jobs to drain with the broker down", func() (bool, error) {
		c, err := env.CountJobs(ctx)
		return c["succeeded"] == jobs, err
	})
	if ns.Running() {
		t.Fatal("the broker came back during the drain; the test proves nothing")
	}
	if n := publishertest.CountOutbox(t, env.DB, "published_at > "+outbox.Unpublished); n != 0 {
		t.Fatalf("%d outbox rows marked published while the broker was down", n)
	}

	// Poll-only pickup: each probe reaches an idle drainer whose only wake-up is its 1 Hz poll.
	for i := 0; i < 3; i++ {
		id := env.Admit(t, "probe", map[string]any{"i": i})
		var wait time.Duration
		harness.WaitFor(t, 10*time.Second, "the probe to be dispatched", func() (bool, error) {
			var queued, dispatched *time.Time
			err := env.DB.QueryRowContext(ctx, "SELECT queued_at, dispatched_at FROM jobs WHERE id = ?", id).Scan(&queued, &dispatched)
			if err != nil || dispatched == nil {
				return false, err
			}
			wait = dispatched.Sub(*queued)
			return true, nil
		})
		if wait > 1500*time.Millisecond {
			t.Fatalf("probe %d waited %s for dispatch with the broker down, want under 1.5 s", i, wait)
		}
		t.Logf("probe %d: dispatch wait %s with the broker down", i, wait)
		harness.WaitFor(t, 10*time.Second, "the probe to finish", func() (bool, error) {
			var status string
			err := env.DB.QueryRowContext(ctx, "SELECT status FROM jobs WHERE id = ?", id).Scan(&status)
			return status == "succeeded", err
		})
	}

	ns.Restart(t)
	harness.WaitFor(t, 60*time.Second, "the outbox to be published after the outage", func() (bool, error) {
		return publishertest.CountOutbox(t, env.DB, "published_at = "+outbox.Unpublished) == 0, nil
	})
	js := natstest.JetStreamAt(t, ns.URL())
	installID, err := publisher.InstallationID(ctx, env.DB.DB)
	if err != nil {
		t.Fatal(err)
	}
	ids := publishertest.AllOutboxIDs(t, env.DB)
	if len(ids) < 2*jobs { // an enqueue and a release poke per job at least
		t.Fatalf("only %d outbox rows for %d jobs", len(ids), jobs)
	}
	publishertest.AssertExactlyOnce(t, installID, ids, publishertest.ConsumeAll(t, js))
}

// raiseCaps writes a runtime configuration version with the given global and per-tenant caps,
// as an operator's PATCH would; drainers read it in their next claim.
func raiseCaps(t *testing.T, env *harness.Env, global, tenant int) {
	t.Helper()
	env.SetConfig(t, func(c *config.Config) { c.GlobalInFlight, c.TenantInFlight = global, tenant })
}
