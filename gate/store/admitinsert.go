package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/outbox"
)

// NewJob is a job row an admission writes: queued, or rejected by a depth cap.
type NewJob struct {
	Tenant        string
	RateKeySHA256 *string
	Caller        string
	RetryOf       *int64
	// Lanes (distinct, configured) and Interactive are the job's capacity class (SPEC §5a).
	Lanes       []string
	Interactive bool
	// Rejected, if not empty, is the message of a depth cap's refusal: the row is written
	// rejected (queue_full), finished at once, without the payload, and without the idempotency
	// key, which it does not consume (the caller may retry with it).
	Rejected string
	// Payload, IdempotencyKey and RequestSHA256 (the request's fingerprint) of a queued job.
	Payload        []byte
	IdempotencyKey *string
	RequestSHA256  []byte
	// Poke, for a queued job, writes its enqueue poke.
	Poke bool
	// Due, if after the admission's Now, schedules a queued job: it joins its tenant's queue at
	// Due (its queued_at, so it takes its place among the jobs due then and the claim's range
	// over the queue stops before it) and is not eligible before it (not_before).
	Due time.Time
	// StartBy, if set, is a queued job's start deadline (start_by): not dispatched by then, it
	// ends expired (ExpireStartDeadlines).
	StartBy *time.Time
	// ReplaceKey, if set, is a queued job's replace_key (AdmissionTx.LockReplaceable,
	// Store.Replace).
	ReplaceKey *string
	// Priority, if set, is the job's priority (SPEC §5); nil is job.DefaultPriority.
	Priority *int
}

// priority is the priority j's row stores.
func (j NewJob) priority() int {
	if j.Priority == nil {
		return job.DefaultPriority
	}
	return *j.Priority
}

// scheduled reports whether j is queued for later than now.
func (j NewJob) scheduled(now time.Time) bool { return j.Rejected == "" && j.Due.After(now) }

// NewJobs are the rows one admission transaction writes.
type NewJobs struct {
	Now time.Time // the transaction's time (AdmissionState.Now)
	// NoHeadAfterNow, from AdmissionState, says that no tenant of Jobs has a queue head dated
	// after Now: the queue-state UPDATE then needs no lookup of a tenant's oldest job.
	NoHeadAfterNow bool
	Prefix         string   // the pokes' subject prefix
	Jobs           []NewJob // at least one
	// Audit, if not nil, holds each job's admission event (SPEC §10), written in the same round
	// trip and transaction as the job; InsertJobs fills in the job ids.
	Audit []AuditEvent
}

// InsertedJobs are the ids InsertJobs learned: the job of each NewJob in order, and the outbox
// row of its poke (0 for none).
type InsertedJobs struct {
	IDs     []int64
	PokeIDs []int64
}

// insertChunk bounds the rows of one INSERT, well under max_allowed_packet for any payloads a
// batch body may carry.
const insertChunk = 250

// InsertJobs writes, in one round trip (one statement at a time in a batch, prepared), the rows
// of p.Jobs, insertChunk rows an INSERT, each followed by the INSERT of its chunk's enqueue
// pokes, whose bodies carry their jobs' ids (outbox.InsertPokes); and last the UPDATE that adds
// the queued jobs to their tenants' queue state (queueCountSQL). With commit (only where
// CanCommitWithInsert), COMMIT goes in the same round trip: if the connection breaks there, the
// outcome and the ids are both unknown. A multi-row INSERT of known size gets ids first,
// first+step, ... (idStepSQL), which is how one round trip learns every id: the statements name
// a row of an INSERT by its first id plus the row's offset times the step.
//
// The audit rows (p.Audit) go in the same round trip, named by the session variable firstJobSQL
// sets, when the statements share one; a batch's prepared statements each take a round trip of
// their own, so there they go last, in one statement naming the ids the INSERTs returned
// (admissionAudit), which saves two round trips per chunk.
func (t *AdmissionTx) InsertJobs(ctx context.Context, p NewJobs, commit bool) (InsertedJobs, error) {
	prepared := t.tx != nil
	step, err := t.readIDStep(ctx)
	if err != nil {
		return InsertedJobs{}, fmt.Errorf("insert jobs: %w", err)
	}
	w := insertStatements(p, !prepared, step)
	ids, err := t.exec(ctx, w.stmts, w.args, commit)
	if err == nil && prepared && w.stepped {
		_, err = t.exec(ctx, []string{idStepGuardSQL}, [][]any{{step}}, false)
	}
	if err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1242 {
			err = ErrIDStepChanged
		}
		return InsertedJobs{}, fmt.Errorf("insert jobs: %w", err)
	}
	if len(ids) != len(w.stmts) {
		return InsertedJobs{}, fmt.Errorf("insert jobs: %d insert ids for %d statements", len(ids), len(w.stmts))
	}
	out := InsertedJobs{IDs: make([]int64, len(p.Jobs)), PokeIDs: make([]int64, len(p.Jobs))}
	for _, c := range w.chunks {
		for i, j := range c.jobs {
			out.IDs[j] = ids[c.stmt] + int64(i)*step
		}
		for i, j := range c.pokes {
			out.PokeIDs[j] = ids[c.stmt+w.pokeOffset] + int64(i)*step
		}
	}
	if prepared && p.Audit != nil {
		stmts, args := admissionAudit(p, out.IDs, step)
		if _, err := t.exec(ctx, stmts, args, false); err != nil {
			return InsertedJobs{}, fmt.Errorf("insert jobs: audit: %w", err)
		}
	}
	return out, nil
}

// ErrIDStepChanged is InsertJobs' error when the session's id step (idStepSQL) was not, by the
// end of the INSERTs, the one read with the admission state: a Galera cluster that lost or gained
// a node changed auto_increment_increment in between, and the ids derived from each INSERT's
// first would be wrong. Nothing is committed; the transaction may be retried as a whole.
var ErrIDStepChanged = errors.New("auto_increment_increment changed during the transaction (a Galera membership change)")

// idStepGuardSQL fails the round trip, before its COMMIT, with error 1242 (a subquery of more than
// one row) unless the session's id step is still its argument: MySQL and MariaDB both run it,
// where SIGNAL outside a stored program is MariaDB's alone.
const idStepGuardSQL = "SET @sluice_id_step = (SELECT x FROM (SELECT 1 AS x UNION ALL SELECT 2) two WHERE " + idStepSQL + " <> ?)"

// admissionAudit is the statements of the audit rows of p.Jobs, whose ids are ids: those their
// job rows imply in one INSERT ... SELECT when there are at least derivedAuditMin
// (auditAdmittedRangesSQL, given the INSERTs' id step), the others in one INSERT of values.
func admissionAudit(p NewJobs, ids []int64, step int64) ([]string, [][]any) {
	details := make([]json.RawMessage, len(p.Jobs))
	implied := 0
	for i := range p.Jobs {
		if AdmittedByRow(p.Audit[i], p.Jobs[i]) {
			details[i] = p.Audit[i].Detail
			implied++
		}
	}
	if implied < derivedAuditMin {
		clear(details)
		implied = 0
	}
	var stmts []string
	var args [][]any
	var others []AuditEvent
	for i := range p.Jobs {
		if details[i] == nil {
			e := p.Audit[i]
			e.JobID = &ids[i]
			others = append(others, e)
		}
	}
	if implied > 0 {
		q, a := auditAdmittedRangesSQL(ids, step, details)
		stmts, args = append(stmts, q), append(args, a)
	}
	if len(others) > 0 {
		q, a := auditInsertSQL(others)
		stmts, args = append(stmts, q), append(args, a)
	}
	return stmts, args
}

// writes are InsertJobs' statements: stmts[i] with arguments args[i].
type writes struct {
	stmts  []string
	args   [][]any
	chunks []written
	// pokeOffset is each outbox INSERT's place after its jobs INSERT: 2 when firstJobSQL (the
	// audit rows' first job id) sits between them, else 1.
	pokeOffset int
	// stepped says that an INSERT has several rows, whose ids depend on the id step: the step
	// is checked after the INSERTs (idStepGuardSQL; last in stmts when they share a round trip).
	stepped bool
}

// written is one chunk of InsertJobs' rows.
type written struct {
	jobs  []int // indexes in NewJobs.Jobs of the rows of a jobs INSERT, in order
	pokes []int // of the rows of the outbox INSERT after it, if any
	stmt  int   // index of the jobs INSERT among stmts
}

// insertStatements is InsertJobs' statements, with those of the audit rows (p.Audit) when
// oneTrip (they share a round trip, and so the session variable firstJobSQL sets). step is the
// session's id step (idStepSQL): a row's id is its INSERT's first id plus its offset times step.
func insertStatements(p NewJobs, oneTrip bool, step int64) writes {
	w := writes{pokeOffset: 1}
	withAudit := oneTrip && p.Audit != nil
	// One INSERT of jobs whose first id the statements after it can name (firstJobSQL): the
	// queue state's UPDATE then gives a tenant that had no queued job its new head by id.
	firstKnown := oneTrip && len(p.Jobs) <= insertChunk
	if withAudit || firstKnown {
		w.pokeOffset = 2
	}
	for start := 0; start < len(p.Jobs); start += insertChunk {
		end := min(len(p.Jobs), start+insertChunk)
		w.insertChunk(p, start, end, step, withAudit || firstKnown)
		if withAudit {
			w.auditChunk(p, start, end, step)
		}
	}
	// A scheduled job may sort anywhere in its tenant's queue, and a batch's first job of a
	// tenant need not be its oldest: the queue state then looks its heads up.
	anyScheduled := slices.ContainsFunc(p.Jobs, func(j NewJob) bool { return j.scheduled(p.Now) })
	if q, args := queueCountSQL(p, firstKnown && !anyScheduled, step); q != "" {
		// Last, so that the insert ids of the statements before it keep their indexes.
		w.stmts = append(w.stmts, q)
		w.args = append(w.args, args)
	}
	w.stepped = len(p.Jobs) > 1
	if w.stepped && oneTrip {
		// After every INSERT, before the COMMIT that may share the round trip.
		w.stmts = append(w.stmts, idStepGuardSQL)
		w.args = append(w.args, []any{step})
	}
	return w
}

// insertChunk adds the INSERT of p.Jobs[start:end], then, with keepFirst, firstJobSQL, then,
// if any of them pokes, the outbox INSERT of their pokes.
func (w *writes) insertChunk(p NewJobs, start, end int, step int64, keepFirst bool) {
	jobs := p.Jobs[start:end]
	opt := optionalColumnsOf(jobs, p.Now)
	var q strings.Builder
	q.WriteString(`INSERT INTO jobs (tenant, rate_key_sha256, payload, status, caller, idempotency_key,
			request_sha256, queued_at, finished_at, error_code, error_message, retry_of, lanes, interactive`)
	q.WriteString(opt.names())
	q.WriteString(") VALUES ")
	row := "(?,?,?,?,?,?,?,?,?,?,?,?,?,?" + strings.Repeat(",?", opt.count()) + ")"
	c := written{stmt: len(w.stmts)}
	var pokes []outbox.NewPoke
	rowArgs := make([]any, 0, 17*len(jobs))
	for i, j := range jobs {
		if i > 0 {
			q.WriteString(",")
		}
		q.WriteString(row)
		rowArgs = opt.appendValues(appendJobRow(rowArgs, j, p.Now), j, p.Now)
		c.jobs = append(c.jobs, start+i)
		if j.Rejected == "" && j.Poke {
			pokes = append(pokes, outbox.NewPoke{Kind: outbox.Enqueue, Tenant: j.Tenant, Offset: int64(i) * step})
			c.pokes = append(c.pokes, start+i)
		}
	}
	w.stmts = append(w.stmts, q.String())
	w.args = append(w.args, rowArgs)
	if keepFirst {
		// The chunk's first job id is kept for its audit rows and the queue state's UPDATE,
		// which follow the pokes whose INSERT moves LAST_INSERT_ID() on.
		w.stmts = append(w.stmts, firstJobSQL)
		w.args = append(w.args, nil)
	}
	if len(pokes) > 0 {
		pq, pargs := outbox.InsertPokes(p.Prefix, p.Now, pokes)
		w.stmts = append(w.stmts, pq)
		w.args = append(w.args, pargs)
	}
	w.chunks = append(w.chunks, c)
}

// optionalColumns are the columns a jobs INSERT names only when one of its rows sets them: a
// chunk with a scheduled job names not_before, one with a deadline start_by, one with a replace
// key replace_key, and one with a priority other than the default priority. The others keep the
// statement every admission sends.
type optionalColumns struct {
	scheduled, deadlines, keyed, prioritized bool
}

func optionalColumnsOf(jobs []NewJob, now time.Time) optionalColumns {
	return optionalColumns{
		scheduled:   slices.ContainsFunc(jobs, func(j NewJob) bool { return j.scheduled(now) }),
		deadlines:   slices.ContainsFunc(jobs, func(j NewJob) bool { return j.StartBy != nil && j.Rejected == "" }),
		keyed:       slices.ContainsFunc(jobs, func(j NewJob) bool { return j.ReplaceKey != nil && j.Rejected == "" }),
		prioritized: slices.ContainsFunc(jobs, func(j NewJob) bool { return j.priority() != job.DefaultPriority }),
	}
}

// names is the column list's tail, in appendValues' order.
func (o optionalColumns) names() string {
	var s string
	if o.scheduled {
		s += ", not_before"
	}
	if o.deadlines {
		s += ", start_by"
	}
	if o.keyed {
		s += ", replace_key"
	}
	if o.prioritized {
		s += ", priority"
	}
	return s
}

func (o optionalColumns) count() int {
	n := 0
	for _, b := range []bool{o.scheduled, o.deadlines, o.keyed, o.prioritized} {
		if b {
			n++
		}
	}
	return n
}

// appendValues appends j's values of the columns named, NULL where j does not set one (a
// rejected job keeps no deadline or replace key).
func (o optionalColumns) appendValues(args []any, j NewJob, now time.Time) []any {
	if o.scheduled {
		var notBefore any
		if j.scheduled(now) {
			notBefore = j.Due
		}
		args = append(args, notBefore)
	}
	if o.deadlines {
		var startBy any
		if j.StartBy != nil && j.Rejected == "" {
			startBy = *j.StartBy
		}
		args = append(args, startBy)
	}
	if o.keyed {
		var key any
		if j.ReplaceKey != nil && j.Rejected == "" {
			key = *j.ReplaceKey
		}
		args = append(args, key)
	}
	if o.prioritized {
		args = append(args, j.priority())
	}
	return args
}

// derivedAuditMin is the fewest audit rows their job rows imply that admissionAudit derives
// from the job rows (auditAdmittedRangesSQL). Below it the VALUES list is short, and the SELECT's
// read of the job rows and the table's AUTO-INC lock it holds to its end (an INSERT ... SELECT is
// a bulk insert; a VALUES list takes the lock only while it reserves ids) are not worth saving
// it.
const derivedAuditMin = 64

// auditChunk appends the INSERT of the audit rows of p.Jobs[start:end], one jobs INSERT's rows,
// naming each job by its offset from firstJobSQL's id (auditNewJobsSQL), its place times the id
// step. A transaction sent in one round trip holds more than derivedAuditMin jobs only when a
// group commit gathers that many admissions; batches of more go through prepared statements and
// admissionAudit.
func (w *writes) auditChunk(p NewJobs, start, end int, step int64) {
	events := make([]AuditEvent, end-start)
	for i := start; i < end; i++ {
		off := int64(i-start) * step
		events[i-start] = p.Audit[i]
		events[i-start].JobID = &off
	}
	q, args := auditNewJobsSQL(events)
	w.stmts = append(w.stmts, q)
	w.args = append(w.args, args)
}

// queueCountSQL is the UPDATE that adds the queued jobs among p.Jobs to their tenants' queue
// state (migration 0010: queued count, oldest queued job), or "" if none is queued: one
// statement per transaction, where an insert trigger cost every row (migration 0011).
// Admission is the only code that inserts queued jobs. The tenants' rows are locked already
// (ReadAdmission locks them first). Every job of a transaction is queued at p.Now, so the head
// changes only for a tenant that had none, or whose head is newer than p.Now (the database
// clock stepped back); then it is read again from the claim index.
//
// With firstKnown (one jobs INSERT, its first id in @sluice_first_job: firstJobSQL), a tenant
// that had no head gets its first job of the INSERT, by id, and p.Now: a tenant without a head
// has no queued job (the triggers of migration 0012 clear it with the last one), and no other
// transaction can queue one while this one holds the tenant's row, so its oldest queued job is
// the first of this INSERT (its offset times the id step after the first id). Reading it from
// the claim index instead stepped over the delete-marked entries its jobs claimed since purge
// leave there: the pickup path's tenant has one job at a time and took that read on every
// admission.
func queueCountSQL(p NewJobs, firstKnown bool, step int64) (string, []any) {
	counts := map[string]int{}
	first := map[string]int{} // a tenant's first queued job's offset in p.Jobs
	var tenants []string
	for i, j := range p.Jobs {
		if j.Rejected != "" {
			continue // never queued
		}
		if counts[j.Tenant] == 0 {
			tenants = append(tenants, j.Tenant)
			first[j.Tenant] = i
		}
		counts[j.Tenant]++
	}
	if len(tenants) == 0 {
		return "", nil
	}
	var q strings.Builder
	args := make([]any, 0, 5*len(tenants)+4)
	q.WriteString("UPDATE tenants SET queued = queued + CASE tenant")
	for _, t := range tenants {
		q.WriteString(" WHEN ? THEN ?")
		args = append(args, t, counts[t])
	}
	q.WriteString(" END,")
	// MariaDB assigns left to right: head_at's condition still sees the old head_at, so it
	// holds exactly when head_id's did, and its lookup sees the new head_id.
	probe := `(SELECT j.id FROM jobs j FORCE INDEX (claim)
			WHERE j.status = 'queued' AND j.tenant = tenants.tenant ORDER BY j.queued_at, j.id LIMIT 1)`
	if firstKnown {
		q.WriteString(`
		head_id = IF(head_id IS NULL, @sluice_first_job + CASE tenant`)
		for _, t := range tenants {
			q.WriteString(" WHEN ? THEN ?")
			args = append(args, t, int64(first[t])*step)
		}
		if p.NoHeadAfterNow {
			// A head dated at or before Now stays the head: no lookup. Left in, the subqueries
			// would be optimised even where they are not run, a noticeable share of a single
			// admission's database time.
			q.WriteString(` END, head_id),
		head_at = IF(head_at IS NULL, ?, head_at)`)
			args = append(args, p.Now)
		} else {
			q.WriteString(` END, IF(head_at > ?, ` + probe + `, head_id)),
		head_at = IF(head_at IS NULL, ?, IF(head_at > ?, (SELECT j.queued_at FROM jobs j WHERE j.id = tenants.head_id), head_at))`)
			args = append(args, p.Now, p.Now, p.Now)
		}
	} else {
		q.WriteString(`
		head_id = IF(head_id IS NULL OR head_at > ?, ` + probe + `, head_id),
		head_at = IF(head_at IS NULL OR head_at > ?, (SELECT j.queued_at FROM jobs j WHERE j.id = tenants.head_id), head_at)`)
		args = append(args, p.Now, p.Now)
	}
	q.WriteString(`
		WHERE tenant IN (` + Placeholders(len(tenants)) + ")")
	for _, t := range tenants {
		args = append(args, t)
	}
	return q.String(), args
}

// appendJobRow appends the values of j's jobs row to args.
func appendJobRow(args []any, j NewJob, now time.Time) []any {
	var rateKey, payload, idem, fp, finished, code, msg, retryOf any
	if j.RateKeySHA256 != nil {
		rateKey = *j.RateKeySHA256
	}
	if j.RetryOf != nil {
		retryOf = *j.RetryOf
	}
	status := job.Queued
	if j.Rejected != "" {
		status, finished, code, msg = job.Rejected, now, string(job.CodeQueueFull), j.Rejected
	} else {
		if len(j.Payload) > 0 {
			payload = j.Payload
		}
		if j.IdempotencyKey != nil {
			idem, fp = *j.IdempotencyKey, j.RequestSHA256
		}
	}
	queuedAt := now
	if j.scheduled(now) {
		queuedAt = j.Due
	}
	return append(args, j.Tenant, rateKey, payload, string(status), j.Caller, idem, fp,
		queuedAt, finished, code, msg, retryOf, JoinLanes(j.Lanes), j.Interactive)
}
