package integration_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/harness"
)

// TestWeightedFairShare is issue "weighted fairness"'s acceptance: three tenants of weights 1, 2
// and 4 with long backlogs, a drainer process (the built binary) and caps that leave the choice
// to the weights (global 14, each tenant's cap 14), hold units at the executor in the ratio 1:2:4
// within one unit. Each tenant's mean in flight is read at the executor (its unit-seconds over a
// window of at least 200 outcomes, divided by the window), and compared with its weighted share
// of the mean total, so that the moments a freed unit waits for the next claim count against
// every tenant alike rather than against the largest.
func TestWeightedFairShare(t *testing.T) {
	t.Parallel()
	bin := harness.BuildSluice(t)
	env := harness.Start(t, harness.Options{API: true, Relay: true})
	ctx := context.Background()
	weights := map[string]float64{"A": 1, "B": 2, "C": 4}
	env.SetConfig(t, func(c *config.Config) {
		c.GlobalInFlight, c.TenantInFlight = 14, 14
		c.TenantWeights = map[string]float64{"B": 2, "C": 4}
	})
	const perTenant = 300
	tenants := []string{"A", "B", "C"}
	admitMany(t, env, 8, func(i int) string { return tenants[i%3] },
		func(int) any { return map[string]any{"sleep_ms": 40} }, 3*perTenant)
	env.StartDrainer(t, bin, "weights")

	harness.WaitFor(t, 30*time.Second, "the executor to hold 14 units", func() (bool, error) {
		return env.Exec.Stats().InFlight == 14, nil
	})
	s1, t1 := env.Exec.Stats(), time.Now()
	harness.WaitFor(t, 60*time.Second, "200 more outcomes", func() (bool, error) {
		return env.Exec.Stats().Completed["succeeded"] >= s1.Completed["succeeded"]+200, nil
	})
	s2, t2 := env.Exec.Stats(), time.Now()
	var queuedC int
	if err := env.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE tenant = 'C' AND status = 'queued'").Scan(&queuedC); err != nil {
		t.Fatal(err)
	}
	if queuedC == 0 {
		t.Fatal("C's backlog ran out within the window: the window does not measure backlogged tenants")
	}

	window := t2.Sub(t1).Seconds()
	mean, total := map[string]float64{}, 0.0
	for _, tn := range tenants {
		mean[tn] = (s2.InFlightSecondsByTenant[tn] - s1.InFlightSecondsByTenant[tn]) / window
		total += mean[tn]
	}
	t.Logf("mean in flight over %.2f s: A %.2f, B %.2f, C %.2f (total %.2f of 14)", window, mean["A"], mean["B"], mean["C"], total)
	for _, tn := range tenants {
		if want := total * weights[tn] / 7; math.Abs(mean[tn]-want) > 1 {
			t.Errorf("tenant %s (weight %g) held %.2f units on average, want %.2f ± 1 (its weighted share of %.2f)",
				tn, weights[tn], mean[tn], want, total)
		}
	}
	assertCapsHeld(t, env, 14, 14)
}
