package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/sqldb"
)

// The audit trail (SPEC §10, migration 0013). A transition's row is written by the statements
// built here, which their callers append to a round trip the transition already makes, in its
// own transaction: a rollback takes the row with it, and the trail never disagrees with the job.

// Audit event names (the event column).
const (
	EventAdmitted      = "admitted"
	EventReplayed      = "replayed"
	EventRefused       = "refused"
	EventShadowRefused = "shadow_refused"
	EventTransition    = "transition"
)

// AuditEvent is one row of audit_events. Zero values are stored as NULL (or ” for Tenant and
// Actor); ID is the database's, and so is At: the INSERT's clock when zero, else a reading of
// the database's clock the decision took (a refusal written later through the AuditQueue keeps
// its admission's instant).
type AuditEvent struct {
	ID        int64           `json:"id"`
	At        time.Time       `json:"at"`
	Event     string          `json:"event"`
	Tenant    string          `json:"tenant,omitempty"`
	JobID     *int64          `json:"job_id,omitempty"`
	SlotID    *string         `json:"slot_id,omitempty"`
	Actor     string          `json:"actor,omitempty"`
	From      string          `json:"from,omitempty"`
	To        string          `json:"to,omitempty"`
	Version   *int64          `json:"version,omitempty"`
	Attempt   *int            `json:"attempt,omitempty"`
	ErrorCode string          `json:"error_code,omitempty"`
	Scope     string          `json:"scope,omitempty"`
	Detail    json.RawMessage `json:"detail,omitempty"`
}

type actorKey struct{}

// WithActor returns ctx carrying actor, the caller (token name) or drainer id that the audit
// rows of the transitions made under ctx name.
func WithActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
}

// ActorOf returns the actor WithActor put in ctx, or "".
func ActorOf(ctx context.Context) string {
	a, _ := ctx.Value(actorKey{}).(string)
	return a
}

// actor is the actor of a transition this Store writes under ctx: ctx's, else the Store's own.
func (s *Store) actor(ctx context.Context) string {
	if a := ActorOf(ctx); a != "" {
		return a
	}
	return s.Actor
}

const auditInsert = `INSERT INTO audit_events (event, tenant, job_id, slot_id, actor, from_status, to_status,
	version, attempt, error_code, scope, detail) `

// auditInsertSQL is one INSERT of events (at least one), stamped with the database time.
func auditInsertSQL(events []AuditEvent) (string, []any) {
	return auditValues(events, "?")
}

// firstJobSQL keeps the first id a jobs INSERT just generated in a session variable, for the
// audit rows of its jobs (auditNewJobsSQL) to name them after other INSERTs moved
// LAST_INSERT_ID() on. It goes right after that jobs INSERT, in its transaction.
const firstJobSQL = "SET @sluice_first_job = LAST_INSERT_ID()"

// auditNewJobsSQL is auditInsertSQL for the jobs of the INSERT that firstJobSQL followed: each
// event's JobID is its job's id less that INSERT's first id (its offset among the INSERT's rows
// times the session's id step, idStepSQL).
func auditNewJobsSQL(events []AuditEvent) (string, []any) {
	return auditValues(events, "@sluice_first_job + ?")
}

// auditAdmittedRangesSQL is the INSERT of the audit rows of jobs just inserted whose event their
// job row implies (AdmittedByRow): admitted, by the job's caller, into its status, version 0,
// attempt 0, no code or scope. Each takes tenant, id, caller and status from its job row, which
// the transaction just wrote, and only its detail from the statement. ids[i] is the id of the
// job of details[i] (nil for a job whose event its row does not imply: auditInsertSQL writes
// those); each jobs INSERT's ids run from its first by step (the session's
// auto_increment_increment, idStepSQL), increasing from one INSERT to the next. The statement
// reads each INSERT's range of ids, only the ids on its step (another node of a Galera cluster
// writes between them), and finds a row's offset by comparing its id with the ranges' ends (one
// comparison per INSERT).
//
// The details travel as one value: each padded with spaces to the longest, which no detail ends
// with (AdmittedByRow), and a row's cut out by its offset and trimmed; a nil detail is all
// spaces, trimmed to nothing, and its row is left out. The value is cut as bytes (CAST AS
// BINARY): a prepared statement's parameter is text in the connection's character set, which
// SUBSTRING would count in characters. The statement's text no longer grows with the batch, so
// batches of any size share one prepared statement (StmtCache), where a value per detail made
// each size a statement of its own, and sizes beyond the cache's room were sent as text, whose
// thousand string values the server parses: a batch of 1,000 jobs' audit statement cost 7.3-9.6
// ms against 5.7-5.8 ms with the details in one value (scratch database, 30 alternated
// rounds). Prepared, with the batch's fixed size, the gain is smaller (BENCHMARKS.md, session 31).
func auditAdmittedRangesSQL(ids []int64, step int64, details []json.RawMessage) (string, []any) {
	type run struct{ first, last, at int64 } // a range of ids on the step; at: first's index
	var runs []run
	for i, id := range ids {
		if n := len(runs); n > 0 && id == runs[n-1].last+step {
			runs[n-1].last = id
			continue
		}
		runs = append(runs, run{first: id, last: id, at: int64(i)})
	}
	width := 0
	for _, d := range details {
		width = max(width, len(d))
	}
	packed := make([]byte, 0, width*len(details))
	for _, d := range details {
		packed = append(packed, d...)
		for range width - len(d) {
			packed = append(packed, ' ')
		}
	}
	args := make([]any, 0, 6*len(runs)+5)
	args = append(args, packed)
	var offset, where strings.Builder
	offset.WriteString("CASE")
	for i, r := range runs {
		offset.WriteString(" WHEN id <= ? THEN (id - ?) DIV ? + ?")
		args = append(args, r.last, r.first, step, r.at)
		if i > 0 {
			where.WriteString(" OR ")
		}
		where.WriteString("id BETWEEN ? AND ?")
	}
	offset.WriteString(" END")
	args = append(args, width, width)
	for _, r := range runs {
		args = append(args, r.first, r.last)
	}
	onStep := ""
	if step > 1 {
		// Every run's ids are on the same step: INSERTs of one session differ by multiples of it.
		onStep = " AND id MOD ? = ?"
		args = append(args, step, runs[0].first%step)
	}
	return `INSERT INTO audit_events (event, tenant, job_id, actor, to_status, version, attempt, detail)
		SELECT '` + EventAdmitted + `', tenant, id, caller, status, 0, 0, RTRIM(SUBSTRING(CAST(? AS BINARY), (` + offset.String() +
		`) * ? + 1, ?)) AS d FROM jobs WHERE (` + where.String() + `)` + onStep + `
		HAVING d <> ''`, args
}

// AdmittedByRow reports whether e, the admission event of job j, is what j's row implies, so that
// auditAdmittedRangesSQL can write it: admitted, queued, by the job's caller, with a detail (not
// ending in a space, which that statement pads with) and nothing else.
func AdmittedByRow(e AuditEvent, j NewJob) bool {
	return e.Event == EventAdmitted && j.Rejected == "" && e.Tenant == j.Tenant && e.Actor == j.Caller &&
		e.To == string(job.Queued) && e.From == "" && e.ErrorCode == "" && e.Scope == "" && e.SlotID == nil &&
		e.JobID == nil && e.Version != nil && *e.Version == 0 && e.Attempt != nil && *e.Attempt == 0 &&
		len(e.Detail) > 0 && e.Detail[len(e.Detail)-1] != ' '
}

func auditValues(events []AuditEvent, jobID string) (string, []any) {
	var q strings.Builder
	q.WriteString(auditInsert + "VALUES ")
	args := make([]any, 0, 12*len(events))
	for i, e := range events {
		if i > 0 {
			q.WriteString(",")
		}
		q.WriteString("(?,?," + jobID + ",?,?,?,?,?,?,?,?,?)")
		args = appendAuditArgs(args, e)
	}
	return q.String(), args
}

// auditStampedSQL is auditInsertSQL writing each event's At, or the INSERT's clock for a zero
// one.
func auditStampedSQL(events []AuditEvent) (string, []any) {
	var q strings.Builder
	q.WriteString(`INSERT INTO audit_events (at, event, tenant, job_id, slot_id, actor, from_status, to_status,
	version, attempt, error_code, scope, detail) VALUES `)
	args := make([]any, 0, 13*len(events))
	for i, e := range events {
		if i > 0 {
			q.WriteString(",")
		}
		q.WriteString("(COALESCE(?, UTC_TIMESTAMP(6)),?,?,?,?,?,?,?,?,?,?,?,?)")
		var at any
		if !e.At.IsZero() {
			at = e.At.UTC()
		}
		args = appendAuditArgs(append(args, at), e)
	}
	return q.String(), args
}

func appendAuditArgs(args []any, e AuditEvent) []any {
	var jobID, slotID, version, attempt, detail any
	if e.JobID != nil {
		jobID = *e.JobID
	}
	if e.SlotID != nil {
		slotID = *e.SlotID
	}
	if e.Version != nil {
		version = *e.Version
	}
	if e.Attempt != nil {
		attempt = *e.Attempt
	}
	if len(e.Detail) > 0 {
		detail = string(e.Detail)
	}
	return append(args, e.Event, e.Tenant, jobID, slotID, e.Actor, nullStr(e.From), nullStr(e.To),
		version, attempt, nullStr(e.ErrorCode), nullStr(e.Scope), detail)
}

// auditTransitionsSQL is the INSERT of one transition row per job of ids, read from the jobs as
// the transaction's own UPDATE left them (status, version, attempt, error code), with from[id]
// the state each left; withCode takes the error code from the row, which only a transition that
// writes one should (a claim leaves the code of the dispatch before). The caller runs it after that UPDATE in the same transaction, and only
// where every id was moved (a fence that failed rolls the transaction back) unless fence, an
// extra condition on the jobs' rows, picks out those the UPDATE moved; fenceArgs are its
// arguments.
//
// The state each job left is a constant when they all left the same one (a claim: queued), else
// one IN list per state: the server sorts a constant IN list and searches it, where a WHEN per id
// would be compared one by one for every row.
func auditTransitionsSQL(actor string, ids []int64, from map[int64]job.Status, withCode bool, fence string, fenceArgs ...any) (string, []any) {
	var q strings.Builder
	args := make([]any, 0, 2*len(ids)+4+len(fenceArgs))
	q.WriteString(auditInsert + "SELECT '" + EventTransition + "', tenant, id, NULL, ?, ")
	args = append(args, actor)
	var states []job.Status
	byState := map[job.Status][]int64{}
	for _, id := range ids {
		st := from[id]
		if _, ok := byState[st]; !ok {
			states = append(states, st)
		}
		byState[st] = append(byState[st], id)
	}
	if len(states) == 1 {
		q.WriteString("?")
		args = append(args, string(states[0]))
	} else {
		q.WriteString("CASE")
		for _, st := range states {
			q.WriteString(" WHEN id IN (" + Placeholders(len(byState[st])) + ") THEN ?")
			for _, id := range byState[st] {
				args = append(args, id)
			}
			args = append(args, string(st))
		}
		q.WriteString(" END")
	}
	code := "NULL"
	if withCode {
		code = "error_code"
	}
	q.WriteString(", status, version, attempt, " + code + ", NULL, NULL FROM jobs WHERE id IN (" + Placeholders(len(ids)) + ")")
	for _, id := range ids {
		args = append(args, id)
	}
	if fence != "" {
		q.WriteString(" AND " + fence)
		args = append(args, fenceArgs...)
	}
	return q.String(), args
}

// transitionEvent is the audit row of r moving to to at version, as a value.
func transitionEvent(actor string, r Row, to job.Status, version int64, attempt int, code string) AuditEvent {
	id := r.ID
	return AuditEvent{Event: EventTransition, Tenant: r.Tenant, JobID: &id, Actor: actor, From: string(r.Status),
		To: string(to), Version: &version, Attempt: &attempt, ErrorCode: code}
}

// InsertAudit writes events (if any) in one statement of db, each at its At if set.
func InsertAudit(ctx context.Context, db sqldb.DB, events []AuditEvent) error {
	if len(events) == 0 {
		return nil
	}
	build := auditInsertSQL
	if slices.ContainsFunc(events, func(e AuditEvent) bool { return !e.At.IsZero() }) {
		build = auditStampedSQL
	}
	q, args := build(events)
	if _, err := db.ExecContext(ctx, q, args...); err != nil {
		return fmt.Errorf("write %d audit event(s): %w", len(events), err)
	}
	return nil
}

// insertAudit writes events in tx, the transaction of the transitions they record, unless the
// Store's audit is off.
func (s *Store) insertAudit(ctx context.Context, tx sqldb.DB, events ...AuditEvent) error {
	if s.AuditOff {
		return nil
	}
	return InsertAudit(ctx, tx, events)
}

const auditSelect = `SELECT id, at, event, tenant, job_id, slot_id, actor, from_status, to_status, version,
	attempt, error_code, scope, detail FROM audit_events `

// JobEvents returns job id's audit events, oldest first, at most limit of them.
func JobEvents(ctx context.Context, db sqldb.DB, id int64, limit int) ([]AuditEvent, error) {
	return JobEventsAfter(ctx, db, id, 0, limit)
}

// JobEventsAfter returns job id's audit events with an id above after, oldest first, at most
// limit of them. A job's transitions are written one transaction after another under its row's
// lock, so a later event of one job always has a higher id: a follower that read up to an id
// misses nothing by reading after it.
func JobEventsAfter(ctx context.Context, db sqldb.DB, id, after int64, limit int) ([]AuditEvent, error) {
	rows, err := db.QueryContext(ctx, auditSelect+"WHERE job_id = ? AND id > ? ORDER BY id LIMIT ?", id, after, limit)
	if err != nil {
		return nil, fmt.Errorf("read job %d's audit events: %w", id, err)
	}
	return scanAudit(rows)
}

// AuditFilter selects audit events for ListAudit.
type AuditFilter struct {
	Tenant *string
	Event  string
	Since  *time.Time
	Before int64 // only ids below this (a page's cursor); 0 for none
	Limit  int
}

// AuditScanRows bounds the rows one ListAudit call examines when a filter (event, since) is not
// served by an index: a rare event must not make one request read the whole table.
const AuditScanRows = 10000

// AuditPage is what ListAudit found: at most Limit events, newest first, and Next, when not 0,
// the id the listing continues below (as a cursor) because the call examined AuditScanRows rows
// without filling the page.
type AuditPage struct {
	Events []AuditEvent
	Next   int64
}

// ListAudit returns the events f selects, newest first, by the primary key: audit_events has no
// index of tenant, event or time (migrations 0016 and 0017 dropped them: each cost every audited
// write an index insert). Without a filter the key serves the page exactly; with one (tenant,
// event, since), the call examines at most AuditScanRows rows newest first and returns what
// matched among them, with Next set where the listing continues if the page is not full. Its two
// statements read the same rows: the first finds the lowest id of the window, the second the
// page within it.
func ListAudit(ctx context.Context, db sqldb.DB, f AuditFilter) (AuditPage, error) {
	var where []string
	var args []any
	if f.Before > 0 {
		where = append(where, "id < ?")
		args = append(args, f.Before)
	}
	var floor int64
	if f.Tenant != nil || f.Event != "" || f.Since != nil {
		var lowest sql.NullInt64
		var seen int
		window := "SELECT id FROM audit_events " + whereOf(where) + " ORDER BY id DESC LIMIT ?"
		if err := db.QueryRowContext(ctx, "SELECT MIN(id), COUNT(*) FROM ("+window+") w",
			append(slices.Clip(args), AuditScanRows)...).Scan(&lowest, &seen); err != nil {
			return AuditPage{}, fmt.Errorf("list audit events: %w", err)
		}
		if seen == 0 {
			return AuditPage{Events: []AuditEvent{}}, nil
		}
		floor = lowest.Int64
		where = append(where, "id >= ?")
		args = append(args, floor)
		if f.Tenant != nil {
			where = append(where, "tenant = ?")
			args = append(args, *f.Tenant)
		}
		if f.Event != "" {
			where = append(where, "event = ?")
			args = append(args, f.Event)
		}
		if f.Since != nil {
			where = append(where, "at >= ?")
			args = append(args, *f.Since)
		}
		if seen < AuditScanRows {
			floor = 0 // the window reached the first row
		}
	}
	rows, err := db.QueryContext(ctx, auditSelect+whereOf(where)+" ORDER BY id DESC LIMIT ?", append(args, f.Limit)...)
	if err != nil {
		return AuditPage{}, fmt.Errorf("list audit events: %w", err)
	}
	events, err := scanAudit(rows)
	if err != nil {
		return AuditPage{}, err
	}
	page := AuditPage{Events: events}
	if len(events) < f.Limit {
		page.Next = floor
	}
	return page, nil
}

func whereOf(conds []string) string {
	if len(conds) == 0 {
		return ""
	}
	return "WHERE " + strings.Join(conds, " AND ")
}

func scanAudit(rows *sql.Rows) ([]AuditEvent, error) {
	defer rows.Close()
	out := []AuditEvent{}
	for rows.Next() {
		var e AuditEvent
		var jobID, version sql.NullInt64
		var attempt sql.NullInt32
		var slot, from, to, code, scope, detail sql.NullString
		if err := rows.Scan(&e.ID, &e.At, &e.Event, &e.Tenant, &jobID, &slot, &e.Actor, &from, &to, &version,
			&attempt, &code, &scope, &detail); err != nil {
			return nil, fmt.Errorf("read audit events: %w", err)
		}
		e.At = e.At.UTC()
		if jobID.Valid {
			e.JobID = &jobID.Int64
		}
		e.SlotID = strPtr(slot)
		if version.Valid {
			e.Version = &version.Int64
		}
		if attempt.Valid {
			a := int(attempt.Int32)
			e.Attempt = &a
		}
		e.From, e.To, e.ErrorCode, e.Scope = from.String, to.String, code.String, scope.String
		if detail.Valid && detail.String != "" {
			e.Detail = json.RawMessage(detail.String)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read audit events: %w", err)
	}
	return out, nil
}

// PurgeAudit deletes up to limit audit events older than cutoff, oldest first, and returns how
// many it deleted (SPEC §9 audit_retention_days). It walks the primary key, never an index of
// `at` (migration 0016 dropped it): ids are given in time order, near enough (a row's at is its
// statement's start, its id is taken during the statement, so neighbours may differ by the
// length of a statement; a refusal written through the AuditQueue carries its admission's
// instant, a flush earlier than its id's neighbours), so the oldest events are the first ids. It finds the highest id among
// the first limit rows that is older than cutoff, then deletes the rows up to it that are: each
// statement reads at most limit rows, and a row younger than cutoff is never deleted.
func PurgeAudit(ctx context.Context, db sqldb.DB, cutoff time.Time, limit int) (int64, error) {
	var last sql.NullInt64
	if err := db.QueryRowContext(ctx, "SELECT MAX(id) FROM (SELECT id, at FROM audit_events ORDER BY id LIMIT ?) w WHERE at < ?",
		limit, cutoff).Scan(&last); err != nil {
		return 0, fmt.Errorf("purge audit events: %w", err)
	}
	if !last.Valid {
		return 0, nil
	}
	res, err := db.ExecContext(ctx, "DELETE FROM audit_events WHERE id <= ? AND at < ?", last.Int64, cutoff)
	if err != nil {
		return 0, fmt.Errorf("purge audit events: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("purge audit events: %w", err)
	}
	return n, nil
}

// finishAudit is the transition rows of FinishMany's items, read after its UPDATEs: every item
// moved, or the transaction rolls back (ErrFenced; FinishManyCommit's caller has locked and
// checked every row, so its fences hold). It is "" when the Store's audit is off.
func (s *Store) finishAudit(ctx context.Context, items []Finishing) (string, []any) {
	if s.AuditOff {
		return "", nil
	}
	ids := make([]int64, len(items))
	from := make(map[int64]job.Status, len(items))
	for i, it := range items {
		ids[i], from[it.Row.ID] = it.Row.ID, it.Row.Status
	}
	return auditTransitionsSQL(s.actor(ctx), ids, from, true, "")
}
