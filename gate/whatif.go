package gate

import (
	"errors"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/limits"
	"github.com/sluicehq/sluice/gate/store"
)

// Admission's and a slot's decision cores (decide, decideSlot), called one request at a time on
// a state the caller keeps instead of one read under the tenants' locks: `sluice simulate`
// (drainer/simulate) replays arrivals through them on a virtual clock, so that what it predicts
// is decided by the code that decides in production.

// Queues is what admission's checks read for one request: the queue's depths, which the depth
// caps and immediate-or-refuse compare, and what is in flight.
type Queues struct {
	Now               time.Time
	TenantDepth       int // the request's tenant's queued jobs, scheduled ones included
	TenantInteractive int // how many of them are interactive
	GlobalDepth       int
	Usage             limits.Usage // jobs in flight and live slots
}

// RateAnswer is the request's tenant's admission rate reservation: Limited when the tenant's
// limit applies (the limit is set and the rollout mode is not off), Granted whether it has the
// request's unit, and RetryAfter the seconds until its window resets.
type RateAnswer struct {
	Limited    bool
	Granted    bool
	RetryAfter int
}

// Outcome is the decision on one request.
type Outcome struct {
	Decision Decision // empty with the rollout mode off
	// Queued: the job is written queued (admitted, shadow-refused, or with the mode off).
	Queued bool
	// Code and Scope name a refusal: queue_full with the depth cap's scope, rate_limited, or
	// capacity_exceeded with the limit's scope.
	Code  job.Code
	Scope string
	// Refund: the rate unit the request reserved goes back (it was refused after reserving).
	Refund bool
}

// RateLimited reports whether cfg charges a request of tenant to the admission rate limit.
func RateLimited(cfg limits.Config) bool {
	return cfg.AdmissionRatePerMinute > 0 && cfg.AdmissionMode != limits.ModeOff
}

// Decider decides admissions one at a time (Admission), reusing its state between them. Not
// safe for concurrent use; the zero value is ready.
type Decider struct {
	st    *state
	it    item
	items [1]*item
	rate  map[string]rateGrant
}

// Admission decides req, a valid request, as the admission of one item does with q read under
// its tenant's lock and its rate reservation rate. q.Usage is left as it was.
func (d *Decider) Admission(cfg limits.Config, q Queues, req Request, rate RateAnswer) Outcome {
	if d.st == nil {
		d.st = newState()
	}
	st := d.st
	clear(st.tenantDepth)
	clear(st.tenantInteractive)
	clear(st.tenantInFlight)
	clear(st.replaceable)
	d.it = item{req: req}
	it := &d.it
	st.now = q.Now
	st.tenantDepth[req.Tenant] = q.TenantDepth
	st.tenantInteractive[req.Tenant] = q.TenantInteractive
	st.tenantInFlight[req.Tenant] = q.Usage.Tenant[req.Tenant]
	st.globalDepth = q.GlobalDepth
	st.usage = q.Usage
	st.rate = nil
	if rate.Limited {
		g := rateGrant{retryAfter: rate.RetryAfter}
		if rate.Granted {
			g.granted = 1
		}
		if d.rate == nil {
			d.rate = map[string]rateGrant{}
		}
		clear(d.rate)
		d.rate[req.Tenant] = g
		st.rate = d.rate
	}
	d.items[0] = it
	refund := decide(d.items[:], cfg, st)
	if st.usage.Total != q.Usage.Total {
		// immediate-or-refuse counted the job in flight for the batch's later items, in q.Usage's
		// maps: give them back as they were.
		st.usage.Add(cfg, req.unit(), q.Usage.Total-st.usage.Total)
	}
	o := Outcome{Decision: it.res.Decision, Queued: it.insert && it.scope == "", Refund: refund[req.Tenant] > 0}
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
	return o
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

// DecideSlot decides a slot for unit, as a slot request does under the claim lock, with us in
// flight and waiting the tenants with queued work (rate keys taken as not gated).
func DecideSlot(cfg limits.Config, us limits.Usage, waiting []SlotWaiting, unit limits.Unit, aware bool) SlotOutcome {
	d := decideSlot(store.SlotState{Config: cfg, Usage: us, Waiting: waiting}, unit, aware, map[string]bool{})
	o := SlotOutcome{Decision: d.decision, Grant: d.grant, Counted: d.counted}
	if !d.verdict.OK {
		o.Scope = d.verdict.Scope
	}
	return o
}
