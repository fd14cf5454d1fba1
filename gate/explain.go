package gate

import (
	"context"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// waitFacts are what explainWait decides from, each read once, outside any transaction: an
// answer to "why is my job waiting" is a snapshot, never a lock.
type waitFacts struct {
	cfg config.Config
	// us is what is in flight: the jobs and the live slots that count.
	us  config.Usage
	now time.Time
	// gatedUntil is the end of the job's rate key's gate, zero when not known to be gated.
	gatedUntil time.Time
	// ahead is how many of its tenant's queued jobs go before it (its position less one).
	ahead int64
	// service is the tenant's recent service time (store.RecentServiceTime), 0 when unknown.
	service time.Duration
}

// explainWait fills in j's WaitingOn, WaitingUntil and EstimatedStart (j is queued). The scope
// is the first that holds the job, in this order: its own not-before (run_at, delay_seconds, an
// executor's 503), a paused limit, its rate key's gate, the first full limit as config.Check
// orders them (global, reserve, tier, tenant, lanes), its tenant's earlier jobs taking the room
// its cap leaves (tenant_cap), else nothing (next).
//
// The estimate is a fluid one: the jobs that need a unit to free first (this one and those ahead
// of it in its tenant, less the units free now) start at the rate the tenant gets units back, its
// concurrency (see concurrency) per service time, counted from the moment its not-before or gate
// ends. A paused limit, or no recent service time, gives none.
func explainWait(j *job.Job, f waitFacts) {
	unit := config.Unit{Tenant: j.Tenant, Lanes: j.Lanes, Interactive: j.Interactive}
	v := f.cfg.Check(f.us, unit)
	free := int64(0)
	if v.OK {
		free = int64(max(min(f.cfg.TenantCap(j.Tenant)-f.us.Tenant[j.Tenant], f.cfg.GlobalInFlight-f.us.Total), 0))
	}
	start := f.now
	until := func(t time.Time) {
		t = t.UTC()
		j.WaitingUntil, start = &t, t
	}
	switch {
	case j.NotBefore != nil && j.NotBefore.After(f.now):
		j.WaitingOn = job.WaitingNotBefore
		until(*j.NotBefore)
	case v.Paused:
		j.WaitingOn = job.WaitingPaused
	case f.gatedUntil.After(f.now):
		j.WaitingOn = job.WaitingRateKey
		until(f.gatedUntil)
	case !v.OK:
		j.WaitingOn = waitingScope(v.Scope)
	case f.ahead >= free:
		j.WaitingOn = job.WaitingTenantCap
	default:
		j.WaitingOn = job.WaitingNext
	}
	if v.Paused {
		return
	}
	behind := f.ahead + 1 - free // this job and those ahead of it that need a unit to free first
	if behind <= 0 {
		est := start.UTC()
		j.EstimatedStart = &est
		return
	}
	if f.service <= 0 {
		return
	}
	wait := time.Duration(float64(f.service) * float64(behind) / concurrency(f.cfg, f.us, unit))
	est := start.Add(wait).UTC()
	j.EstimatedStart = &est
}

// waitingScope names a limits scope as waiting_on does.
func waitingScope(scope string) string {
	switch scope {
	case config.ScopeGlobal:
		return job.WaitingGlobalCap
	case config.ScopeTenant:
		return job.WaitingTenantCap
	case config.ScopeTier:
		return job.WaitingTier
	case config.ScopeReserve:
		return job.WaitingReserve
	}
	if strings.HasPrefix(scope, config.LanePrefix) {
		return scope
	}
	return job.WaitingNext
}

// concurrency is how many units u's tenant can expect to hold while it has a backlog: its cap,
// at most its weighted share of the global cap among the tenants holding units now (itself
// counted), its tier's ceiling and each of its lanes' limits. Tenants with queued work and
// nothing in flight are not counted, so the share leans high.
func concurrency(cfg config.Config, us config.Usage, u config.Unit) float64 {
	mine := cfg.Weight(u.Tenant)
	total := 0.0
	for t, n := range us.Tenant {
		if n > 0 && t != u.Tenant {
			total += cfg.Weight(t)
		}
	}
	c := min(float64(cfg.TenantCap(u.Tenant)), float64(cfg.GlobalInFlight)*mine/(total+mine))
	if n, ok := cfg.TierInFlight[cfg.Tier(u.Tenant)]; ok {
		c = min(c, float64(n))
	}
	for _, l := range u.Lanes {
		c = min(c, float64(cfg.Lanes[l]))
	}
	return max(c, 0.01)
}

// Explain fills in why queued job j waits and when it should start (explainWait): it reads the
// jobs in flight and the live slots (one statement), the tenant's recent service time and, if
// the job has a rate key, its gate (failing open, as the drainer does). j.Position must be
// filled in (Get does).
func (a *Admitter) Explain(ctx context.Context, j *job.Job) error {
	if j.Status != job.Queued {
		return nil
	}
	cfg := a.cfg.Limits.Current().Config
	f := waitFacts{cfg: cfg}
	var err error
	if f.us, err = store.ReadUsage(ctx, a.cfg.DB, cfg); err != nil {
		return a.readErr(err)
	}
	if f.service, _, err = store.RecentServiceTime(ctx, a.cfg.DB, j.Tenant); err != nil {
		return a.readErr(err)
	}
	if j.Position != nil {
		f.ahead = *j.Position - 1
	}
	if f.now, err = a.cfg.Clock.Now(ctx); err != nil {
		return unavailable(err)
	}
	if j.RateKeySHA256 != nil && a.cfg.RateGates != nil {
		f.gatedUntil = a.gates(ctx, []string{*j.RateKeySHA256}, f.now)[*j.RateKeySHA256]
	}
	explainWait(j, f)
	return nil
}
