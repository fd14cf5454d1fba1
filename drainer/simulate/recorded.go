package simulate

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/sqldb"
	"github.com/sluicehq/sluice/gate/store"
)

// recordedPage is how many audit events one read of Recorded returns.
const recordedPage = 5000

// auditSlack is how far an audit event's id order may stray from its time order: a refusal that
// wrote no row goes through the audit queue and is written after events of later instants, with
// its admission's instant (store.AuditEvent.At). Recorded reads that much before and after the
// window, and holds arrivals that long to return them in time order.
const auditSlack = 2 * time.Second

// recordedSQL reads the audit events that are arrivals or slot releases after an id, in id
// order, each with its job's row while it is kept: what it asked of the caps, its queued_at and,
// once it was dispatched, how long it held its unit (to its outcome, or to now if it has none
// yet); a slot event with its detail (lanes, interactive, aware). audit_events has no index on
// at (migrations 0016, 0017: every index costs each admission): the read walks the primary key
// from the window's first id, which firstAuditID finds, and each job is one primary-key read.
const recordedSQL = `SELECT a.id, a.at, a.event, a.tenant, COALESCE(a.error_code, ''), COALESCE(a.scope, ''),
	COALESCE(a.slot_id, ''), IF(a.event LIKE 'slot%', a.detail, NULL), j.id IS NOT NULL, COALESCE(j.lanes, ''),
	COALESCE(j.interactive, FALSE), COALESCE(j.priority, 5), j.queued_at,
	TIMESTAMPDIFF(MICROSECOND, j.dispatched_at, COALESCE(j.finished_at, UTC_TIMESTAMP(6)))
	FROM audit_events a LEFT JOIN jobs j ON j.id = a.job_id
	WHERE a.id > ? AND a.event IN ('admitted', 'shadow_refused', 'refused', 'slot_granted', 'slot_refused', 'slot_released', 'slot_lost')
	ORDER BY a.id LIMIT ?`

// firstAuditID returns the id just before the first audit event at or after at, found by a
// binary search on the primary key (ids follow time, near enough; see auditSlack): some 30
// one-row reads, whatever the table's size.
func firstAuditID(ctx context.Context, db sqldb.DB, at time.Time) (int64, error) {
	var lo, hi sql.NullInt64
	if err := db.QueryRowContext(ctx, "SELECT MIN(id), MAX(id) FROM audit_events").Scan(&lo, &hi); err != nil {
		return 0, fmt.Errorf("find the window in the audit trail: %w", err)
	}
	if !lo.Valid {
		return 0, nil
	}
	l, h := lo.Int64, hi.Int64+1 // the first id at or after at is in [l, h]; h: none
	for l < h {
		mid := l + (h-l)/2
		var id int64
		var t time.Time
		err := db.QueryRowContext(ctx, "SELECT id, at FROM audit_events WHERE id >= ? ORDER BY id LIMIT 1", mid).Scan(&id, &t)
		if err != nil {
			return 0, fmt.Errorf("find the window in the audit trail: %w", err)
		}
		if t.Before(at) {
			l = id + 1
		} else {
			h = mid
		}
	}
	return l - 1, nil
}

// Recorded is a Source of what arrived between since and until, read from the audit trail of
// db (SPEC §10) a page at a time: admissions (admitted, shadow-refused, and refused by a depth
// cap, the rate limit or immediate-or-refuse), slot requests and slot releases, in time order,
// the arrivals of one instant (one admission transaction) in the order they were decided and
// the refusals that wrote no row last (the rate limit refuses a tenant's last items). A job's
// lanes, interactive flag, priority, time of arrival (its queued_at: the admission's clock
// reading; for a scheduled job, whose queued_at is its due time, its event's) and run_at, and the
// time from its dispatch to its outcome, come from its row while the row is kept
// (retention_days); a slot's lanes, interactive flag and awareness from its event's detail. A job
// never dispatched (refused, canceled, expired, still queued) and a refused request have no
// service time of their own: they take their tenant's mean of the jobs read so far (else
// everyone's, else none), as a refused slot takes its tenant's mean hold. A refusal that wrote no
// row has no lanes; one by immediate-or-refuse is replayed as from a client that handles it
// (aware), as it was refused. ctx bounds every read.
func Recorded(ctx context.Context, db sqldb.DB, since, until time.Time) Source {
	return &recorded{ctx: ctx, db: db, since: since.UTC(), until: until.UTC(),
		service: map[string]*mean{}, hold: map[string]*mean{}, held: map[string]time.Time{}}
}

type recorded struct {
	ctx          context.Context
	db           sqldb.DB
	since, until time.Time
	started      bool
	lastID       int64
	done         bool
	// held back: the arrivals read, in time order (then refusals without a row last, then as
	// read), until one auditSlack later than them has been read.
	buf    []pending
	seq    int64
	latest time.Time // the latest event read
	// Means of what is known so far, for the arrivals that have no figure of their own.
	service, hold map[string]*mean
	allService    mean
	held          map[string]time.Time // granted slots not yet released, for their hold
}

type mean struct {
	sum time.Duration
	n   int
}

func (m *mean) add(d time.Duration) { m.sum += d; m.n++ }
func (m *mean) get() (time.Duration, bool) {
	if m == nil || m.n == 0 {
		return 0, false
	}
	return m.sum / time.Duration(m.n), true
}

// pending is an arrival read, whether it is a refusal that wrote no row, and its place in the
// reading.
type pending struct {
	Arrival
	late bool
	seq  int64
}

func (p pending) before(o pending) bool {
	if !p.At.Equal(o.At) {
		return p.At.Before(o.At)
	}
	if p.late != o.late {
		return !p.late
	}
	return p.seq < o.seq
}

// Next returns the next arrival in time order.
func (r *recorded) Next() (Arrival, error) {
	for len(r.buf) == 0 || !r.done && r.buf[0].At.After(r.latest.Add(-auditSlack)) {
		if r.done {
			return Arrival{}, io.EOF
		}
		if err := r.read(); err != nil {
			return Arrival{}, err
		}
	}
	a := r.buf[0].Arrival
	r.buf = r.buf[1:]
	return a, nil
}

// keep adds p to buf in its place; arrivals come nearly in order, so the place is near the end.
func (r *recorded) keep(p pending) {
	r.seq++
	p.seq = r.seq
	i := len(r.buf)
	for i > 0 && p.before(r.buf[i-1]) {
		i--
	}
	r.buf = slices.Insert(r.buf, i, p)
}

func (r *recorded) read() error {
	if !r.started {
		id, err := firstAuditID(r.ctx, r.db, r.since.Add(-auditSlack))
		if err != nil {
			return err
		}
		r.started, r.lastID = true, id
	}
	rows, err := r.db.QueryContext(r.ctx, recordedSQL, r.lastID, recordedPage)
	if err != nil {
		return fmt.Errorf("read the audit trail: %w", err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		n++
		var (
			id                  int64
			at                  time.Time
			event, tenant, code string
			scope, slot, lanes  string
			detail              sql.NullString
			hasRow, interactive bool
			priority            int
			queuedAt            sql.NullTime
			serviceUS           sql.NullInt64
		)
		if err := rows.Scan(&id, &at, &event, &tenant, &code, &scope, &slot, &detail, &hasRow, &lanes, &interactive, &priority,
			&queuedAt, &serviceUS); err != nil {
			return fmt.Errorf("read the audit trail: %w", err)
		}
		r.lastID = id
		at = at.UTC()
		if at.After(r.latest) {
			r.latest = at
		}
		if !at.Before(r.until.Add(auditSlack)) {
			r.done = true
			break
		}
		if a, ok := r.arrival(at, event, tenant, code, slot, detail, hasRow, lanes, interactive, priority, queuedAt, serviceUS); ok &&
			!a.At.Before(r.since) && a.At.Before(r.until) {
			r.keep(pending{Arrival: a, late: a.Kind == Job && !hasRow})
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the audit trail: %w", err)
	}
	if n < recordedPage {
		r.done = true
	}
	return nil
}

func (r *recorded) arrival(at time.Time, event, tenant, code, slot string, detail sql.NullString, hasRow bool, lanes string,
	interactive bool, priority int, queuedAt sql.NullTime, serviceUS sql.NullInt64) (Arrival, bool) {
	a := Arrival{At: at, Tenant: tenant, Priority: job.DefaultPriority, ID: slot}
	switch event {
	case store.EventSlotGranted, store.EventSlotRefused:
		a.Kind = Slot
		var d struct {
			Lanes       []string `json:"lanes"`
			Interactive bool     `json:"interactive"`
			Aware       bool     `json:"aware"`
		}
		if detail.Valid && json.Unmarshal([]byte(detail.String), &d) == nil {
			a.Lanes, a.Interactive, a.Aware = slices.Compact(slices.Sorted(slices.Values(d.Lanes))), d.Interactive, d.Aware
		}
		if event == store.EventSlotGranted {
			r.held[slot] = a.At
			return a, true
		}
		a.ID = ""
		a.Service, _ = r.hold[tenant].get()
		return a, true
	case store.EventSlotReleased, store.EventSlotLost:
		granted, ok := r.held[slot]
		if !ok {
			return Arrival{}, false // granted before the window: the simulation never held it
		}
		delete(r.held, slot)
		m := r.hold[tenant]
		if m == nil {
			m = &mean{}
			r.hold[tenant] = m
		}
		m.add(a.At.Sub(granted))
		a.Kind = SlotEnd
		return a, true
	}
	a.Kind, a.ID = Job, ""
	a.Immediate = code == string(job.CodeCapacityExceeded)
	a.Aware = a.Immediate
	if hasRow {
		a.Lanes, a.Interactive, a.Priority = store.SplitLanes(lanes), interactive, priority
		// queued_at is the admission's clock reading, the instant of its transaction (the event's
		// at is its INSERT's, a few milliseconds later), or a scheduled job's due time.
		if q := queuedAt.Time.UTC(); queuedAt.Valid && q.After(a.At) {
			a.RunAt = q
		} else if queuedAt.Valid {
			a.At = q
		}
	}
	if serviceUS.Valid {
		a.Service = time.Duration(serviceUS.Int64) * time.Microsecond
		m := r.service[tenant]
		if m == nil {
			m = &mean{}
			r.service[tenant] = m
		}
		m.add(a.Service)
		r.allService.add(a.Service)
		return a, true
	}
	var ok bool
	if a.Service, ok = r.service[tenant].get(); !ok {
		a.Service, _ = r.allService.get()
	}
	return a, true
}

// DepthPeriod splits a window into about 48 periods of whole seconds, for Result.Depth.
func DepthPeriod(window time.Duration) time.Duration {
	return max(time.Second, (window / 48).Truncate(time.Second))
}

// RunRecorded replays what arrived between since and until, read from db's audit trail
// (Recorded), under the runtime configuration in force and under it with changes (Run). With no
// opts.DepthEvery, the depth line has about 48 periods of whole seconds over the window.
func RunRecorded(ctx context.Context, db sqldb.DB, since, until time.Time, changes map[string]json.RawMessage, opts Options, progress func(int)) (*Comparison, error) {
	if opts.DepthEvery <= 0 {
		opts.DepthEvery = DepthPeriod(until.Sub(since))
	}
	v, err := config.Load(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("read the configuration in force: %w", err)
	}
	return Run(ctx, Recorded(ctx, db, since, until), v.Config, changes, opts, progress)
}

// calibrationJobs bounds the jobs Calibrate reads: the first of the window.
const calibrationJobs = 20000

// Calibrate measures the pickup delays a replay of the window from since to until should use, on
// the first jobs admitted in it (at most 20,000, read from their rows by id from the window's
// first admission; see estimatePickups). With no job dispatched there, it returns the defaults
// and ok false.
func Calibrate(ctx context.Context, db sqldb.DB, since, until time.Time) (arrival, outcome time.Duration, ok bool, err error) {
	arrival, outcome = DefaultArrivalPickup, DefaultOutcomePickup
	from, err := firstAuditID(ctx, db, since.UTC())
	if err != nil {
		return arrival, outcome, false, err
	}
	var first sql.NullInt64
	err = db.QueryRowContext(ctx, `SELECT job_id FROM audit_events WHERE id > ? AND event = 'admitted' AND job_id IS NOT NULL
		ORDER BY id LIMIT 1`, from).Scan(&first)
	if errors.Is(err, sql.ErrNoRows) {
		return arrival, outcome, false, nil
	}
	if err != nil {
		return arrival, outcome, false, fmt.Errorf("calibrate the pickup delays: %w", err)
	}
	rows, err := db.QueryContext(ctx, `SELECT queued_at, dispatched_at, finished_at FROM jobs
		WHERE id >= ? AND dispatched_at IS NOT NULL ORDER BY id LIMIT ?`, first.Int64, calibrationJobs)
	if err != nil {
		return arrival, outcome, false, fmt.Errorf("calibrate the pickup delays: %w", err)
	}
	defer rows.Close()
	var runs []ran
	for rows.Next() {
		var r ran
		if err := rows.Scan(&r.queued, &r.dispatched, &r.finished); err != nil {
			return arrival, outcome, false, fmt.Errorf("calibrate the pickup delays: %w", err)
		}
		if r.queued.Before(until) {
			runs = append(runs, r)
		}
	}
	if err := rows.Err(); err != nil {
		return arrival, outcome, false, fmt.Errorf("calibrate the pickup delays: %w", err)
	}
	arrival, outcome, ok = estimatePickups(runs)
	return arrival, outcome, ok, nil
}

// ran is a job that was dispatched: when it was queued, dispatched and (if it was) finished.
type ran struct {
	queued, dispatched time.Time
	finished           sql.NullTime
}

// estimatePickups is Calibrate's estimate on runs. A job dispatched while no unit had freed since
// its admission (no outcome of runs between its queued_at and its dispatched_at) measures the
// pickup after an arrival. One that waited for a unit measures the pickup after an outcome, from
// the first outcome since the pass before its own (and since its admission), because the engine
// runs a pass OutcomePickup after the first outcome it has not seen and the outcomes within that
// delay join it: measured from the last outcome instead, the joining outcomes' shorter delays
// would set simulated waits early, the more so the busier the drainer. A job whose outcomes all
// came before the pass before its own was taken by a pass no outcome brought (a poll, a pass that
// goes on at once, another admission's) and measures neither. Each is the mean of its samples (a
// job that waits for units waits through a chain of pickups, one per unit freed before its turn,
// and the chain adds up their mean: the median, lower on the skewed delays of a busy drainer,
// set simulated waits early by a few per cent, more the longer a tenant's backlog); with none,
// the default. ok: there was a sample. Outcomes of jobs not in runs (dispatched before the window)
// and slot releases are not seen, so the first jobs of a busy window can count as arrivals.
func estimatePickups(runs []ran) (arrival, outcome time.Duration, ok bool) {
	var finishes, passes []time.Time
	for _, r := range runs {
		if r.finished.Valid {
			finishes = append(finishes, r.finished.Time)
		}
		passes = append(passes, r.dispatched)
	}
	slices.SortFunc(finishes, time.Time.Compare)
	slices.SortFunc(passes, time.Time.Compare)
	passes = slices.Compact(passes)
	// firstAfter returns the index of the first of ts (sorted) after t.
	firstAfter := func(ts []time.Time, t time.Time) int {
		return sort.Search(len(ts), func(i int) bool { return ts[i].After(t) })
	}
	var afterArrival, afterOutcome []time.Duration
	for _, r := range runs {
		if r.dispatched.Before(r.queued) {
			continue // a clock reading's order, not a delay
		}
		i := firstAfter(finishes, r.queued)
		if i == len(finishes) || finishes[i].After(r.dispatched) {
			afterArrival = append(afterArrival, r.dispatched.Sub(r.queued))
			continue
		}
		from := r.queued
		// passes holds r's own pass; the one before it saw the outcomes up to it.
		if p, _ := slices.BinarySearchFunc(passes, r.dispatched, time.Time.Compare); p > 0 && passes[p-1].After(from) {
			from = passes[p-1]
		}
		if i = firstAfter(finishes, from); i < len(finishes) && !finishes[i].After(r.dispatched) {
			afterOutcome = append(afterOutcome, r.dispatched.Sub(finishes[i]))
		}
	}
	mean := func(ds []time.Duration, dflt time.Duration) time.Duration {
		if len(ds) == 0 {
			return dflt
		}
		var sum time.Duration
		for _, d := range ds {
			sum += d
		}
		return sum / time.Duration(len(ds))
	}
	return mean(afterArrival, DefaultArrivalPickup), mean(afterOutcome, DefaultOutcomePickup), len(afterArrival)+len(afterOutcome) > 0
}
