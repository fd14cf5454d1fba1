package integration_test

import (
	"context"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/harness"
)

// admitBatches admits n jobs of tenant with payload through POST /v1/jobs:batch, 1,000 a request.
func admitBatches(tb testing.TB, env *harness.Env, tenant string, payload any, n int) {
	tb.Helper()
	for n > 0 {
		k := min(n, 1000)
		jobs := make([]map[string]any, k)
		for i := range jobs {
			jobs[i] = map[string]any{"tenant": tenant, "payload": payload}
		}
		r := env.Do(tb, http.MethodPost, "/v1/jobs:batch", harness.ProducerToken, map[string]any{"jobs": jobs})
		if r.Status != http.StatusOK {
			tb.Fatalf("batch of %d: HTTP %d %s", k, r.Status, r.Raw)
		}
		for i, res := range r.Body["results"].([]any) {
			if st := res.(map[string]any)["status"]; st != 202.0 {
				tb.Fatalf("batch of %d: item %d answered %v: %v", k, i, st, res)
			}
		}
		n -= k
	}
}

// executorShares drains two backlogged tenants, one of short jobs and one of long ones, under
// ordering on a drainer process (the built binary), caps 4 global and 4 a tenant, and returns
// each tenant's executor time (unit-seconds at the simulated executor) over a window: from the
// long tenant's warm-th outcome to its (warm+window)-th, so that the window is set by the work
// done, not by a clock.
func executorShares(t testing.TB, ordering config.Ordering, shortMS, longMS, warm, window int) (short, long float64) {
	bin := harness.BuildSluice(t)
	env := harness.Start(t, harness.Options{API: true, Relay: true})
	ctx := context.Background()
	// Through the API, whose process applies it at once (its depth caps decide the batches).
	patchConfig(t, env, map[string]any{
		"ordering": ordering, "global_in_flight": 4, "tenant_in_flight": 4,
		"tenant_queue_depth": 100_000, "global_queue_depth": 200_000})
	// Backlogs that outlast the window: while the long tenant ends warm+window jobs on at least
	// one unit, the short one ends at most 4 units' worth of its own.
	longJobs := warm + window + 20
	admitBatches(t, env, "long", map[string]any{"sleep_ms": longMS}, longJobs)
	admitBatches(t, env, "short", map[string]any{"sleep_ms": shortMS}, (warm+window)*longMS/shortMS*4+100)
	env.StartDrainer(t, bin, "shares")
	longDone := func(n int) func() (bool, error) {
		return func() (bool, error) {
			var done int
			err := env.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE tenant = 'long' AND status = 'succeeded'").Scan(&done)
			return done >= n, err
		}
	}
	harness.WaitFor(t, 2*time.Minute, "the long tenant's warm-up outcomes", longDone(warm))
	s1 := env.Exec.Stats()
	harness.WaitFor(t, 3*time.Minute, "the long tenant's outcomes of the window", longDone(warm+window))
	s2 := env.Exec.Stats()
	var left int
	if err := env.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE tenant = 'short' AND status = 'queued'").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left == 0 {
		t.Fatal("the short tenant's backlog ran out within the window: it does not measure two backlogged tenants")
	}
	return s2.InFlightSecondsByTenant["short"] - s1.InFlightSecondsByTenant["short"],
		s2.InFlightSecondsByTenant["long"] - s1.InFlightSecondsByTenant["long"]
}

// TestFairTime is issue "weighted fairness"'s fair_time acceptance, scaled to a test: a tenant of
// 80 ms jobs and one of 1,600 ms jobs, both backlogged, get executor time within 10 % of 1:1 over
// a window of the long tenant's 24 outcomes (about 20 s at 2 units), measured where the work runs
// (0.96-0.97 here under -race, 0.94-0.97 beside a core kept busy by a shell loop; under fair the
// same run gives 0.88: the short tenant's units idle between its jobs while sluice records an
// outcome and starts the next). What fair_time charges is start to outcome as sluice records them,
// so each short job is also charged its transport, a millisecond or more, and its tenant ends that
// much short of 1:1. That share grows with the machine's load and with shorter jobs: 40 ms jobs
// beside 800 ms ones read 0.93-0.94 alone and 0.88 beside the busy core, and failed once in
// .ci/run at 0.83 with other packages' tests running beside it; 10 ms beside 250 ms reach 0.89
// (fair 0.75).
//
// It asserts on shares of time, so it does not run in parallel with the package's other tests
// (Go runs the non-parallel tests of a package one at a time, before the parallel ones).
// BenchmarkFairTime runs the 20 ms and 2 s over a minute, beside fair.
func TestFairTime(t *testing.T) {
	short, long := executorShares(t, config.FairTime, 80, 1600, 8, 24)
	ratio := short / long
	t.Logf("fair_time: executor time short %.2f s, long %.2f s over the long tenant's 24 outcomes: %.3f", short, long, ratio)
	if math.Abs(ratio-1) > 0.10 {
		t.Errorf("short/long executor time %.3f (%.2f / %.2f s), want 1 ± 0.10", ratio, short, long)
	}
}

// BenchmarkFairTime is the fair_time figure: a tenant of 20 ms jobs and one of 2 s jobs,
// both backlogged (caps 4 global and 4 a tenant), their executor time over a window of the long
// tenant's 60 outcomes (about a minute), under fair and under fair_time in the same run, and each
// short/long ratio (target for fair_time: 1 ± 0.10).
func BenchmarkFairTime(b *testing.B) {
	for range b.N {
		fs, fl := executorShares(b, config.Fair, 20, 2000, 6, 60)
		ts, tl := executorShares(b, config.FairTime, 20, 2000, 6, 60)
		harness.Emit("fair_time", map[string]any{
			"fair_short_s": round2(fs), "fair_long_s": round2(fl), "fair_ratio": round2(fs / fl),
			"fair_time_short_s": round2(ts), "fair_time_long_s": round2(tl), "fair_time_ratio": round2(ts / tl),
		})
	}
}
