package gate

import (
	"errors"
	"maps"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// Admission's and a slot's decision cores (decide, decideSlot), called one request at a time on
// a state the caller keeps instead of one read under the tenants' locks: `sluice simulate`
// (drainer/simulate) replays arrivals through them on a virtual clock, so that what it predicts
// is decided by the code that decides in production.

// Queues is what admission's checks read for one transaction's requests: the queue's depths,
// which the depth caps and immediate-or-refuse compare, and what is in flight.
type Queues struct {
	Now time.Time
	// TenantDepth holds the queued jobs (scheduled ones included) of the requests' tenants,
	// TenantInteractive how many of them are interactive. Admissions reads them, never writes.
	TenantDepth       map[string]int
	TenantInteractive map[string]int
	GlobalDepth       int
	Usage             config.Usage // jobs in flight and live slots; left as it was
}

// Reserve takes up to n units of tenant's admission rate budget at the time of the decision, as
// the limiter (admitrate) does: it returns those granted and the seconds until the budget's window
// resets.
type Reserve func(tenant string, n int) (granted, retryAfter int)

// Outcome is the decision on one request.
type Outcome struct {
	Decision Decision // empty with the rollout mode off
	// Queued: the job is written queued (admitted, shadow-refused, or with the mode off).
	Queued bool
	// Code and Scope name a refusal: queue_full with the depth cap's scope, rate_limited, or
	// capacity_exceeded with the limit's scope.
	Code  job.Code
	Scope string
}

// Decider decides the admissions of one transaction at a time (Admissions), reusing its memory
// between them. Not safe for concurrent use; the zero value is ready.
type Decider struct {
	st    *state
	its   []item
	items []*item
	outs  []Outcome
}

// Admissions decides reqs, valid requests, as one admission transaction decides its items with q
// read under their tenants' locks: each tenant's rate units are reserved for all of its requests
// first (reserve; nil when the rate limit does not apply), then the depth caps and
// immediate-or-refuse go item after item (SPEC §5), each item seeing the earlier items' effect.
// It returns each request's outcome (valid until the next call) and the rate units to give back
// per tenant, those reserved by requests it refused.
func (d *Decider) Admissions(cfg config.Config, q Queues, reqs []Request, reserve Reserve) ([]Outcome, map[string]int) {
	if d.st == nil {
		d.st = newState()
	}
	st := d.st
	clear(st.tenantDepth)
	clear(st.tenantInteractive)
	clear(st.tenantInFlight)
	clear(st.replaceable)
	st.now, st.globalDepth, st.usage, st.rate = q.Now, q.GlobalDepth, q.Usage, nil
	d.its, d.items = d.its[:0], d.items[:0]
	immediate := false
	for _, r := range reqs {
		d.its = append(d.its, item{req: r})
		st.tenantDepth[r.Tenant] = q.TenantDepth[r.Tenant]
		st.tenantInteractive[r.Tenant] = q.TenantInteractive[r.Tenant]
		st.tenantInFlight[r.Tenant] = q.Usage.Tenant[r.Tenant]
		immediate = immediate || r.Queue != nil && !*r.Queue
	}
	for i := range d.its {
		d.items = append(d.items, &d.its[i])
	}
	if immediate {
		// immediate-or-refuse counts each job it admits in flight for the items after it, in
		// the usage's maps: decide on a copy, so that q.Usage is left as it was.
		st.usage = copyUsage(q.Usage)
	}
	if reserve != nil {
		for _, c := range rateCharges(d.items, cfg) {
			g, retry := reserve(c.tenant, c.n)
			if st.rate == nil {
				st.rate = map[string]rateGrant{}
			}
			st.rate[c.tenant] = rateGrant{granted: g, retryAfter: retry}
		}
	}
	refund := decide(d.items, cfg, st)
	d.outs = d.outs[:0]
	for _, it := range d.items {
		o := Outcome{Decision: it.res.Decision, Queued: it.insert && it.scope == ""}
		switch {
		case it.scope != "":
			o.Code, o.Scope = job.CodeQueueFull, it.scope
		case it.err != nil:
			var je *job.Error
			if errors.As(it.err, &je) {
				o.Code = je.Code
				if je.Code == job.CodeCapacityExceeded {
					o.Scope = it.res.Verdict.Scope
				}
			}
		}
		d.outs = append(d.outs, o)
	}
	return d.outs, refund
}

func copyUsage(us config.Usage) config.Usage {
	c := us
	c.Tenant, c.Tier, c.Lane = maps.Clone(us.Tenant), maps.Clone(us.Tier), maps.Clone(us.Lane)
	return c
}

// SlotWaiting is a tenant with queued work, for a slot's fair-order rule: its oldest job is due
// (Due) or not yet.
type SlotWaiting = store.Waiting

// SlotOutcome is the decision on one slot request: Grant whether it is granted, Counted whether
// it counts against the limits (only a slot that fits them does).
type SlotOutcome struct {
	Decision Decision
	Grant    bool
	Counted  bool
	Scope    string // the refusing limit, when refused
}

// SlotWaitingLimit is how many tenants with queued work a slot's grant reads (waitingBound):
// a caller keeping the queues passes DecideSlot no more.
func SlotWaitingLimit(cfg config.Config) int { return waitingBound(cfg) }

// DecideSlot decides a slot for unit, as a slot request does under the claim lock, with us in
// flight and waiting the tenants with queued work (rate keys taken as not gated).
func DecideSlot(cfg config.Config, us config.Usage, waiting []SlotWaiting, unit config.Unit, aware bool) SlotOutcome {
	d := decideSlot(store.SlotState{Config: cfg, Usage: us, Waiting: waiting}, unit, aware, map[string]bool{})
	o := SlotOutcome{Decision: d.decision, Grant: d.grant, Counted: d.counted}
	if !d.verdict.OK {
		o.Scope = d.verdict.Scope
	}
	return o
}
