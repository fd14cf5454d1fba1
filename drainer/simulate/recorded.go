package simulate

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/limits"
	"github.com/sluicehq/sluice/gate/sqldb"
	"github.com/sluicehq/sluice/gate/store"
)

// recordedPage is how many audit events one read of Recorded returns.
const recordedPage = 5000

// recordedSQL reads the audit events that are arrivals or slot releases, after a (at, id) key,
// in the order they were written, each with its job's row while it is kept: what it asked of the
// caps, its queued_at and, once it was dispatched, how long it held its unit (to its outcome, or
// to now if it has none yet).
// The `at` index serves the range; the job is one primary-key read.
const recordedSQL = `SELECT a.id, a.at, a.event, a.tenant, COALESCE(a.error_code, ''), COALESCE(a.scope, ''),
	COALESCE(a.slot_id, ''), j.id IS NOT NULL, COALESCE(j.lanes, ''), COALESCE(j.interactive, FALSE),
	COALESCE(j.priority, 5), j.queued_at,
	TIMESTAMPDIFF(MICROSECOND, j.dispatched_at, COALESCE(j.finished_at, UTC_TIMESTAMP(6)))
	FROM audit_events a LEFT JOIN jobs j ON j.id = a.job_id
	WHERE a.at >= ? AND a.at < ? AND (a.at > ? OR (a.at = ? AND a.id > ?))
	  AND a.event IN ('admitted', 'shadow_refused', 'refused', 'slot_granted', 'slot_refused', 'slot_released', 'slot_lost')
	ORDER BY a.at, a.id LIMIT ?`

// Recorded is a Source of what arrived between since and until, read from the audit trail of
// db (SPEC §10) a page at a time: admissions (admitted, shadow-refused, and refused by a depth
// cap, the rate limit, immediate-or-refuse or a deadline), slot requests and slot releases, in
// the order they were written (the order the decisions were taken). A job's lanes, interactive
// flag, priority, time of arrival (its queued_at: the admission's clock reading) or run_at (a
// queued_at after the event), and the time from its dispatch to its outcome, come from its row
// while the row is kept (retention_days); the arrival of a request without a row is its event's
// time. A job never dispatched
// (refused, canceled, expired, still queued) and a refused request have no service time of
// their own: they take their tenant's mean so far in the window (else everyone's, else none), as
// a refused slot takes its tenant's mean hold. A refused request whose row was never written
// has no lanes; a slot's lanes are not recorded. ctx bounds every read.
func Recorded(ctx context.Context, db sqldb.DB, since, until time.Time) Source {
	return &recorded{ctx: ctx, db: db, since: since.UTC(), until: until.UTC(), lastAt: since.UTC(),
		service: map[string]*mean{}, hold: map[string]*mean{}, held: map[string]time.Time{}}
}

type recorded struct {
	ctx          context.Context
	db           sqldb.DB
	since, until time.Time
	lastAt       time.Time
	lastID       int64
	page         []pending
	// late holds the refusals that wrote no row (the rate limit's, immediate-or-refuse's) of the
	// latest instant, and ready what Next returns next: see Next.
	late, ready []Arrival
	done        bool
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

// pending is an arrival read, and whether it is a refusal that wrote no row.
type pending struct {
	Arrival
	late bool
}

// Next returns the next arrival. A refusal that wrote no row comes after the other arrivals of
// its instant: its event carries its admission's instant, but is written after the transaction's
// rows (through the audit queue), and within one transaction it was among the last items (the
// rate limit grants a tenant's first items), so it waits for the first arrival of a later instant.
func (r *recorded) Next() (Arrival, error) {
	for {
		if len(r.ready) > 0 {
			a := r.ready[0]
			r.ready = r.ready[1:]
			return a, nil
		}
		p, err := r.next()
		if errors.Is(err, io.EOF) && len(r.late) > 0 {
			r.ready, r.late = r.late, nil
			continue
		}
		if err != nil {
			return Arrival{}, err
		}
		switch {
		case p.late && (len(r.late) == 0 || !p.At.After(r.late[0].At)):
			r.late = append(r.late, p.Arrival)
		case len(r.late) > 0 && p.At.After(r.late[0].At):
			r.ready, r.late = append(r.late, p.Arrival), nil
			if p.late {
				r.ready, r.late = r.ready[:len(r.ready)-1], []Arrival{p.Arrival}
			}
		default:
			return p.Arrival, nil
		}
	}
}

func (r *recorded) next() (pending, error) {
	for len(r.page) == 0 {
		if r.done {
			return pending{}, io.EOF
		}
		if err := r.read(); err != nil {
			return pending{}, err
		}
	}
	p := r.page[0]
	r.page = r.page[1:]
	return p, nil
}

func (r *recorded) read() error {
	rows, err := r.db.QueryContext(r.ctx, recordedSQL, r.since, r.until, r.lastAt, r.lastAt, r.lastID, recordedPage)
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
			hasRow, interactive bool
			priority            int
			queuedAt            sql.NullTime
			serviceUS           sql.NullInt64
		)
		if err := rows.Scan(&id, &at, &event, &tenant, &code, &scope, &slot, &hasRow, &lanes, &interactive, &priority,
			&queuedAt, &serviceUS); err != nil {
			return fmt.Errorf("read the audit trail: %w", err)
		}
		r.lastAt, r.lastID = at, id
		if a, ok := r.arrival(at, event, tenant, code, slot, hasRow, lanes, interactive, priority, queuedAt, serviceUS); ok {
			r.page = append(r.page, pending{a, a.Kind == Job && !hasRow})
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the audit trail: %w", err)
	}
	r.done = n < recordedPage
	return nil
}

func (r *recorded) arrival(at time.Time, event, tenant, code, slot string, hasRow bool, lanes string, interactive bool,
	priority int, queuedAt sql.NullTime, serviceUS sql.NullInt64) (Arrival, bool) {
	a := Arrival{At: at.UTC(), Tenant: tenant, Priority: job.DefaultPriority, ID: slot}
	switch event {
	case store.EventSlotGranted:
		a.Kind = Slot
		r.held[slot] = a.At
		return a, true
	case store.EventSlotRefused:
		a.Kind, a.ID = Slot, ""
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
	if hasRow {
		a.Lanes, a.Interactive, a.Priority = store.SplitLanes(lanes), interactive, priority
		// queued_at is the admission's clock reading, taken before its transaction (the event's
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

// RunRecorded replays what arrived between since and until, read from db's audit trail
// (Recorded), under the runtime configuration in force and under it with changes (Run). With no
// opts.DepthEvery, the depth line has about 48 periods of whole seconds over the window.
func RunRecorded(ctx context.Context, db sqldb.DB, since, until time.Time, changes map[string]json.RawMessage, opts Options, progress func(int)) (*Comparison, error) {
	if opts.DepthEvery <= 0 {
		opts.DepthEvery = max(time.Second, (until.Sub(since) / 48).Truncate(time.Second))
	}
	v, err := limits.Load(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("read the configuration in force: %w", err)
	}
	return Run(Recorded(ctx, db, since, until), v.Config, changes, opts, progress)
}

// calibrationJobs bounds the jobs Calibrate reads: the first of the window.
const calibrationJobs = 20000

// Calibrate measures, on the first jobs admitted between since and until (at most 20,000, read
// from their rows by id from the window's first admission), the pickup delays a replay of the
// window should use. A job dispatched while no unit had freed since its admission (no outcome
// between its queued_at and its dispatched_at) measures the pickup after an arrival; one queued
// before the last outcome preceding its dispatch waited for a unit, and measures the pickup after
// an outcome. Each is the median of its samples; with none, the default (ok false).
func Calibrate(ctx context.Context, db sqldb.DB, since, until time.Time) (arrival, outcome time.Duration, ok bool, err error) {
	arrival, outcome = DefaultArrivalPickup, DefaultOutcomePickup
	var first sql.NullInt64
	err = db.QueryRowContext(ctx, `SELECT job_id FROM audit_events WHERE at >= ? AND at < ? AND event = 'admitted'
		ORDER BY at, id LIMIT 1`, since.UTC(), until.UTC()).Scan(&first)
	if errors.Is(err, sql.ErrNoRows) || err == nil && !first.Valid {
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
	type run struct{ queued, dispatched time.Time }
	var runs []run
	var finishes []time.Time
	for rows.Next() {
		var q, d time.Time
		var f sql.NullTime
		if err := rows.Scan(&q, &d, &f); err != nil {
			return arrival, outcome, false, fmt.Errorf("calibrate the pickup delays: %w", err)
		}
		if !q.Before(until) {
			continue
		}
		runs = append(runs, run{q, d})
		if f.Valid {
			finishes = append(finishes, f.Time)
		}
	}
	if err := rows.Err(); err != nil {
		return arrival, outcome, false, fmt.Errorf("calibrate the pickup delays: %w", err)
	}
	slices.SortFunc(finishes, time.Time.Compare)
	var afterArrival, afterOutcome []time.Duration
	for _, r := range runs {
		if r.dispatched.Before(r.queued) {
			continue // a scheduled job's queued_at is its due time; its claim may come first by a hair
		}
		// The last outcome at or before the dispatch.
		i, found := slices.BinarySearchFunc(finishes, r.dispatched, time.Time.Compare)
		if !found {
			i--
		}
		if i >= 0 && finishes[i].After(r.queued) {
			afterOutcome = append(afterOutcome, r.dispatched.Sub(finishes[i]))
		} else {
			afterArrival = append(afterArrival, r.dispatched.Sub(r.queued))
		}
	}
	median := func(ds []time.Duration, dflt time.Duration) time.Duration {
		if len(ds) == 0 {
			return dflt
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	return median(afterArrival, arrival), median(afterOutcome, outcome), len(afterArrival)+len(afterOutcome) > 0, nil
}
