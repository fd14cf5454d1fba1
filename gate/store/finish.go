package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/sqldb"
	"github.com/sluicehq/sluice/outbox"
)

// Outcome is what a writer reports about a dispatched job.
type Outcome struct {
	Status       job.Status // succeeded, failed or lost; or queued to requeue a never-started job
	ErrorCode    string
	ErrorMessage string
	Result       json.RawMessage
	// Reported marks a failed outcome as the executor's own report: its 2xx answer to the
	// dispatch with a status, or its /complete. Such an outcome keeps the dispatch's nonce, so
	// that the executor reporting it again is told "the same outcome" (SPEC §6). Every other end
	// of a dispatch is sluice's decision (a requeue, lost, a failure after a 429 or a 503 once
	// started, a spent dispatch budget) and voids the nonce: a late /start or /complete on it is
	// dispatch_void. Only an executor reports success, so succeeded counts as reported always.
	Reported bool
	// NotBefore, for a requeue, delays the job's next claim (an executor's 503).
	NotBefore *time.Time
	// CountFailure, for a requeue, spends one unit of the dispatch budget.
	CountFailure bool
	// CountRefusal, for a requeue, counts one more 503 refusal (Row.Refusals), whose delay
	// doubles with each.
	CountRefusal bool
	// Budget is the dispatch budget: a requeue that would spend past it fails the job with
	// dispatch_failed instead. 0 means unlimited.
	Budget int
	// EndedAt is when the executor's answer arrived, if the writer knows (a batch writes it
	// later): the executor time charged to the job's tenant under fair_time ends there. Zero:
	// at the write.
	EndedAt time.Time
}

// ErrFenced is returned when a fenced write matched no row: the writer no longer owns the job.
var ErrFenced = errors.New("store: fenced write lost: the job moved on")

// Finish applies o to job r, which the caller read in tx, and writes a release poke (and, for a
// requeue, an enqueue poke) in the same transaction. The write is fenced on r.Version and on
// r.Status. It returns the state the job ended in, or ErrFenced.
func (s *Store) Finish(ctx context.Context, tx sqldb.DB, now time.Time, r Row, o Outcome) (job.Status, error) {
	to, err := s.FinishMany(ctx, tx, now, []Finishing{{Row: r, Outcome: o}})
	if err != nil {
		return "", err
	}
	return to[0], nil
}

// Finishing is one job and the outcome to apply to it.
type Finishing struct {
	Row     Row
	Outcome Outcome
}

// FinishMany applies each outcome to its job in tx with one UPDATE per kind of transition and
// one outbox INSERT for all the pokes, so that a batch of outcomes costs a handful of statements
// and one commit. Every row's write is fenced on its version and status; if any row's fence
// fails the whole call returns ErrFenced and the caller must roll back. Callers that batch lock
// the rows (SELECT ... FOR UPDATE) and check them first, so the fence only fails for a caller
// that did not. It returns the state each job ended in, in order.
func (s *Store) FinishMany(ctx context.Context, tx sqldb.DB, now time.Time, items []Finishing) ([]job.Status, error) {
	p, err := s.planFinish(now, items)
	if err != nil {
		return nil, err
	}
	if len(p.requeued) > 0 {
		if err := lockInOrder(ctx, tx, items, p.requeued); err != nil {
			return nil, err
		}
	}
	for i, u := range p.updates {
		res, err := tx.ExecContext(ctx, u.query, u.args...)
		if err != nil {
			return nil, fmt.Errorf("finish %d job(s) (%s): %w", u.rows, u.kind, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return nil, fmt.Errorf("finish %d job(s) (%s): %w", u.rows, u.kind, err)
		}
		if err := p.check(i, n); err != nil {
			return nil, err
		}
	}
	if _, err := tx.ExecContext(ctx, p.poke.query, p.poke.args...); err != nil {
		return nil, fmt.Errorf("write outbox: %w", err)
	}
	// A statement of its own: tx may be on a pool that refuses stacked statements (Open).
	if aq, aargs := s.finishAudit(ctx, items); aq != "" {
		if _, err := tx.ExecContext(ctx, aq, aargs...); err != nil {
			return nil, fmt.Errorf("write audit events: %w", err)
		}
	}
	if cq, cargs := s.chargeTime(now, items, p); cq != "" {
		if _, err := tx.ExecContext(ctx, cq, cargs...); err != nil {
			return nil, fmt.Errorf("charge executor time: %w", err)
		}
	}
	s.logFinish(ctx, now, items, p)
	return p.to, nil
}

// FinishManyCommit is FinishMany inside a ConnTx, with the COMMIT in the same round trip: every
// UPDATE and the outbox INSERT go in one round trip, and the fences are checked on the rows each
// statement reports. It is for a caller that locked every row in tx (LockJobs) and kept only the
// items whose version and state it read: no other transaction can then move those rows, so no
// fence can fail. If one does anyway, the writes are committed already, and the error says so
// (ErrFencedCommitted).
func (s *Store) FinishManyCommit(ctx context.Context, tx *ConnTx, now time.Time, items []Finishing) ([]job.Status, error) {
	return s.finishConn(ctx, tx, now, items, true)
}

// ErrFencedCommitted is FinishManyCommit's ErrFenced: a row had moved, and the rest of the batch
// is committed.
var ErrFencedCommitted = fmt.Errorf("committed with a row left unwritten: %w", ErrFenced)

func (s *Store) finishConn(ctx context.Context, tx *ConnTx, now time.Time, items []Finishing, commit bool) ([]job.Status, error) {
	p, err := s.planFinish(now, items)
	if err != nil {
		return nil, err
	}
	stmts, args := s.finishStatements(ctx, items, p)
	run := tx.Exec
	if commit {
		run = tx.ExecCommit
	}
	res, err := run(ctx, stmts, args...)
	if err != nil {
		return nil, fmt.Errorf("finish %d job(s): %w", len(items), err)
	}
	affected := res.AllRowsAffected()
	if len(affected) != len(stmts) {
		return nil, fmt.Errorf("finish %d job(s): %d statement results for %d statements", len(items), len(affected), len(stmts))
	}
	if len(p.requeued) > 0 {
		affected = affected[1:] // the tenant lock's
	}
	for i := range p.updates {
		if err := p.check(i, affected[i]); err != nil {
			if commit {
				return nil, ErrFencedCommitted
			}
			return nil, err
		}
	}
	s.logFinish(ctx, now, items, p)
	return p.to, nil
}

// Requeues reports whether writing items would send a job back to queued (a requeue locks its
// tenant's row, lockorder.go), as FinishMany would decide: a requeue past the dispatch budget
// fails instead.
func Requeues(items []Finishing) bool {
	for _, it := range items {
		o := it.Outcome
		if to, _ := settle(it.Row, &o); to == job.Queued {
			return true
		}
	}
	return false
}

// finishStatements are the statements of plan p for items, with their arguments: the lock of the
// requeued jobs' tenants (the caller locked the job rows, in id order: see lockInOrder), each
// UPDATE, the outbox INSERT and the audit rows.
func (s *Store) finishStatements(ctx context.Context, items []Finishing, p finishPlan) ([]string, []any) {
	stmts := make([]string, 0, 2*len(p.updates)+3)
	var args []any
	if len(p.requeued) > 0 {
		q, targs := lockTenantRowsSQL(p.requeued)
		stmts = append(stmts, q)
		args = append(args, targs...)
	}
	for _, u := range p.updates {
		stmts = append(stmts, u.query)
		args = append(args, u.args...)
	}
	stmts = append(stmts, p.poke.query)
	args = append(args, p.poke.args...)
	if aq, aargs := s.finishAudit(ctx, items); aq != "" {
		stmts = append(stmts, aq)
		args = append(args, aargs...)
	}
	if cq, cargs := s.chargeTime(p.now, items, p); cq != "" {
		stmts = append(stmts, cq)
		args = append(args, cargs...)
	}
	return stmts, args
}

// chargeTime is the statement that charges the executor time of the jobs of items that end with
// an outcome (succeeded or failed), from their start (started_at, else dispatched_at) to their
// answer (Outcome.EndedAt, else now), to their tenants in tenant_time, decaying what each had
// (ChargeTime); "" if none or charging is off. It locks the tenants' tenant_time rows in key
// order, after everything else the transaction holds: the lock order (lockorder.go) puts
// tenant_time last.
func (s *Store) chargeTime(now time.Time, items []Finishing, p finishPlan) (string, []any) {
	if s.ChargeTime == nil || !s.ChargeTime() {
		return "", nil
	}
	used := map[string]float64{}
	for i, it := range items {
		if p.to[i] != job.Succeeded && p.to[i] != job.Failed {
			continue
		}
		start := it.Row.StartedAt
		if start == nil {
			start = it.Row.DispatchedAt
		}
		if start == nil {
			continue
		}
		end := it.Outcome.EndedAt
		if end.IsZero() || end.After(now) {
			end = now
		}
		used[it.Row.Tenant] += max(end.Sub(*start), 0).Seconds()
	}
	if len(used) == 0 {
		return "", nil
	}
	tenants := slices.Sorted(maps.Keys(used))
	args := make([]any, 0, 3*len(tenants)+1)
	for _, t := range tenants {
		args = append(args, t, used[t], now)
	}
	args = append(args, float64(config.FairTimeWindow.Microseconds()))
	return `INSERT INTO tenant_time (tenant, used, used_at) VALUES ` + strings.TrimSuffix(strings.Repeat("(?,?,?),", len(tenants)), ",") + `
		ON DUPLICATE KEY UPDATE used = used * EXP(-GREATEST(TIMESTAMPDIFF(MICROSECOND, used_at, VALUES(used_at)), 0) / ?)
			+ VALUES(used), used_at = GREATEST(used_at, VALUES(used_at))`, args
}

// TimeUsed returns, for each of tenants charged in tenant_time, the executor time it used, in
// seconds, decayed to the database's now (ordering fair_time): one primary-key read per tenant.
func TimeUsed(ctx context.Context, db sqldb.DB, tenants []string) (map[string]float64, error) {
	out := make(map[string]float64, len(tenants))
	if len(tenants) == 0 {
		return out, nil
	}
	args := make([]any, 0, len(tenants)+1)
	args = append(args, float64(config.FairTimeWindow.Microseconds()))
	for _, t := range tenants {
		args = append(args, t)
	}
	rows, err := db.QueryContext(ctx, `SELECT tenant, used * EXP(-GREATEST(TIMESTAMPDIFF(MICROSECOND, used_at, UTC_TIMESTAMP(6)), 0) / ?)
		FROM tenant_time WHERE tenant IN (`+Placeholders(len(tenants))+`)`, args...)
	if err != nil {
		return nil, fmt.Errorf("read the tenants' time used: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var t string
		var used float64
		if err := rows.Scan(&t, &used); err != nil {
			return nil, fmt.Errorf("read the tenants' time used: %w", err)
		}
		out[t] = used
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the tenants' time used: %w", err)
	}
	return out, nil
}

// finishPlan is the statements that apply a batch of outcomes.
type finishPlan struct {
	now      time.Time      // the outcomes' time
	updates  []finishUpdate // one per kind of transition
	poke     finishUpdate   // the outbox INSERT of every release and enqueue poke
	to       []job.Status   // the state each job ends in
	codes    []string       // the error code each job ends with
	requeued []string       // the tenants of the jobs going back to queued
}

type finishUpdate struct {
	kind  string
	query string
	args  []any
	rows  int // the rows the statement must change
}

// check returns ErrFenced unless update i changed every row it names.
func (p finishPlan) check(i int, affected int64) error {
	if int(affected) != p.updates[i].rows {
		return ErrFenced
	}
	return nil
}

func (s *Store) logFinish(ctx context.Context, now time.Time, items []Finishing, p finishPlan) {
	for i := range items {
		s.LogTransition(ctx, items[i].Row, p.to[i], items[i].Row.Version+1, now, p.codes[i])
	}
}

// finishGroup is the jobs of one kind of transition, which one UPDATE writes.
type finishGroup struct {
	kind    string
	ids     []int64
	items   []int  // indexes in the items planned
	started string // the started_at expression of this kind of transition
	void    bool   // whether it voids the dispatch's nonce (see Outcome.Reported)
}

// planFinish decides the state each item ends in and builds the statements that write it: one
// UPDATE per kind of transition (finishUpdateOf), then the outbox INSERT of every poke.
func (s *Store) planFinish(now time.Time, items []Finishing) (finishPlan, error) {
	var groups []*finishGroup
	byKind := map[string]*finishGroup{}
	p := finishPlan{now: now, to: make([]job.Status, len(items)), codes: make([]string, len(items))}
	msgs := make([]outbox.Message, 0, 2*len(items))
	for i := range items {
		r, o := items[i].Row, &items[i].Outcome
		p.to[i], p.codes[i] = settle(r, o)
		kind, started, void, err := finishKind(r, *o, p.to[i], p.codes[i])
		if err != nil {
			return finishPlan{}, err
		}
		g, ok := byKind[kind]
		if !ok {
			g = &finishGroup{kind: kind, started: started, void: void}
			byKind[kind] = g
			groups = append(groups, g)
		}
		g.ids = append(g.ids, r.ID)
		g.items = append(g.items, i)
		msgs = append(msgs, outbox.PokeMessage(s.prefix(), outbox.Release, r.Tenant, r.ID))
		if p.to[i] == job.Queued {
			msgs = append(msgs, outbox.PokeMessage(s.prefix(), outbox.Enqueue, r.Tenant, r.ID))
		}
	}
	for i := range items {
		if p.to[i] == job.Queued {
			p.requeued = append(p.requeued, items[i].Row.Tenant)
		}
	}
	for _, g := range groups {
		p.updates = append(p.updates, finishUpdateOf(now, items, p, g))
	}
	p.poke.query, p.poke.args = outbox.Insert(now, msgs...)
	return p, nil
}

// settle cleans o's error fields and returns the state and error code job r ends in: o's, or
// failed with dispatch_failed for a requeue that would spend past the dispatch budget.
func settle(r Row, o *Outcome) (job.Status, string) {
	o.ErrorCode, o.ErrorMessage = CleanError(o.ErrorCode, o.ErrorMessage)
	if o.Status == job.Queued && o.CountFailure && o.Budget > 0 && r.DispatchFailures+1 >= o.Budget {
		if o.ErrorMessage == "" {
			o.ErrorMessage = "dispatch budget spent"
		}
		return job.Failed, string(job.CodeDispatchFailed)
	}
	return o.Status, o.ErrorCode
}

// finishKind returns the kind of transition that moves r to state to with code, the started_at
// expression it writes, and whether it voids the dispatch's nonce.
func finishKind(r Row, o Outcome, to job.Status, code string) (kind, started string, void bool, err error) {
	switch {
	case to == job.Queued:
		return "requeue", "", true, nil
	case to == job.Lost:
		// Lost keeps started_at as it is: the discriminator between "never ran" and "died
		// mid-run".
		return "lost", "started_at", true, nil
	case to == job.Failed && code == string(job.CodeDispatchFailed):
		return "never_started", "NULL", true, nil
	case to == job.Succeeded || (to == job.Failed && o.Reported):
		// A job that reports an outcome evidently started.
		return "done", "COALESCE(started_at, dispatched_at)", false, nil
	case to == job.Failed:
		// Failed by sluice after a confirmed start (a 429 or a 503): started_at stays as the
		// confirmation wrote it.
		return "failed_by_sluice", "started_at", true, nil
	default:
		return "", "", false, fmt.Errorf("finish job %d: unsupported outcome %q", r.ID, to)
	}
}

// finishUpdateOf builds the UPDATE of group g of plan p, fenced on each job's version and state.
func finishUpdateOf(now time.Time, items []Finishing, p finishPlan, g *finishGroup) finishUpdate {
	var set strings.Builder
	var args []any
	// perJob sets name to each job's own value, or to the one value when every job of the group
	// has the same (a batch of successes with no error and no result, the usual case): a CASE
	// with a branch per job costs the server a comparison per branch for each row it writes.
	perJob := func(name, prefix string, val func(i int) any) {
		vals := make([]any, len(g.items))
		for k, i := range g.items {
			vals[k] = val(i)
		}
		if allSame(vals) {
			set.WriteString(", " + name + " = " + prefix + "?")
			args = append(args, vals[0])
			return
		}
		set.WriteString(", " + name + " = " + prefix + "CASE id")
		for k, i := range g.items {
			set.WriteString(" WHEN ? THEN ?")
			args = append(args, items[i].Row.ID, vals[k])
		}
		set.WriteString(" END")
	}
	col := func(name string, val func(i int) any) { perJob(name, "", val) }
	col("error_code", func(i int) any { return nullStr(p.codes[i]) })
	col("error_message", func(i int) any { return nullStr(items[i].Outcome.ErrorMessage) })
	var q string
	if g.kind == "requeue" {
		col("not_before", func(i int) any { return items[i].Outcome.NotBefore })
		// An increment, not the value read: a caller may hand back a row it never read whole.
		count := func(name string, counts func(o Outcome) bool) {
			perJob(name, name+" + ", func(i int) any {
				if counts(items[i].Outcome) {
					return 1
				}
				return 0
			})
		}
		count("dispatch_failures", func(o Outcome) bool { return o.CountFailure })
		count("refusals", func(o Outcome) bool { return o.CountRefusal })
		q = `UPDATE jobs SET status = 'queued', version = version + 1, claimed_at = NULL,
				dispatched_at = NULL, started_at = NULL, lease_until = NULL, drainer_id = NULL,
				voided_nonce_sha256 = nonce_sha256, nonce_sha256 = NULL, nonce_expires_at = NULL` + set.String()
	} else {
		col("status", func(i int) any { return string(p.to[i]) })
		col("result", func(i int) any {
			if r := items[i].Outcome.Result; len(r) > 0 {
				return []byte(r)
			}
			return nil
		})
		q = `UPDATE jobs SET version = version + 1, started_at = ` + g.started + `, finished_at = ?,
				lease_until = NULL`
		if g.void {
			q += `, voided_nonce_sha256 = nonce_sha256, nonce_sha256 = NULL, nonce_expires_at = NULL`
		}
		q += set.String()
		args = append([]any{now}, args...)
	}
	// The fence is a row-constructor IN over (id, version, status) (see the package doc).
	q += " WHERE id IN (" + Placeholders(len(g.ids)) + ")"
	for _, id := range g.ids {
		args = append(args, id)
	}
	q += " AND (id, version, status) IN (" + strings.TrimSuffix(strings.Repeat("(?,?,?),", len(g.items)), ",") + ")"
	for _, i := range g.items {
		r := items[i].Row
		args = append(args, r.ID, r.Version, string(r.Status))
	}
	return finishUpdate{kind: g.kind, query: q, args: args, rows: len(g.ids)}
}

// allSame reports whether every one of vals (at least one) is the same as the first. They are
// what finishUpdateOf binds: nil, a string, an int, a []byte or a *time.Time; values of any other
// type are never taken as the same.
func allSame(vals []any) bool {
	for _, v := range vals[1:] {
		if !sameArg(vals[0], v) {
			return false
		}
	}
	return true
}

func sameArg(a, b any) bool {
	switch a := a.(type) {
	case nil:
		return b == nil
	case string:
		b, ok := b.(string)
		return ok && a == b
	case int:
		b, ok := b.(int)
		return ok && a == b
	case []byte:
		b, ok := b.([]byte)
		return ok && a != nil && b != nil && bytes.Equal(a, b)
	case *time.Time:
		b, ok := b.(*time.Time)
		return ok && (a == nil) == (b == nil) && (a == nil || a.Equal(*b))
	}
	return false
}
