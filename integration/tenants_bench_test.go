package integration_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/gate/limits"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/testdb"
)

// BenchmarkTenantCount is SPEC §14's tenant count figure (issue 17): the drain rate of 6,400
// no-op jobs over 64 tenants, over 6,400 tenants and of 100,000 jobs over 100,000 tenants, one
// job each (caps 64, in one run: targets 0.8x and 0.5x of the 64-tenant rate), and the time of a
// claim pass with 64 and with 100,000 tenants with work (target: within 2x).
func BenchmarkTenantCount(b *testing.B) {
	for range b.N {
		base, _ := drainThroughput(b, 64, 6_400, 0, false)
		wide, _ := drainThroughput(b, 6_400, 6_400, 0, false)
		widest, _ := drainThroughput(b, 100_000, 100_000, 0, false)
		rate := func(d drained, jobs int) float64 { return float64(jobs) / d.el.Seconds() }
		harness.Emit("tenant_count_drain", map[string]any{
			"caps": 64, "jobs_per_s_64_tenants": int(rate(base, 6_400)),
			"jobs_per_s_6400_tenants": int(rate(wide, 6_400)), "jobs_per_s_100000_tenants": int(rate(widest, 100_000)),
			"ratio_6400": round2(rate(wide, 6_400) / rate(base, 6_400)), "ratio_100000": round2(rate(widest, 100_000) / rate(base, 6_400)),
			"peak_in_flight": max(base.peak, wide.peak, widest.peak),
		})
		few, fewJobs := passTimes(b, 64, 64*60)
		many, manyJobs := passTimes(b, 100_000, 100_000)
		f, m := harness.Percentiles(few, 50, 99), harness.Percentiles(many, 50, 99)
		harness.Emit("tenant_count_pass", map[string]any{
			"passes": len(few), "jobs_per_pass_64_tenants": round2(fewJobs), "jobs_per_pass_100000_tenants": round2(manyJobs),
			"tenants_64_p50_ms": f[0], "tenants_64_p99_ms": f[1],
			"tenants_100000_p50_ms": m[0], "tenants_100000_p99_ms": m[1],
			"ratio_p50": round2(m[0] / f[0]), "ratio_p99": round2(m[1] / f[1]),
		})
	}
}

// passTimes times claim passes (RunOnce) with jobs queued over tenants tenants and caps 64, and
// returns the mean number of jobs a pass claimed (a pass may end early at a tenant's last read
// head, see drainer.Pass.Full); between passes it waits for the last pass's outcomes, so every
// pass finds all 64 slots free.
func passTimes(b *testing.B, tenants, jobs int) ([]time.Duration, float64) {
	const passes = 50
	ctx := context.Background()
	db := testdb.New(b)
	setLimits(b, db, func(c *limits.Config) { c.GlobalInFlight, c.TenantInFlight = 64, 64 })
	queueJobs(b, db, tenants, jobs)
	var recorded atomic.Int64
	d, err := drainer.New(drainer.Config{DB: db.DB, Executor: &noopSender{}, ID: "bench",
		Observer: drainer.ObserverFuncs{OnRecorded: func(int64) { recorded.Add(1) }}})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Stop(ctx)
	out := make([]time.Duration, 0, passes)
	claimed := 0
	for range passes {
		start := time.Now()
		p, err := d.RunOnce(ctx)
		el := time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		if p.Claimed == 0 {
			b.Fatal("a pass claimed nothing")
		}
		out = append(out, el)
		claimed += p.Claimed
		harness.WaitFor(b, time.Minute, "the pass's outcomes", func() (bool, error) {
			return recorded.Load() >= int64(claimed), nil
		})
	}
	return out, float64(claimed) / passes
}
