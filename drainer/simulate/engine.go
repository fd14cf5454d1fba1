package simulate

import (
	"container/heap"
	"math"
	"time"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/admitrate"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// Options tune an Engine. Zero values take the defaults given.
type Options struct {
	// ClaimBatch is the drainers' ClaimBatch (default 64).
	ClaimBatch int
	// DepthEvery is the period of Result.Depth (default 1 minute).
	DepthEvery time.Duration
	// ArrivalPickup is how long after an admission (or a scheduled job coming due) the claim
	// pass that may start it runs: in production the admission's commit, then the enqueue
	// poke's way through the outbox, NATS and a drainer. No pass sees an admission's jobs
	// sooner, not even one an outcome brings: their rows are not committed yet. OutcomePickup
	// is the same after an outcome or a slot's release frees a unit. Zero: at once. Calibrate
	// measures both on a window of the audit trail; DefaultArrivalPickup and
	// DefaultOutcomePickup are the reference machine's.
	ArrivalPickup, OutcomePickup time.Duration
}

// The pickup delays of the reference machine (2 cores, local MariaDB and NATS), for arrivals
// that come with no audit trail to measure them on (Calibrate): from a single admission's clock
// reading to its job's dispatch when a unit is free, about 5 ms at the median
// (BenchmarkPickupLatency); from an outcome to the next dispatch of its unit, about 2 ms.
const (
	DefaultArrivalPickup = 5 * time.Millisecond
	DefaultOutcomePickup = 2 * time.Millisecond
)

// Engine replays arrivals under one runtime configuration. Arrive them in time order, then
// Finish. It holds the jobs in the system (queued or in flight) and the live slots, nothing of
// those that ended: its memory is bounded by what is in the system at once, not by the
// arrivals' number.
type Engine struct {
	cfg     config.Config
	opts    Options
	chose   *drainer.Chooser
	decider gate.Decider
	// The job arrivals of the instant batchAt, decided together (decideBatch), and their
	// requests; qDepth and qInteractive are their tenants' depths for the decision.
	batch                []Arrival
	reqs                 []gate.Request
	batchAt              time.Time
	qDepth, qInteractive map[string]int
	heads                map[string][]store.Head // a claim pass's, reused
	more                 map[string]bool
	rate                 admitrate.Local
	now                  time.Time
	begun                bool
	claimAt              time.Time // the last claim pass scheduled
	// Admitted jobs not yet visible to a claim, in the order they become visible: an admission's
	// rows are committed, and seen by a claim, some time after its clock reading.
	committing fifo
	nextID     int64

	tenants map[string]*tenantQueue // every tenant with jobs queued or in flight
	active  map[string]*tenantQueue // the tenants with jobs due
	depth   int                     // queued jobs, scheduled ones included
	us      config.Usage
	events  events
	seq     int64
	spare   []*tenantQueue         // queues of tenants gone idle, for reuse
	waiting []gate.SlotWaiting     // a slot decision's tenants with work, reused
	free    []*event               // events handled, for reuse
	ran     []*qjob                // jobs ended, for reuse
	slots   map[string]config.Unit // granted, counted slots held until their SlotEnd
	used    map[string]*timeUsed   // fair_time: each tenant's executor time

	res *Result
}

// New returns an Engine deciding by cfg, which must be valid (config.Config.Validate).
func New(cfg config.Config, opts Options) *Engine {
	if opts.DepthEvery <= 0 {
		opts.DepthEvery = time.Minute
	}
	return &Engine{cfg: cfg, opts: opts, chose: drainer.NewChooser(opts.ClaimBatch),
		tenants: map[string]*tenantQueue{}, active: map[string]*tenantQueue{}, us: config.NewUsage(),
		slots: map[string]config.Unit{}, used: map[string]*timeUsed{}, res: newResult(cfg, opts.DepthEvery)}
}

// qjob is a job in the system.
type qjob struct {
	head    store.Head
	service time.Duration
	runAt   time.Time // zero once due
	visible time.Time // when a claim can see it, if it is committing
	claimed time.Time
}

// Arrive replays a: first everything that happens before a.At (outcomes, scheduled jobs coming
// due, claim passes), then a's decision, after which a claim pass follows ArrivalPickup later.
// The job arrivals of one instant are decided together, as the items of one admission
// transaction (one clock reading) are: the rate limit for all of them first, then the depth caps
// item after item, before any claim. An arrival earlier than one already replayed (two
// transactions commit in the other order of their clock readings) joins the instant being
// decided, and its wait counts from its own time.
func (e *Engine) Arrive(a Arrival) {
	if !e.begun {
		e.begun, e.now = true, a.At
		e.res.Start = a.At
	}
	if len(e.batch) > 0 && (a.At.After(e.batchAt) || a.Kind != Job) {
		e.decideBatch()
	}
	e.advance(a.At, false)
	e.flow(a.At)
	switch a.Kind {
	case Slot:
		e.slot(a)
		e.claimAfter(e.opts.ArrivalPickup)
	case SlotEnd:
		if u, ok := e.slots[a.ID]; ok {
			delete(e.slots, a.ID)
			e.release(u)
			e.claimAfter(e.opts.OutcomePickup)
		}
	default:
		e.admit(a)
	}
}

// Finish runs the simulation on until nothing more happens (every job that can start has
// ended) and returns its figures. Jobs still queued then (a paused tenant's, say) are counted as
// never started, their waits as lasting to the end.
func (e *Engine) Finish() *Result {
	e.decideBatch()
	e.advance(time.Time{}, true)
	e.res.End = e.now
	for t, q := range e.tenants {
		if q.depth == 0 {
			continue
		}
		e.res.tenant(t).NeverStarted += q.depth
		e.res.Total.NeverStarted += q.depth
		q.each(func(j *qjob) { e.res.waited(t, e.now.Sub(j.head.QueuedAt)) })
	}
	e.res.finish()
	return e.res
}

// advance handles the events before until (all of them with all), in time order.
func (e *Engine) advance(until time.Time, all bool) {
	for len(e.events) > 0 && (all || e.events[0].at.Before(until)) {
		p := heap.Pop(&e.events).(*event)
		ev := *p
		*p = event{}
		e.free = append(e.free, p)
		e.flow(ev.at)
		switch {
		case ev.claim:
			if ev.at.Equal(e.claimAt) {
				e.claimAt = time.Time{}
			}
			e.claim()
		case ev.job != nil && !ev.job.runAt.IsZero():
			ev.job.runAt = time.Time{}
			e.enqueue(ev.job)
			e.claimAfter(e.opts.ArrivalPickup)
		case ev.job != nil:
			e.ended(ev.job)
			e.ran = append(e.ran, ev.job)
			e.claimAfter(e.opts.OutcomePickup)
		default:
			e.release(ev.unit)
			e.claimAfter(e.opts.OutcomePickup)
		}
	}
}

// claimAfter schedules a claim pass d from now, unless one is due by then: that one sees what
// changed now.
func (e *Engine) claimAfter(d time.Duration) {
	at := e.now.Add(d)
	if !e.claimAt.IsZero() && !e.claimAt.Before(e.now) && !e.claimAt.After(at) {
		return
	}
	e.claimAt = at
	e.push(event{at: at, claim: true})
}

// flow moves the clock to t, integrating the units in flight and the depth over the time passed.
func (e *Engine) flow(t time.Time) {
	if !t.After(e.now) {
		return
	}
	e.res.busy += float64(e.us.Total) * t.Sub(e.now).Seconds()
	e.now = t
	e.res.sampleDepth(e.now, e.depth)
}

func (e *Engine) tenant(t string) *tenantQueue {
	q := e.tenants[t]
	if q == nil {
		if n := len(e.spare); n > 0 {
			q, e.spare = e.spare[n-1], e.spare[:n-1]
		} else {
			q = &tenantQueue{}
		}
		e.tenants[t] = q
	}
	return q
}

// admit decides a job's admission as gate.Decider does and queues it when admitted.
func (e *Engine) admit(a Arrival) {
	st := e.res.tenant(a.Tenant)
	st.Arrivals++
	e.res.Total.Arrivals++
	if lane, ok := e.cfg.Known(a.Lanes); !ok {
		e.res.refuse(a.Tenant, string(job.CodeInvalidRequest), config.LanePrefix+lane)
		return
	}
	req := gate.Request{Tenant: a.Tenant, Lanes: a.Lanes}
	if a.Interactive {
		yes := true
		req.Interactive = &yes
	}
	if a.Priority != job.DefaultPriority {
		p := a.Priority
		req.Priority = &p
	}
	if a.Immediate {
		no := false
		req.Queue, req.Aware = &no, a.Aware
	}
	if a.RunAt.After(a.At) {
		at := a.RunAt.Format(time.RFC3339Nano)
		req.RunAt = &at
	}
	if len(e.batch) == 0 {
		e.batchAt = a.At
	}
	e.batch = append(e.batch, a)
	e.reqs = append(e.reqs, req)
}

// decideBatch decides the job arrivals of one instant together, as one admission transaction
// decides its items (gate.Decider.Admissions), and queues those admitted; a claim pass follows
// ArrivalPickup later.
func (e *Engine) decideBatch() {
	if len(e.batch) == 0 {
		return
	}
	if e.qDepth == nil {
		e.qDepth, e.qInteractive = map[string]int{}, map[string]int{}
	}
	clear(e.qDepth)
	clear(e.qInteractive)
	for _, a := range e.batch {
		if q := e.tenants[a.Tenant]; q != nil {
			e.qDepth[a.Tenant], e.qInteractive[a.Tenant] = q.depth, q.interactive
		}
	}
	reserve := func(tenant string, n int) (int, int) {
		return e.rate.Reserve(tenant, n, e.cfg.AdmissionRatePerMinute, e.now)
	}
	outs, refund := e.decider.Admissions(e.cfg, gate.Queues{Now: e.batchAt, TenantDepth: e.qDepth, TenantInteractive: e.qInteractive,
		GlobalDepth: e.depth, Usage: e.us}, e.reqs, reserve)
	for t, n := range refund {
		e.rate.Refund(t, n)
	}
	for i, o := range outs {
		e.queue(e.batch[i], o)
	}
	clear(e.batch)
	e.batch, e.reqs = e.batch[:0], e.reqs[:0]
	// The pass the enqueue poke brings: the first to see the jobs admitted. A pass due sooner
	// (after an outcome) does not see them, so it does not stand for this one.
	if at := e.now.Add(e.opts.ArrivalPickup); !at.Equal(e.claimAt) {
		e.claimAt = at
		e.push(event{at: at, claim: true})
	}
}

// queue applies the decision o on a: a refusal is counted, an admitted job queued (or
// scheduled).
func (e *Engine) queue(a Arrival, o gate.Outcome) {
	if !o.Queued {
		e.res.refuse(a.Tenant, string(o.Code), o.Scope)
		return
	}
	st := e.res.tenant(a.Tenant)
	st.Admitted++
	e.res.Total.Admitted++
	e.nextID++
	// A scheduled job's queued_at is its due time: it takes its place among the jobs due then,
	// and its wait counts from then.
	j := e.newJob()
	*j = qjob{head: store.Head{ID: e.nextID, Tenant: a.Tenant, QueuedAt: a.At, Lanes: a.Lanes, Interactive: a.Interactive,
		Priority: a.Priority}, service: a.Service}
	if a.RunAt.After(a.At) {
		j.head.QueuedAt = a.RunAt
	}
	q := e.tenant(a.Tenant)
	q.depth++
	if a.Interactive {
		q.interactive++
	}
	e.depth++
	e.res.sampleDepth(e.now, e.depth)
	st.noteDepth(q.depth)
	if a.RunAt.After(a.At) {
		j.runAt = a.RunAt
		e.push(event{at: a.RunAt, job: j})
		return
	}
	j.visible = e.now.Add(e.opts.ArrivalPickup)
	e.committing.js = append(e.committing.js, j) // in the order they become visible, whatever their queued_at
}

// committed queues the jobs admitted whose rows a claim now sees.
func (e *Engine) committed() {
	for !e.committing.empty() && !e.committing.at(0).visible.After(e.now) {
		e.enqueue(e.committing.pop())
	}
}

// newJob returns the memory of a job that ended, or new memory: a day's millions of jobs cost
// the collector no more than the jobs in the system at once.
func (e *Engine) newJob() *qjob {
	if n := len(e.ran); n > 0 {
		j := e.ran[n-1]
		e.ran = e.ran[:n-1]
		return j
	}
	return new(qjob)
}

// enqueue puts a due job in its tenant's queue, where the claim may take it.
func (e *Engine) enqueue(j *qjob) {
	q := e.tenant(j.head.Tenant)
	q.add(j)
	e.active[j.head.Tenant] = q
}

// slot decides a slot request as gate.DecideSlot does; granted and counted, it holds a unit
// for its Service, or until its SlotEnd.
func (e *Engine) slot(a Arrival) {
	st := e.res.tenant(a.Tenant)
	st.Slots++
	e.res.Total.Slots++
	if lane, ok := e.cfg.Known(a.Lanes); !ok {
		e.res.refuseSlot(a.Tenant, string(job.CodeInvalidRequest), config.LanePrefix+lane)
		return
	}
	// As many tenants with work as a grant reads, whatever their number; the grant reads the
	// oldest heads first, this any of them.
	limit := gate.SlotWaitingLimit(e.cfg)
	waiting := e.waiting[:0]
	for t := range e.active {
		if len(waiting) == limit {
			break
		}
		if t != a.Tenant {
			waiting = append(waiting, gate.SlotWaiting{Tenant: t, Due: true})
		}
	}
	e.waiting = waiting
	u := config.Unit{Tenant: a.Tenant, Lanes: a.Lanes, Interactive: a.Interactive}
	o := gate.DecideSlot(e.cfg, e.us, waiting, u, a.Aware)
	if !o.Grant {
		e.res.refuseSlot(a.Tenant, string(job.CodeCapacityExceeded), o.Scope)
		return
	}
	st.SlotsGranted++
	e.res.Total.SlotsGranted++
	if !o.Counted {
		return
	}
	e.us.Add(e.cfg, u, 1)
	e.tenant(a.Tenant).inFlight++
	if a.Service > 0 || a.ID == "" {
		e.push(event{at: a.At.Add(a.Service), unit: u})
		return
	}
	e.slots[a.ID] = u
}

// outOfFlight takes a unit like u out of flight, forgetting a tenant with none left, so that the
// usage holds the tenants in flight, not every tenant that ever was.
func (e *Engine) outOfFlight(u config.Unit) {
	e.us.Add(e.cfg, u, -1)
	if e.us.Tenant[u.Tenant] == 0 {
		delete(e.us.Tenant, u.Tenant)
	}
}

// release gives back a slot's unit.
func (e *Engine) release(u config.Unit) {
	e.outOfFlight(u)
	q := e.tenants[u.Tenant]
	q.inFlight--
	e.forgetIdle(u.Tenant, q)
}

// idle forgets tenant t, which has nothing in the system; its queue is kept for the next
// tenant that comes (the FIFOs' arrays with it).
func (e *Engine) idle(t string, q *tenantQueue) {
	delete(e.tenants, t)
	delete(e.active, t)
	for i := range q.fifos {
		for p := range q.fifos[i] {
			f := &q.fifos[i][p]
			f.js, f.off = f.js[:0], 0
		}
	}
	*q = tenantQueue{fifos: q.fifos, heads: q.heads[:0]}
	e.spare = append(e.spare, q)
}

func (e *Engine) forgetIdle(t string, q *tenantQueue) {
	if q.depth == 0 && q.inFlight == 0 {
		e.idle(t, q) // its time used (fair_time) stays: it decays, it is not forgotten
	}
}

// ended records a job's outcome: its unit is free, and under fair_time its tenant is charged.
func (e *Engine) ended(j *qjob) {
	e.outOfFlight(j.head.Unit())
	q := e.tenants[j.head.Tenant]
	q.inFlight--
	if e.cfg.Ordering == config.FairTime {
		tu := e.used[j.head.Tenant]
		tu.charge(e.now, e.now.Sub(j.claimed))
		tu.running -= j.claimed.Sub(e.res.Start).Seconds()
		tu.inFlight--
	}
	e.forgetIdle(j.head.Tenant, q)
}

// claim runs passes as a drainer does while jobs are due and units free: each reads, for every
// tenant below its cap, its first jobs in its queue's order (as many as the pass may claim) and
// lets the Chooser choose.
func (e *Engine) claim() {
	e.committed()
	for len(e.active) > 0 && e.us.Total < e.cfg.GlobalInFlight {
		free := min(e.cfg.GlobalInFlight-e.us.Total, e.chooserBatch())
		aged := e.now.Add(-e.cfg.PriorityAging()) // as the drainer's candidates read them
		if e.heads == nil {
			e.heads, e.more = map[string][]store.Head{}, map[string]bool{}
		}
		heads, more := e.heads, e.more
		clear(heads)
		clear(more)
		for t, q := range e.active {
			if e.us.Tenant[t] >= e.cfg.TenantCap(t) {
				continue
			}
			heads[t], more[t] = q.first(free, aged)
		}
		if len(heads) == 0 {
			return
		}
		if e.cfg.Ordering == config.FairTime {
			e.chose.SetTimeUsed(e.timeUsed(heads))
		}
		chosen, full := e.chose.Choose(e.cfg, heads, more, &e.us)
		for _, h := range chosen {
			e.start(h)
		}
		if len(chosen) == 0 || !full {
			return
		}
	}
}

func (e *Engine) chooserBatch() int {
	if e.opts.ClaimBatch > 0 {
		return e.opts.ClaimBatch
	}
	return 64
}

// start takes a chosen job out of its queue (the Chooser counted it in flight already).
func (e *Engine) start(h store.Head) {
	t := h.Tenant
	q := e.tenants[t]
	j := q.take(h.ID)
	q.depth--
	if j.head.Interactive {
		q.interactive--
	}
	q.inFlight++
	if q.eligible == 0 {
		delete(e.active, t)
	}
	e.depth--
	e.res.sampleDepth(e.now, e.depth)
	j.claimed = e.now
	e.res.started(t, e.now.Sub(j.head.QueuedAt))
	if e.cfg.Ordering == config.FairTime {
		tu := e.usedOf(t)
		tu.running += e.now.Sub(e.res.Start).Seconds()
		tu.inFlight++
	}
	e.push(event{at: e.now.Add(j.service), job: j})
}

// timeUsed is what fair_time orders by: each tenant's executor time charged at its outcomes,
// decayed over config.FairTimeWindow as store.TimeUsed decays it, plus the time its jobs in
// flight have run so far.
type timeUsed struct {
	used     float64 // seconds, as of at
	at       time.Time
	running  float64 // the sum of the in-flight jobs' claim instants, in seconds from Start
	inFlight int
}

func (tu *timeUsed) decayed(now time.Time) float64 {
	if tu.at.IsZero() {
		return 0
	}
	return tu.used * math.Exp(-float64(now.Sub(tu.at).Microseconds())/float64(config.FairTimeWindow.Microseconds()))
}

func (tu *timeUsed) charge(now time.Time, d time.Duration) {
	tu.used, tu.at = tu.decayed(now)+d.Seconds(), now
}

func (e *Engine) usedOf(t string) *timeUsed {
	tu := e.used[t]
	if tu == nil {
		tu = &timeUsed{}
		e.used[t] = tu
	}
	return tu
}

func (e *Engine) timeUsed(heads map[string][]store.Head) map[string]float64 {
	out := make(map[string]float64, len(heads))
	since := e.now.Sub(e.res.Start).Seconds()
	for t := range heads {
		if tu := e.used[t]; tu != nil {
			out[t] = tu.decayed(e.now) + float64(tu.inFlight)*since - tu.running
		}
	}
	return out
}

// event is something that happens at a time: a claim pass, a job's outcome, a scheduled job
// coming due (job with runAt set) or a slot's release (unit).
type event struct {
	at    time.Time
	seq   int64
	claim bool
	job   *qjob
	unit  config.Unit
}

// push schedules ev, in the memory of an event handled before if there is one.
func (e *Engine) push(ev event) {
	e.seq++
	ev.seq = e.seq
	var p *event
	if n := len(e.free); n > 0 {
		p, e.free = e.free[n-1], e.free[:n-1]
	} else {
		p = new(event)
	}
	*p = ev
	heap.Push(&e.events, p)
}

type events []*event

func (h events) Len() int { return len(h) }
func (h events) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h events) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *events) Push(x any)   { *h = append(*h, x.(*event)) }
func (h *events) Pop() any {
	old := *h
	ev := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return ev
}
