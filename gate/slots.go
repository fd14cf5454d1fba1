package gate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/outbox"
)

// Slots (SPEC §5a): the decision of a slot request, under the claim lock (store.TakeSlot), with
// the rollout mode, the fair-order rule and the Retry-After estimate; renewal and release.

// Slot lease bounds and default (SPEC §5a), in seconds.
const (
	MinSlotLease     = 5
	MaxSlotLease     = 900
	DefaultSlotLease = 60
)

// SlotRequest is a request for a slot.
type SlotRequest struct {
	Tenant       string   `json:"tenant"`
	Lanes        []string `json:"lanes"`
	Interactive  bool     `json:"interactive"`
	LeaseSeconds int      `json:"lease_seconds"`
	// Aware: the request carried Sluice-Capacity-Aware: true (it handles a refusal), which
	// enforce_for=aware refuses and treats every other request as in shadow.
	Aware bool `json:"-"`
}

// SlotResult is a granted slot and how it was decided.
type SlotResult struct {
	Slot store.Slot
	// Decision is admitted or shadow-refused; empty with the rollout mode off (no headers).
	Decision Decision
	// Verdict is the capacity decision (the headers' figures).
	Verdict config.Verdict
	// RenewEvery is lease / 3, rounded down: how often the caller renews.
	RenewEvery int
}

// SlotRefusal is a refused slot request: the *job.Error of the 429 (capacity_exceeded, with
// scope, paused and retry_after) and the verdict that refused, for the headers.
type SlotRefusal struct {
	Err     *job.Error
	Verdict config.Verdict
}

func (r *SlotRefusal) Error() string { return r.Err.Error() }

// Unwrap lets errors.As find the *job.Error.
func (r *SlotRefusal) Unwrap() error { return r.Err }

// validSlot checks req against cfg: 400 invalid_request naming the field.
func validSlot(req *SlotRequest, cfg config.Config) error {
	if err := job.ValidTenant("tenant", req.Tenant); err != nil {
		return err
	}
	if req.LeaseSeconds == 0 {
		req.LeaseSeconds = DefaultSlotLease
	}
	if req.LeaseSeconds < MinSlotLease || req.LeaseSeconds > MaxSlotLease {
		return job.Invalid("lease_seconds", "lease_seconds must be %d to %d, got %d", MinSlotLease, MaxSlotLease, req.LeaseSeconds)
	}
	if unknown, ok := cfg.Known(req.Lanes); !ok {
		return job.Invalid("lanes", "unknown lane %q (runtime config lanes)", unknown)
	}
	return nil
}

// waitingBound is how many tenants with queued work a grant reads for the fair-order check: one
// more than the tenants that can hold units (at most the global cap of them), and the slot's own
// tenant, so that a tenant with work and nothing in flight is among them if there is one. It
// never grows with the number of tenants with work.
func waitingBound(cfg config.Config) int { return min(cfg.GlobalInFlight, 1000) + 2 }

// TakeSlot decides req for caller under the claim lock and grants it (the slot is written) or
// refuses it (nothing is written): a *SlotRefusal (capacity_exceeded), a *job.Error
// (invalid_request, forbidden when mayActFor refuses the tenant, unavailable), or another error.
// A slot granted past a limit (shadow-refused, or with the rollout mode off) does not count
// (store.Slot.Counted).
func (a *Admitter) TakeSlot(ctx context.Context, caller string, req SlotRequest, mayActFor func(string) bool) (SlotResult, error) {
	cur := a.cfg.Limits.Current().Config
	if err := validSlot(&req, cur); err != nil {
		return SlotResult{}, err
	}
	if mayActFor != nil && !mayActFor(req.Tenant) {
		return SlotResult{}, job.Errorf(job.CodeForbidden, "this token may not act for tenant %q", req.Tenant)
	}
	unit := config.Unit{Tenant: req.Tenant, Lanes: req.Lanes, Interactive: req.Interactive}
	var d slotDecision
	// gated holds the rate keys looked up, true if gated; nil until a lookup. Without a gate
	// store nothing is ever gated, and nothing is looked up.
	var gated map[string]bool
	if a.cfg.RateGates == nil {
		gated = map[string]bool{}
	}
	take := func() (store.SlotState, *store.Slot, error) {
		return store.TakeSlot(ctx, a.cfg.TxDB, store.TakeSlotParams{
			Tenant: req.Tenant, Caller: caller, Lanes: req.Lanes, Interactive: req.Interactive,
			LeaseSeconds: req.LeaseSeconds, WaitingLimit: waitingBound(cur),
			Decide: func(st store.SlotState) store.SlotGrant {
				d = decideSlot(st, unit, req.Aware, gated)
				if !d.grant {
					return store.SlotGrant{}
				}
				detail := slotDetail(d.verdict, req)
				detail["counted"] = d.counted
				raw, _ := json.Marshal(detail)
				return store.SlotGrant{Grant: true, Counted: d.counted, Event: store.AuditEvent{Event: store.EventSlotGranted,
					Tenant: req.Tenant, Actor: caller, Scope: d.verdict.Scope, Detail: raw}}
			}})
	}
	st, slot, err := take()
	if err == nil && len(d.heldBy) > 0 {
		// Held back by queued work whose heads carry rate keys: their gates are read (never under
		// the claim lock) and the slot is decided again, with those known. A gate store that
		// fails leaves them not gated. A refusal that no gated key changes stands as it is.
		gated = map[string]bool{}
		nb, gerr := a.cfg.RateGates.NotBefore(ctx, d.heldBy)
		now, anyGated := a.now(), false
		for _, k := range d.heldBy {
			gated[k] = gerr == nil && nb[k].After(now)
			anyGated = anyGated || gated[k]
		}
		if d.decision != Refused || anyGated {
			st, slot, err = take()
		}
	}
	if err != nil {
		return SlotResult{}, AsUnavailable(err)
	}
	if slot == nil {
		refusal := a.refuseSlot(st, d.verdict)
		a.observeSlot(string(Refused), refusal.Verdict.Scope)
		detail := slotDetail(refusal.Verdict, req)
		detail["retry_after"] = refusal.Err.Detail["retry_after"]
		raw, _ := json.Marshal(detail)
		a.cfg.Audit.Add(store.AuditEvent{Event: store.EventSlotRefused, Tenant: req.Tenant, Actor: caller,
			ErrorCode: string(job.CodeCapacityExceeded), Scope: refusal.Verdict.Scope, Detail: raw})
		return SlotResult{}, refusal
	}
	if st.Config.AdmissionMode != config.ModeOff {
		a.observeSlot(string(d.decision), d.verdict.Scope)
	} else {
		a.observeSlot("off", "")
	}
	res := SlotResult{Slot: *slot, Decision: d.decision, Verdict: d.verdict, RenewEvery: slot.LeaseSeconds / 3}
	if d.decision == "" {
		res.Verdict = config.Verdict{} // off: no headers, and no figures to show
	}
	return res, nil
}

// slotDetail is the audit detail of a slot decision: the limits and counts that decided it.
func slotDetail(v config.Verdict, req SlotRequest) map[string]any {
	return map[string]any{"limit": v.Limit, "in_flight": v.InFlight, "tier": v.Tier, "tier_limit": v.TierLimit,
		"tier_in_flight": v.TierInFlight, "lanes": req.Lanes, "interactive": req.Interactive,
		"lease_seconds": req.LeaseSeconds, "aware": req.Aware}
}

// slotDecision is what decideSlot decided.
type slotDecision struct {
	// decision is admitted, shadow-refused or refused; empty with the rollout mode off.
	decision Decision
	// verdict is the capacity decision: the headers' figures, and the scope that refused.
	verdict config.Verdict
	// grant: the slot is written. counted: it counts against the limits.
	grant, counted bool
	// heldBy, when not empty, are the rate keys at the heads of the tenants waiting ahead that
	// held the slot back by the fair-order rule and whose gates were not looked up: nothing is
	// granted yet, decision says what would be without a gated key, and the caller looks them up
	// and decides again.
	heldBy []string
}

// decideSlot is the decision of a slot for unit on what the grant read under the claim lock.
//
// A slot counts against the limits only when it fits them all and the fair-order rule: what
// enforce would grant. Such a slot is admitted in every mode (with the mode off, granted without
// a decision). A slot that does not fit is refused with enforce (enforce_for all, or an aware
// request); otherwise (shadow, or enforce_for=aware and a request that is not aware, or the mode
// off) it is granted but does not count, shadow-refused: the caller's work goes ahead, as it
// would without sluice, and it takes nothing the claim gives the queue (SPEC §5a: the caps stay
// exact for the jobs in flight and the slots that count). Counted, such slots let one producer
// that loops grants fill the global cap so that no queued job ever starts.
func decideSlot(st store.SlotState, unit config.Unit, aware bool, gated map[string]bool) slotDecision {
	cfg := st.Config
	d := slotDecision{verdict: cfg.Check(st.Usage, unit)}
	if d.verdict.OK {
		var blocked bool
		if blocked, d.heldBy = jumpsQueue(cfg, st, unit, gated); blocked {
			d.verdict.OK, d.verdict.Paused = false, false
			d.verdict.Scope, d.verdict.Limit, d.verdict.InFlight = config.ScopeGlobal, cfg.GlobalInFlight, st.Usage.Total
		}
	}
	switch {
	case d.verdict.OK:
		d.decision, d.grant, d.counted = Admitted, true, true
	case cfg.AdmissionMode == config.ModeEnforce && (cfg.EnforceFor == config.EnforceAll || aware):
		d.decision = Refused
	default:
		d.decision, d.grant = ShadowRefused, true
	}
	if cfg.AdmissionMode == config.ModeOff {
		d.decision = ""
	}
	if len(d.heldBy) > 0 {
		d.grant, d.counted = false, false
	}
	return d
}

// jumpsQueue is the fair-order rule of SPEC §5a: a slot does not take the capacity that queued
// work the claim would start first needs. The tenants waiting ahead are those with queued work
// whose oldest job is due and not known gated, below their cap with a lower in flight ÷ weight
// than the slot's tenant (fair order); the slot is refused when the capacity left (global, and for a
// non-interactive slot what the reserve leaves) is no more than one unit for each of them. An
// interactive slot within the reserve is exempt.
//
// Only each waiting tenant's oldest job is looked at (its queue state's head), as the status
// does. Gates live in memcached, which is never asked under the claim lock: gated holds the keys
// looked up, true if gated (nil: none looked up yet). When the slot is held back while none was
// looked up, it returns the rate keys of the heads ahead (see slotDecision.heldBy); once they
// were, a key not among them (a head that came since) is taken as not gated.
func jumpsQueue(cfg config.Config, st store.SlotState, unit config.Unit, gated map[string]bool) (bool, []string) {
	us := st.Usage
	if unit.Interactive && cfg.InteractiveReserve > 0 && us.Interactive < cfg.InteractiveReserve {
		return false, nil
	}
	mine := us.Tenant[unit.Tenant]
	ahead := 0
	var keys []string
	for _, w := range st.Waiting {
		if n := us.Tenant[w.Tenant]; !w.Due || !cfg.FairBefore(w.Tenant, n, unit.Tenant, mine) || n >= cfg.TenantCap(w.Tenant) || gated[w.HeadRateKey] {
			continue
		}
		ahead++
		if gated == nil && w.HeadRateKey != "" {
			keys = append(keys, w.HeadRateKey)
		}
	}
	if ahead == 0 {
		return false, nil
	}
	room := cfg.GlobalInFlight - us.Total
	if !unit.Interactive && cfg.InteractiveReserve > 0 {
		room = min(room, cfg.GlobalInFlight-cfg.InteractiveReserve-(us.Total-us.Interactive))
	}
	if room > ahead {
		return false, nil
	}
	return true, keys
}

// refuseSlot is the refusal of a slot: 120 s while the refusing limit is paused, else
// min(30, 5 × (ahead + 1)) with ahead the tenant's queued jobs plus the slot requests refused in
// the same scope in the last 5 s (this process's, an estimate).
func (a *Admitter) refuseSlot(st store.SlotState, v config.Verdict) *SlotRefusal {
	after := 120
	if !v.Paused {
		recent := a.slotRefusals.note(v.Scope, a.now())
		after = min(30, 5*(st.TenantQueued+recent+1))
	}
	return &SlotRefusal{Verdict: v, Err: &job.Error{Code: job.CodeCapacityExceeded,
		Message: fmt.Sprintf("no capacity for a slot: the %s limit is %s", v.Scope, map[bool]string{true: "paused", false: "full"}[v.Paused]),
		Detail:  map[string]any{"scope": v.Scope, "paused": v.Paused, "retry_after": after}}}
}

func (a *Admitter) now() time.Time {
	t, err := a.cfg.Clock.Now(context.Background())
	if err != nil {
		return time.Now()
	}
	return t
}

// recentRefusals counts the slot requests each scope refused in the last refusalWindow, up to
// refusalCount (beyond it Retry-After is at its 30 s ceiling anyway). Safe for concurrent use.
type recentRefusals struct {
	mu     sync.Mutex
	scopes map[string][]time.Time // the latest refusals of each scope, oldest first
}

const (
	refusalWindow = 5 * time.Second
	refusalCount  = 6
)

// note records a refusal in scope at now and returns how many came before it in the window.
func (r *recentRefusals) note(scope string, now time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.scopes == nil {
		r.scopes = map[string][]time.Time{}
	}
	var kept []time.Time
	for _, t := range r.scopes[scope] {
		if now.Sub(t) < refusalWindow {
			kept = append(kept, t)
		}
	}
	n := len(kept)
	kept = append(kept, now)
	if len(kept) > refusalCount {
		kept = kept[len(kept)-refusalCount:]
	}
	r.scopes[scope] = kept
	// The map holds a key per scope a refusal named: global, reserve, tier, tenant and the
	// configured lanes, so it stays small.
	return n
}

// observeSlot counts one slot decision.
func (a *Admitter) observeSlot(decision, scope string) {
	if a.cfg.Metrics == nil || a.cfg.Metrics.SlotDecisions == nil {
		return
	}
	a.cfg.Metrics.SlotDecisions.WithLabelValues(decision, scope).Inc()
}

// RenewSlot extends slot id's lease by its own lease_seconds. not_found: no such slot, or
// another caller's (admin may renew any); slot_lost: its lease ran out (never revived), audited
// as slot_renew_failed.
func (a *Admitter) RenewSlot(ctx context.Context, caller string, admin bool, id int64) (store.Slot, error) {
	s, err := store.RenewSlot(ctx, a.cfg.TxDB, id, caller, admin)
	switch {
	case errors.Is(err, store.ErrSlotNotFound):
		return s, job.Errorf(job.CodeNotFound, "no such slot")
	case errors.Is(err, store.ErrSlotLost):
		sid := strconv.FormatInt(id, 10)
		detail, _ := json.Marshal(map[string]any{"expires_at": s.ExpiresAt, "lease_seconds": s.LeaseSeconds})
		a.cfg.Audit.Add(store.AuditEvent{Event: store.EventSlotRenewFailed, Tenant: s.Tenant, SlotID: &sid,
			Actor: caller, ErrorCode: string(job.CodeSlotLost), Detail: detail})
		return s, job.Errorf(job.CodeSlotLost, "the slot's lease ran out at %s; it is gone and is not revived: take a new one",
			s.ExpiresAt.UTC().Format(time.RFC3339Nano))
	case err != nil:
		return s, AsUnavailable(err)
	}
	return s, nil
}

// ReleaseSlot deletes slot id (idempotent: a slot already gone is no error) and, if it counted,
// pokes the drainers: the poke goes through Config.Published at once (a drainer in this process
// claims without waiting for the relay). Another caller's slot (an admin may release any) is left
// alone and answered as a slot already gone, Found false and no error: a not_found there would
// tell a caller which ids are other callers' live slots, and to the caller that never held it,
// that slot is no more its own after the call than before, which is all a release promises.
func (a *Admitter) ReleaseSlot(ctx context.Context, caller string, admin bool, id int64) (store.Released, error) {
	now, err := a.cfg.Clock.Now(ctx)
	if err != nil {
		return store.Released{}, AsUnavailable(err)
	}
	r, err := a.store.ReleaseSlot(ctx, a.cfg.TxDB, clock.Trunc(now), id, caller, admin)
	switch {
	case errors.Is(err, store.ErrSlotNotFound):
		a.cfg.Log.Info("a release named another caller's slot; nothing released", "slot_id", id, "caller", caller)
		return store.Released{}, nil
	case err != nil:
		return r, AsUnavailable(err)
	}
	if r.Found && r.Slot.Counted && a.cfg.Published != nil {
		a.cfg.Published([]outbox.Row{r.Poke})
	}
	return r, nil
}

// ListSlots returns a page of slots, newest first, and the cursor of the next page (0: none).
func (a *Admitter) ListSlots(ctx context.Context, tenant string, before int64, limit int) ([]store.Slot, int64, error) {
	out, err := store.ListSlots(ctx, a.cfg.DB, store.SlotFilter{Tenant: tenant, Before: before, Limit: limit + 1})
	if err != nil {
		return nil, 0, AsUnavailable(err)
	}
	var next int64
	if len(out) > limit {
		out = out[:limit]
		next = out[limit-1].ID
	}
	return out, next, nil
}
