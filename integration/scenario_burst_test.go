package integration_test

import (
	"context"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/integration/harness"
)

// TestWorstBurstReplay is SPEC §13 scenarios 4 and 5: a replay of the worst burst on record (137
// arrivals in one minute, 414 in an hour, concentrated in three tenants) under the default caps.
// The hour is compressed: the 137 arrive at once from 8 concurrent producers, the other 277 in
// bursts of 10 to 30 between waves of work. The global cap (4) and the tenant cap (2) are never
// exceeded at the executor, neither depth cap fires (no rejected row, no refusal counted), and
// every job runs exactly once.
func TestWorstBurstReplay(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{})
	ctx := context.Background()
	rng := rand.New(rand.NewSource(414))
	// Nine in ten arrivals belong to the three heavy tenants, the rest to ten others.
	tenantOf := func() string {
		if rng.Intn(10) < 9 {
			return fmt.Sprintf("heavy-%d", rng.Intn(3))
		}
		return fmt.Sprintf("light-%d", rng.Intn(10))
	}
	const peak, total = 137, 414
	var waves [][]string
	wave := make([]string, peak)
	for i := range wave {
		wave[i] = tenantOf()
	}
	waves = append(waves, wave)
	for left := total - peak; left > 0; {
		n := min(left, 10+rng.Intn(21))
		wave := make([]string, n)
		for i := range wave {
			wave[i] = tenantOf()
		}
		waves = append(waves, wave)
		left -= n
	}
	admitted := 0
	for _, wave := range waves {
		var wg sync.WaitGroup
		next := make(chan string, len(wave))
		for _, tenant := range wave {
			next <- tenant
		}
		close(next)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for tenant := range next {
					env.Admit(t, tenant, map[string]any{"sleep_ms": 10})
				}
			}()
		}
		wg.Wait()
		admitted += len(wave)
		// The next wave arrives while this one's work is still running.
		harness.WaitFor(t, 30*time.Second, "some of the wave to run", func() (bool, error) {
			return env.Exec.Stats().TotalStarts > int64(admitted-len(wave)), nil
		})
	}
	harness.WaitFor(t, 60*time.Second, "every job of the replay to succeed", func() (bool, error) {
		c, err := env.CountJobs(ctx)
		return c["succeeded"] == total, err
	})
	if c, err := env.CountJobs(ctx); err != nil || len(c) != 1 {
		t.Errorf("job states after the replay = %v (%v), want only %d succeeded: no rejected row", c, err, total)
	}
	assertCapsHeld(t, env, 4, 2)
	if st := env.Exec.Stats(); st.TotalStarts != total || st.MaxInFlight < 4 {
		t.Errorf("executor saw %d starts and at most %d at once; want %d, and the global cap of 4 used under the burst",
			st.TotalStarts, st.MaxInFlight, total)
	}
	metrics := scrape(t, env.URL)
	for _, scope := range []string{"tenant", "global"} {
		if v, ok := metricValue(metrics, `sluice_depth_cap_refusals_total{scope="`+scope+`"}`); !ok || v != 0 {
			t.Errorf("sluice_depth_cap_refusals_total{scope=%q} = %v (present %v), want 0", scope, v, ok)
		}
	}
}
