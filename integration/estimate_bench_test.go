package integration_test

import (
	"context"
	"database/sql"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/harness"
)

// BenchmarkEstimatedStart measures the error of GET /v1/jobs/{id}'s estimated_start on a real
// run: three tenants with service times of 20, 50 and 100 ms (the simulated executor's sleep_ms),
// caps 8 global and 3 a tenant, each with a history of 20 jobs, then a backlog of 60 jobs each. While
// the backlog drains, a queued job drawn at random is read every 10 ms through the API; when all
// have ended, each estimate is compared with the job's confirmed start. Reports the median and
// p90 absolute error, and the median error relative to the wait the job still had when read.
func BenchmarkEstimatedStart(b *testing.B) {
	for range b.N {
		env := harness.Start(b, harness.Options{})
		ctx := context.Background()
		env.SetConfig(b, func(c *config.Config) { c.GlobalInFlight, c.TenantInFlight = 8, 3 })
		service := map[string]int{"fast": 20, "mid": 50, "slow": 100}
		tenants := []string{"fast", "mid", "slow"}
		payload := func(i int) any { return map[string]any{"sleep_ms": service[tenants[i%3]]} }
		tenantOf := func(i int) string { return tenants[i%3] }
		admitMany(b, env, 4, tenantOf, payload, 60)
		harness.WaitFor(b, time.Minute, "the history to finish", func() (bool, error) {
			c, err := env.CountJobs(ctx)
			return c["succeeded"] == 60, err
		})
		// The API process reads its configuration every few seconds: ask it to read now.
		patchConfig(b, env, map[string]any{
			"global_in_flight": 8, "tenant_in_flight": 3})
		admitMany(b, env, 4, tenantOf, payload, 180)

		type sample struct {
			id        int64
			asked     time.Time
			estimated time.Time
		}
		var samples []sample
		tick := time.NewTicker(10 * time.Millisecond)
		for range tick.C {
			var id int64
			err := env.DB.QueryRowContext(ctx, "SELECT id FROM jobs WHERE status = 'queued' ORDER BY RAND() LIMIT 1").Scan(&id)
			if err == sql.ErrNoRows {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			asked := time.Now()
			r := env.Do(b, http.MethodGet, "/v1/jobs/"+strconv.FormatInt(id, 10), harness.ProducerToken, nil)
			s, ok := r.Body["estimated_start"].(string)
			if r.Status != http.StatusOK || !ok {
				continue // claimed meanwhile
			}
			est, err := time.Parse(time.RFC3339Nano, s)
			if err != nil {
				b.Fatal(err)
			}
			samples = append(samples, sample{id, asked, est})
		}
		tick.Stop()
		harness.WaitFor(b, time.Minute, "the backlog to finish", func() (bool, error) {
			c, err := env.CountJobs(ctx)
			return c["succeeded"] == 240, err
		})
		var abs, rel []time.Duration
		for _, s := range samples {
			var started time.Time
			if err := env.DB.QueryRowContext(ctx, "SELECT COALESCE(started_at, dispatched_at) FROM jobs WHERE id = ?", s.id).Scan(&started); err != nil {
				b.Fatal(err)
			}
			err := s.estimated.Sub(started)
			if err < 0 {
				err = -err
			}
			abs = append(abs, err)
			if wait := started.Sub(s.asked); wait > 0 {
				// The error as a fraction of the wait, carried as that many milliseconds.
				rel = append(rel, time.Duration(float64(err)/float64(wait)*float64(time.Millisecond)))
			}
		}
		a, r := harness.Percentiles(abs, 50, 90), harness.Percentiles(rel, 50)
		harness.Emit("estimated_start", map[string]any{
			"samples": len(samples), "abs_error_p50_ms": a[0], "abs_error_p90_ms": a[1],
			"rel_error_p50": round2(r[0]),
		})
	}
}
