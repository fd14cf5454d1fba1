package gate

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
)

// TestExplainWait: each scope that can hold a queued job, in the order they are reported, with
// the estimate each gives.
func TestExplainWait(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	base := config.Default()
	base.GlobalInFlight, base.TenantInFlight = 8, 2
	base.Lanes = map[string]int{"gpu": 1}
	base.TenantTiers = map[string]string{"g": "gold"}
	base.TierInFlight = map[string]int{"gold": 1}
	usage := func(cfg config.Config, units ...config.Unit) config.Usage {
		us := config.NewUsage()
		for _, u := range units {
			us.Add(cfg, u, 1)
		}
		return us
	}
	at := func(d time.Duration) *time.Time { v := now.Add(d); return &v }
	a := config.Unit{Tenant: "a"}
	cases := []struct {
		name    string
		job     job.Job
		edit    func(*config.Config)
		units   []config.Unit
		gated   time.Duration
		ahead   int64
		service time.Duration
		on      string
		until   *time.Time
		est     *time.Time
	}{
		{name: "room now", job: job.Job{Tenant: "a"}, on: job.WaitingNext, est: at(0)},
		{name: "room for the jobs ahead and this one", job: job.Job{Tenant: "a"}, ahead: 1, on: job.WaitingNext, est: at(0)},
		// Cap 2, one in flight, one ahead: the ahead one takes the unit; this one waits for a
		// unit to free, at the tenant's rate of 2 units per 10 s service: 5 s.
		{name: "its own earlier jobs", job: job.Job{Tenant: "a"}, units: []config.Unit{a}, ahead: 1, service: 10 * time.Second,
			on: job.WaitingTenantCap, est: at(5 * time.Second)},
		{name: "tenant cap full", job: job.Job{Tenant: "a"}, units: []config.Unit{a, a}, ahead: 3, service: 10 * time.Second,
			on: job.WaitingTenantCap, est: at(20 * time.Second)},
		{name: "no service time known", job: job.Job{Tenant: "a"}, units: []config.Unit{a, a}, on: job.WaitingTenantCap},
		{name: "global cap full", job: job.Job{Tenant: "a"}, edit: func(c *config.Config) { c.GlobalInFlight = 2 },
			units: []config.Unit{{Tenant: "b"}, {Tenant: "c"}}, service: 6 * time.Second, on: job.WaitingGlobalCap,
			est: at(9 * time.Second)}, // a's share of the 2 units beside b and c: 2/3 a service time
		{name: "tier full", job: job.Job{Tenant: "g"}, units: []config.Unit{{Tenant: "g2"}}, on: job.WaitingTier,
			edit: func(c *config.Config) { c.TenantTiers["g2"] = "gold" }},
		{name: "lane full", job: job.Job{Tenant: "a", Lanes: []string{"gpu"}}, units: []config.Unit{{Tenant: "b", Lanes: []string{"gpu"}}},
			service: time.Second, on: "lane:gpu", est: at(time.Second)},
		{name: "reserve", job: job.Job{Tenant: "a"}, edit: func(c *config.Config) { c.GlobalInFlight, c.InteractiveReserve = 2, 1 },
			units: []config.Unit{{Tenant: "b"}}, on: job.WaitingReserve},
		{name: "paused", job: job.Job{Tenant: "a"}, edit: func(c *config.Config) { c.TenantInFlightOverrides["a"] = 0 },
			service: time.Second, on: job.WaitingPaused},
		{name: "paused globally", job: job.Job{Tenant: "a"}, edit: func(c *config.Config) { c.GlobalInFlight = 0 },
			on: job.WaitingPaused},
		{name: "gated", job: job.Job{Tenant: "a"}, gated: 30 * time.Second, on: job.WaitingRateKey, until: at(30 * time.Second),
			est: at(30 * time.Second)},
		{name: "a gate that has ended", job: job.Job{Tenant: "a"}, gated: -time.Second, on: job.WaitingNext, est: at(0)},
		{name: "not before", job: job.Job{Tenant: "a", NotBefore: at(time.Minute)}, gated: 30 * time.Second, units: []config.Unit{a, a},
			on: job.WaitingNotBefore, until: at(time.Minute)},
		{name: "not before, room then", job: job.Job{Tenant: "a", NotBefore: at(time.Minute)}, on: job.WaitingNotBefore,
			until: at(time.Minute), est: at(time.Minute)},
		{name: "not before passed", job: job.Job{Tenant: "a", NotBefore: at(-time.Minute)}, on: job.WaitingNext, est: at(0)},
		// Weights: a of weight 3 beside b (weight 1) holding a unit gets 3/4 of 8 units, capped
		// at 2 by its own cap.
		{name: "weighted share under its cap", job: job.Job{Tenant: "a"}, units: []config.Unit{a, a, {Tenant: "b"}}, ahead: 1,
			service: 4 * time.Second, edit: func(c *config.Config) { c.TenantWeights = map[string]float64{"a": 3} },
			on: job.WaitingTenantCap, est: at(4 * time.Second)},
	}
	for _, c := range cases {
		cfg := base
		cfg.TenantTiers = map[string]string{"g": "gold"}
		cfg.TenantInFlightOverrides = map[string]int{}
		if c.edit != nil {
			c.edit(&cfg)
		}
		f := waitFacts{cfg: cfg, us: usage(cfg, c.units...), now: now, ahead: c.ahead, service: c.service}
		if c.gated != 0 {
			f.gatedUntil = now.Add(c.gated)
		}
		j := c.job
		j.Status = job.Queued
		explainWait(&j, f)
		if j.WaitingOn != c.on {
			t.Errorf("%s: waiting_on %q, want %q", c.name, j.WaitingOn, c.on)
		}
		if !sameTime(j.WaitingUntil, c.until) {
			t.Errorf("%s: waiting_until %v, want %v", c.name, j.WaitingUntil, c.until)
		}
		if !sameTime(j.EstimatedStart, c.est) {
			t.Errorf("%s: estimated_start %v, want %v", c.name, j.EstimatedStart, c.est)
		}
	}
}

func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Equal(*b)
}
