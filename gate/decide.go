package gate

import (
	"bytes"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// The decision core: admission's rules of SPEC §5 as functions of the request items, the
// runtime configuration and the state one transaction read under its tenants' locks. They do
// no I/O and read no clock (the database's time comes in the state), so that each rule is
// tested on its own (decide_test.go). The runner (runner.go) reads the state, takes the
// rate-limit reservations, writes what the core decided and settles the reservations; the
// core runs in the order of SPEC §5's checks:
//
//  1. replays: items whose idempotency key names a job or an earlier item, and redrives done;
//  2. rateCharges: what the pending items ask of each tenant's admission rate limit, which the
//     runner reserves into state.rate;
//  3. decide: the rate limit, the depth caps and immediate-or-refuse, item after item, each
//     seeing the earlier items' effect on the depths and free slots.
//
// Validation (and the producer's tenant scope) came before: an item with invalid set is never
// decided.

// item is one admission being decided. The fields below "decided" are reset by every
// transaction attempt.
type item struct {
	req      Request
	invalid  error   // validation or scope failure, decided before any transaction
	hash     *string // rate key SHA-256 hex
	fp       []byte
	retryOf  *int64 // a redrive
	noRate   bool   // exempt from the admission rate limit (redrive: an operator's action)
	caller   string
	actor    string // who decided, for the audit trail, when not caller (a redrive's operator)
	gatedFor int    // seconds the rate key stays gated (queue=false), 0 if not gated
	// service is, for refuse_if_late, its tenant's recent service time (0: unknown), read
	// before the transaction (serviceTimes).
	service time.Duration
	// replaces is, for an item with a replace key that is inserted queued, the queued job it
	// replaces: a job of the table, or an earlier item of the same batch. replacedBy is set on
	// that earlier item.
	replaces   replaceable
	replacedBy *item

	// decided
	res      Result
	err      error
	insert   bool
	scope    string // depth cap that refused it: a rejected row
	reserved bool   // holds one unit of its tenant's rate reservation
	dupOf    *item  // an earlier item of the same batch with the same idempotency key
	shadow   shadowed
	id       int64
	outboxID int64 // its enqueue poke's row; 0 when a later job of its tenant carries the poke
	// at is the state's clock reading when the item was decided (its queued_at, if it is
	// written): the instant of a refusal's audit event.
	at time.Time
}

// shadowed records the refusals shadow mode let through, for the runner to log.
type shadowed struct {
	rate      bool
	scope     string // depth cap
	immediate bool
}

func (it *item) reset() {
	it.res, it.err, it.insert, it.scope, it.reserved, it.dupOf, it.shadow, it.id, it.outboxID =
		Result{}, nil, false, "", false, nil, shadowed{}, 0, 0
	it.replaces, it.replacedBy, it.at = replaceable{}, nil, time.Time{}
}

// replaceable is the queued job that has a tenant's replace key: a row locked in the
// transaction, or an item of it to be inserted queued. Neither: none.
type replaceable struct {
	row  *store.Row
	item *item
}

func (r replaceable) some() bool { return r.row != nil || r.item != nil }

func (it *item) pending() bool {
	return it.invalid == nil && it.err == nil && !it.insert && !it.res.Replayed && it.dupOf == nil
}

// state is what one admission transaction reads under its tenants' locks, plus the rate-limit
// reservations taken after that read.
type state struct {
	now         time.Time // the database's UTC_TIMESTAMP(6)
	tenantDepth map[string]int
	// tenantInteractive counts each tenant's interactive queued jobs: all that is ahead of an
	// interactive job of that tenant.
	tenantInteractive map[string]int
	tenantInFlight    map[string]int
	globalDepth       int
	noHeadAfterNow    bool // store.AdmissionState.NoHeadAfterNow
	// usage is what is in flight (read unless the rollout mode is off), plus the queue=false
	// jobs this transaction admitted: each was promised a unit, so the next one's "could be
	// claimed now" counts them as in flight.
	usage    config.Usage
	keyed    map[string]*store.Row // by tenant+"\x00"+idempotency key
	redriven map[int64]*store.Row  // retry_of → the job an earlier redrive created
	// replaceable holds, by tenant and replace key (keyOf), the queued job that has it: read
	// (store.LockReplaceable), then each item decided to replace it.
	replaceable map[string]replaceable
	// rate holds each tenant's rate-limit reservation; a tenant without one is not limited
	// (no limit, no limiter, or the limiter failed: fail open). Nil until the first one.
	rate map[string]rateGrant
}

// rateGrant is the outcome of one tenant's rate-limit reservation.
type rateGrant struct {
	granted    int // units granted, to the tenant's first pending items
	retryAfter int // seconds until the budget has room, for the refused ones
}

func newState() *state {
	return &state{tenantDepth: map[string]int{}, tenantInteractive: map[string]int{}, tenantInFlight: map[string]int{}, usage: config.NewUsage(),
		keyed: map[string]*store.Row{}, redriven: map[int64]*store.Row{}, replaceable: map[string]replaceable{}}
}

func keyOf(tenant, key string) string { return tenant + "\x00" + key }

// replays decides the items whose idempotency key already names a job (or an earlier item of
// the same batch), and redrives already done. A replay answers like the admission it repeats,
// capacity headers included (SPEC §5), with the tenant's cap and in-flight count as they are
// now. The replayed job carries no position: the runner reads it (replayPositions).
func replays(items []*item, cfg config.Config, st *state) {
	replayed := func(j job.Job) Result {
		r := Result{Job: j, Replayed: true}
		if cfg.AdmissionMode != config.ModeOff {
			r.Decision, r.Limit, r.InFlight = Admitted, cfg.TenantCap(j.Tenant), st.tenantInFlight[j.Tenant]
			r.Verdict = cfg.Check(st.usage, config.Unit{Tenant: j.Tenant, Lanes: j.Lanes, Interactive: j.Interactive})
		}
		return r
	}
	inBatch := map[string]*item{}
	for _, it := range items {
		if it.invalid != nil {
			continue
		}
		if it.retryOf != nil {
			if r, ok := st.redriven[*it.retryOf]; ok {
				it.res = replayed(r.Job)
			}
			continue
		}
		if it.req.IdempotencyKey == nil {
			continue
		}
		k := keyOf(it.req.Tenant, *it.req.IdempotencyKey)
		if r, ok := st.keyed[k]; ok {
			switch {
			case r.Caller != it.caller:
				it.err = job.Errorf(job.CodeForbidden, "the idempotency key belongs to another caller")
			case !bytes.Equal(r.RequestSHA256, it.fp):
				it.err = &job.Error{Code: job.CodeIdempotencyConflict,
					Message: "the idempotency key was used with a different request",
					Detail:  map[string]any{"id": r.ID}}
			default:
				it.res = replayed(r.Job)
			}
			continue
		}
		if first, ok := inBatch[k]; ok {
			if first.caller != it.caller || !bytes.Equal(first.fp, it.fp) {
				it.err = &job.Error{Code: job.CodeIdempotencyConflict,
					Message: "the idempotency key was used with a different request earlier in this batch"}
			} else {
				it.dupOf = first
			}
			continue
		}
		inBatch[k] = it
	}
}

// rateCharge is how many units of its admission rate limit a tenant's pending items ask for.
type rateCharge struct {
	tenant string
	n      int
}

// rateCharges returns, in order of first appearance, the units each tenant's pending items
// need: one per item (SPEC §5: charged only for admissions that commit; decide refunds the
// units of items it does not admit). Redrives are exempt. Nothing is charged while the limit
// is off (0) or the rollout mode is off.
func rateCharges(items []*item, cfg config.Config) []rateCharge {
	if cfg.AdmissionRatePerMinute <= 0 || cfg.AdmissionMode == config.ModeOff {
		return nil
	}
	var out []rateCharge
	at := map[string]int{}
	for _, it := range items {
		if !it.pending() || it.noRate {
			continue
		}
		i, ok := at[it.req.Tenant]
		if !ok {
			i = len(out)
			at[it.req.Tenant] = i
			out = append(out, rateCharge{tenant: it.req.Tenant})
		}
		out[i].n++
	}
	return out
}

// decide applies the admission rate limit (st.rate), the depth caps and immediate-or-refuse to
// the pending items, in order: an admitted item counts in its tenant's and the global depth
// (and, for queue=false, in what is in flight) for the items after it. In shadow mode a refusal
// is recorded (it.shadow, Decision shadow-refused) and the item admitted; so is a capacity
// refusal of a request that did not say it handles one while enforce_for is aware (SPEC §5a);
// in off mode nothing is checked. Every item decided (not in off mode) carries the capacity
// verdict its headers show. It returns the units of each tenant's reservation held by items it
// refused (nil if none), which the runner refunds.
func decide(items []*item, cfg config.Config, st *state) (refund map[string]int) {
	for _, it := range items {
		if it.invalid == nil {
			it.at = st.now // a duplicate answered like its first item is audited at its instant too
		}
	}
	limitRate(items, cfg, st)
	d := decider{cfg: cfg, st: st, off: cfg.AdmissionMode == config.ModeOff, enforce: cfg.AdmissionMode == config.ModeEnforce}
	for _, it := range items {
		if it.pending() {
			d.decideItem(it)
		}
	}
	return d.refund
}

// decider is one decide call: the configuration and the state its items change in turn.
type decider struct {
	cfg          config.Config
	st           *state
	off, enforce bool
	refund       map[string]int
}

// decideItem decides one pending item: its capacity verdict, the depth caps, immediate-or-refuse
// and refuse_if_late, and, if it is inserted, its effect on the depths the next items see.
func (d *decider) decideItem(it *item) {
	cfg, st, t := d.cfg, d.st, it.req.Tenant
	it.res.Limit, it.res.InFlight = cfg.TenantCap(t), st.tenantInFlight[t]
	if !d.off {
		it.res.Verdict = cfg.Check(st.usage, it.req.unit())
	}
	shadow := it.res.Decision == ShadowRefused
	// A replacement takes its predecessor's place in the queue: the depth it adds is none.
	var target replaceable
	if it.req.ReplaceKey != nil {
		target = st.replaceable[keyOf(t, *it.req.ReplaceKey)]
	}
	d.leave(target, t, 1)
	if scope := depthScope(cfg, t, st); scope != "" && !d.off {
		if d.enforce {
			d.leave(target, t, -1)
			it.scope, it.insert = scope, true
			d.refuse(it)
			return
		}
		shadow, it.shadow.scope = true, scope
	}
	if !d.off && it.req.Queue != nil && !*it.req.Queue {
		refused, shadowed := d.immediateOrRefuse(it)
		if refused {
			return
		}
		shadow = shadow || shadowed
	}
	if it.req.refuseIfLate() {
		if err := lateError(it, cfg, st); err != nil {
			it.err = err // not a capacity decision: the headers stay the verdict's
			d.leave(target, t, -1)
			d.giveBack(it)
			return
		}
	}
	d.admit(it, shadow, target)
}

// immediateOrRefuse applies immediate-or-refuse to a queue=false item: it refuses the item (refused)
// when a limit that applies has no free unit and the refusal is enforced; otherwise the item
// takes its unit of what is in flight, shadowed if it would have been refused.
func (d *decider) immediateOrRefuse(it *item) (refused, shadowed bool) {
	cfg, st, t := d.cfg, d.st, it.req.Tenant
	if scope, err := immediate(it.res.Verdict, it.req.unit(), st, it.gatedFor); err != nil {
		it.res.Verdict.Scope = scope
		if scope == config.ScopeTenant {
			it.res.Verdict.Limit, it.res.Verdict.InFlight = cfg.TenantCap(t), st.usage.Tenant[t]
		}
		if d.enforce && (cfg.EnforceFor != config.EnforceAware || it.req.Aware) {
			it.err = err
			d.refuse(it)
			return true, false
		}
		shadowed, it.shadow.immediate = true, true
	}
	st.usage.Add(cfg, it.req.unit(), 1)
	return false, shadowed
}

// admit inserts the item, queued, with its decision, in its replace target's place if it has
// one, and counts it in the depths.
func (d *decider) admit(it *item, shadow bool, target replaceable) {
	st, t := d.st, it.req.Tenant
	switch {
	case d.off:
		it.res.Decision = ""
	case shadow:
		it.res.Decision = ShadowRefused
	default:
		it.res.Decision = Admitted
	}
	it.insert = true
	if target.some() {
		it.replaces = target
		if target.item != nil {
			target.item.replacedBy = it
		}
	}
	if it.req.ReplaceKey != nil {
		st.replaceable[keyOf(t, *it.req.ReplaceKey)] = replaceable{item: it}
	}
	st.tenantDepth[t]++
	if it.req.interactive() {
		st.tenantInteractive[t]++
	}
	st.globalDepth++
	if it.req.due(st.now).IsZero() {
		// A scheduled job's place is among the jobs due before it: GET /v1/jobs/{id} reads
		// it. This one counts the tenant's scheduled jobs as ahead of it.
		pos := int64(st.tenantDepth[t])
		it.res.Job.Position = &pos
	}
}

// leave takes n from the tenant's and the global depth when the item replaces a queued job
// (n = -1 puts it back): the replacement adds no depth.
func (d *decider) leave(target replaceable, tenant string, n int) {
	if target.some() {
		d.st.tenantDepth[tenant] -= n
		d.st.globalDepth -= n
	}
}

// refuse refuses the item and gives back its rate reservation.
func (d *decider) refuse(it *item) {
	it.res.Decision = Refused
	d.giveBack(it)
}

// giveBack returns the unit of its tenant's rate reservation the item holds, if any.
func (d *decider) giveBack(it *item) {
	if it.reserved {
		it.reserved = false
		if d.refund == nil {
			d.refund = map[string]int{}
		}
		d.refund[it.req.Tenant]++
	}
}

// lateError is deadline_unreachable when it's start_by cannot be met: it is at or before the
// job's due time (now, or its run_at), or, for a job due now, its estimated start is: the jobs
// queued ahead of it in its tenant (its depth, scheduled ones included, so an over-estimate)
// beyond the tenant's free capacity, in waves of the tenant's cap, each as long as the tenant's
// recent service time. With no service time known (no job of the tenant finished lately) only
// the due time counts; a tenant whose cap is 0 never starts a job.
func lateError(it *item, cfg config.Config, st *state) error {
	startBy := *it.req.startBy()
	est := it.req.due(st.now)
	if est.IsZero() {
		est = st.now
		t := it.req.Tenant
		limit := cfg.TenantCap(t)
		if limit <= 0 {
			est = startBy // paused: never, as far as admission can tell
		} else if over := st.tenantDepth[t] - (limit - st.tenantInFlight[t]) + 1; over > 0 && it.service > 0 {
			waves := (over + limit - 1) / limit
			est = st.now.Add(time.Duration(waves) * it.service)
		}
	}
	if est.Before(startBy) {
		return nil
	}
	return &job.Error{Code: job.CodeDeadlineUnreachable, Message: "the job cannot start by its start_by",
		Detail: map[string]any{"start_by": startBy.UTC().Format(job.TimeFormat), "estimated_start": est.UTC().Format(job.TimeFormat)}}
}

// limitRate gives each tenant's pending items the units of its reservation in order; the items
// beyond them are refused with rate_limited, or, in shadow mode, marked and let through.
func limitRate(items []*item, cfg config.Config, st *state) {
	if cfg.AdmissionRatePerMinute <= 0 || cfg.AdmissionMode == config.ModeOff {
		return
	}
	used := map[string]int{}
	for _, it := range items {
		if !it.pending() || it.noRate {
			continue
		}
		t := it.req.Tenant
		g, ok := st.rate[t]
		if !ok {
			continue
		}
		if used[t] < g.granted {
			used[t]++
			it.reserved = true
			continue
		}
		if cfg.AdmissionMode == config.ModeEnforce {
			it.err = &job.Error{Code: job.CodeRateLimited, Message: "the tenant's admission rate limit is spent",
				Detail: map[string]any{"retry_after": g.retryAfter, "limit_per_minute": cfg.AdmissionRatePerMinute}}
			it.res = Result{Decision: Refused, Limit: cfg.TenantCap(t), InFlight: st.tenantInFlight[t],
				Verdict: cfg.Check(st.usage, it.req.unit())}
		} else {
			it.res.Decision = ShadowRefused
			it.shadow.rate = true
		}
	}
}

// depthScope names the depth cap (SPEC §5) an admission for tenant would exceed: "tenant",
// "global" or "".
func depthScope(cfg config.Config, tenant string, st *state) string {
	switch {
	case st.tenantDepth[tenant] >= cfg.TenantQueueDepth:
		return "tenant"
	case st.globalDepth >= cfg.GlobalQueueDepth:
		return "global"
	}
	return ""
}

// immediate decides a queue=false admission of unit (SPEC §5, §5a): admitted only if the job could
// be claimed now: every limit that applies (v, the admission's cfg.Check of st.usage: global, the
// interactive reserve, the tier, the tenant, the lanes) has room, its key is not gated and nothing
// of its tenant is queued ahead (for an interactive job, nothing interactive: it goes before the
// tenant's other queued jobs). Of several reasons to refuse, the one with the longest wait is
// reported, with its scope: 120 s while a limit is 0 (paused), the remaining gate time for a gated
// key (rate_key), else min(30, 5 × (ahead + 1)) with ahead the queued jobs before it in the fullest
// scope (the tenant's for tenant, the whole queue's otherwise).
func immediate(v config.Verdict, unit config.Unit, st *state, gatedFor int) (string, error) {
	type reason struct {
		scope  string
		after  int
		paused bool
	}
	var reasons []reason
	if v.Paused {
		reasons = append(reasons, reason{v.Scope, 120, true})
	}
	if gatedFor > 0 {
		reasons = append(reasons, reason{"rate_key", gatedFor, false})
	}
	// An interactive job goes before its tenant's other queued jobs: only the interactive ones
	// are ahead of it.
	tenantAhead := st.tenantDepth[unit.Tenant]
	if unit.Interactive {
		tenantAhead = st.tenantInteractive[unit.Tenant]
	}
	if tenantAhead > 0 {
		reasons = append(reasons, reason{config.ScopeTenant, min(30, 5*(tenantAhead+1)), false})
	}
	if !v.OK && !v.Paused {
		ahead := st.globalDepth
		if v.Scope == config.ScopeTenant {
			ahead = tenantAhead
		}
		reasons = append(reasons, reason{v.Scope, min(30, 5*(ahead+1)), false})
	}
	if len(reasons) == 0 {
		return "", nil
	}
	worst := reasons[0]
	for _, r := range reasons[1:] {
		if r.after > worst.after {
			worst = r
		}
	}
	return worst.scope, &job.Error{Code: job.CodeCapacityExceeded, Message: "no capacity to start the job now",
		Detail: map[string]any{"scope": worst.scope, "retry_after": worst.after, "paused": worst.paused}}
}

func depthError(it *item) error {
	return &job.Error{Code: job.CodeQueueFull, Message: "the " + it.scope + " queue is full",
		Detail: map[string]any{"scope": it.scope, "id": it.id, "retry_after": 30}}
}
