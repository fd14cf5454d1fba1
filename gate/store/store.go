// Package store is the fenced SQL of the job lifecycle (SPEC §4): reading job rows and every
// statement that moves a job between states after admission. Admission, the executor-facing
// API (start, complete, cancel) and the drainer all go through it, so that fencing lives in one
// place: every write names the version and the state(s) its writer expects, and a writer whose
// condition fails has lost the job and must stop touching it.
//
// It sits under gate because it is the gate's data layer: the drainer consumes it, never the
// reverse. It imports only the shared vocabulary (gate/job) and the outbox.
package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/outbox"
)

// DB is what the read helpers need: *sql.DB, *sql.Tx and *sql.Conn satisfy it.
type DB interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// ErrNotFound is returned for a job id that does not exist.
var ErrNotFound = errors.New("store: job not found")

// Row is a job row with the internal columns the API does not show.
type Row struct {
	job.Job
	Payload          []byte
	DispatchFailures int
	NonceSHA256      []byte
	VoidedNonce      []byte // the nonce hash of the last voided dispatch
	Refusals         int    // times an executor refused it with 503 before it started
	NonceExpiresAt   *time.Time
	LeaseUntil       *time.Time
	DrainerID        *string
	Caller           string
	IdempotencyKey   *string
	RequestSHA256    []byte
	NotBefore        *time.Time
}

// Columns is the select list that ScanRow reads, in order.
const Columns = `id, tenant, rate_key_sha256, status, version, attempt, queued_at, claimed_at,
	dispatched_at, started_at, finished_at, error_code, error_message, result, retry_of, payload,
	dispatch_failures, nonce_sha256, nonce_expires_at, lease_until, drainer_id, caller,
	idempotency_key, request_sha256, not_before, voided_nonce_sha256, refusals`

// ListColumns is Columns with only what a job's JSON shows (job.Job, the result included) read
// from the row, and NULL or zero in place of the rest, for ScanRow: a listing of up to 1,000 jobs
// must not read back up to 256 KiB of payload each, nor the nonce and idempotency columns it
// never returns.
const ListColumns = `id, tenant, rate_key_sha256, status, version, attempt, queued_at, claimed_at,
	dispatched_at, started_at, finished_at, error_code, error_message, result, retry_of, NULL,
	0, NULL, NULL, NULL, NULL, '',
	NULL, NULL, NULL, NULL, 0`

// LockColumns is Columns with NULL in place of the result and the payload, for ScanRow: what a
// transition needs of the rows it locks, without reading back up to 256 KiB of payload a job.
const LockColumns = `id, tenant, rate_key_sha256, status, version, attempt, queued_at, claimed_at,
	dispatched_at, started_at, finished_at, error_code, error_message, NULL, retry_of, NULL,
	dispatch_failures, nonce_sha256, nonce_expires_at, lease_until, drainer_id, caller,
	idempotency_key, request_sha256, not_before, voided_nonce_sha256, refusals`

// Scanner is *sql.Row or *sql.Rows.
type Scanner interface{ Scan(dest ...any) error }

// ScanRow reads one row selected with Columns.
func ScanRow(s Scanner) (Row, error) {
	var r Row
	var status string
	var rateKey, errCode, errMsg, drainerID, idemKey sql.NullString
	var claimed, dispatched, started, finished, nonceExp, lease, notBefore sql.NullTime
	var retryOf sql.NullInt64
	var result []byte
	err := s.Scan(&r.ID, &r.Tenant, &rateKey, &status, &r.Version, &r.Attempt, &r.QueuedAt, &claimed,
		&dispatched, &started, &finished, &errCode, &errMsg, &result, &retryOf, &r.Payload,
		&r.DispatchFailures, &r.NonceSHA256, &nonceExp, &lease, &drainerID, &r.Caller,
		&idemKey, &r.RequestSHA256, &notBefore, &r.VoidedNonce, &r.Refusals)
	if err != nil {
		return r, err
	}
	r.Status = job.Status(status)
	r.RateKeySHA256 = strPtr(rateKey)
	r.ErrorCode = strPtr(errCode)
	r.ErrorMessage = strPtr(errMsg)
	r.DrainerID = strPtr(drainerID)
	r.IdempotencyKey = strPtr(idemKey)
	r.ClaimedAt = timePtr(claimed)
	r.DispatchedAt = timePtr(dispatched)
	r.StartedAt = timePtr(started)
	r.FinishedAt = timePtr(finished)
	r.NonceExpiresAt = timePtr(nonceExp)
	r.LeaseUntil = timePtr(lease)
	r.NotBefore = timePtr(notBefore)
	r.QueuedAt = r.QueuedAt.UTC()
	if len(result) > 0 {
		r.Result = json.RawMessage(result)
	}
	if retryOf.Valid {
		v := retryOf.Int64
		r.RetryOf = &v
	}
	return r, nil
}

// Get reads job id. With forUpdate it locks the row (inside a transaction).
func Get(ctx context.Context, db DB, id int64, forUpdate bool) (Row, error) {
	q := "SELECT " + Columns + " FROM jobs WHERE id = ?"
	if forUpdate {
		q += " FOR UPDATE"
	}
	r, err := ScanRow(db.QueryRowContext(ctx, q, id))
	if errors.Is(err, sql.ErrNoRows) {
		return r, ErrNotFound
	}
	if err != nil {
		return r, fmt.Errorf("read job %d: %w", id, err)
	}
	return r, nil
}

// Position returns the 1-based place of a queued job among its tenant's queued jobs in
// (queued_at, id) order: the claim order within a tenant.
func Position(ctx context.Context, db DB, tenant string, queuedAt time.Time, id int64) (int64, error) {
	var n int64
	err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM jobs WHERE status = 'queued' AND tenant = ?
		AND (queued_at < ? OR (queued_at = ? AND id <= ?))`, tenant, queuedAt, queuedAt, id).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("job position: %w", err)
	}
	return n, nil
}

// WithPosition returns j with its position filled in if it is queued: SPEC §6 shows it on every
// queued job.
func WithPosition(ctx context.Context, db DB, j job.Job) (job.Job, error) {
	if j.Status != job.Queued {
		return j, nil
	}
	p, err := Position(ctx, db, j.Tenant, j.QueuedAt, j.ID)
	if err != nil {
		return j, err
	}
	j.Position = &p
	return j, nil
}

// Placeholders returns n comma-separated placeholders, for an IN list or a VALUES row.
func Placeholders(n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat("?,", n-1) + "?"
}

// HashNonce returns the SHA-256 of a nonce: only the hash is stored.
func HashNonce(nonce string) []byte {
	sum := sha256.Sum256([]byte(nonce))
	return sum[:]
}

// Store writes job transitions. Safe for concurrent use.
type Store struct {
	// Prefix is the NATS subject prefix of the pokes written with transitions. Default "sluice".
	Prefix string
	// Log receives one line per job transition (SPEC §10). Default: discard.
	Log *slog.Logger
	// Metrics are the process's job-lifecycle collectors, shared by every Store of the process.
	// The methods here do not count (their caller's transaction may yet roll back): callers
	// report what they wrote once it has committed. Default none: nothing is counted.
	Metrics *Metrics
	// Actor names the writer in the audit rows of transitions made under a context that names
	// none (WithActor): a drainer's id. Default "".
	Actor string
}

func (s *Store) prefix() string {
	if s.Prefix == "" {
		return outbox.DefaultPrefix
	}
	return s.Prefix
}

// LogTransition writes the one structured line per job transition of SPEC §10.
func (s *Store) LogTransition(ctx context.Context, r Row, to job.Status, version int64, now time.Time, code string) {
	if s.Log == nil {
		return
	}
	attrs := []slog.Attr{
		slog.Int64("job_id", r.ID),
		slog.String("tenant", r.Tenant),
		slog.String("from", string(r.Status)),
		slog.String("to", string(to)),
		slog.Int64("version", version),
	}
	if r.DispatchedAt != nil {
		attrs = append(attrs, slog.Int64("waited_ms", r.DispatchedAt.Sub(r.QueuedAt).Milliseconds()))
		if to.Terminal() {
			attrs = append(attrs, slog.Int64("ran_ms", now.Sub(*r.DispatchedAt).Milliseconds()))
		}
	} else if to == job.Dispatched {
		attrs = append(attrs, slog.Int64("waited_ms", now.Sub(r.QueuedAt).Milliseconds()))
	}
	if code != "" {
		attrs = append(attrs, slog.String("error_code", code))
	}
	s.Log.LogAttrs(ctx, slog.LevelInfo, "job transition", attrs...)
}

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
}

// ErrFenced is returned when a fenced write matched no row: the writer no longer owns the job.
var ErrFenced = errors.New("store: fenced write lost: the job moved on")

// Finish applies o to job r, which the caller read in tx, and writes a release poke (and, for a
// requeue, an enqueue poke) in the same transaction. The write is fenced on r.Version and on
// r.Status. It returns the state the job ended in, or ErrFenced.
func (s *Store) Finish(ctx context.Context, tx DB, now time.Time, r Row, o Outcome) (job.Status, error) {
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
func (s *Store) FinishMany(ctx context.Context, tx DB, now time.Time, items []Finishing) ([]job.Status, error) {
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
	aq, aargs := s.finishAudit(ctx, items)
	if _, err := tx.ExecContext(ctx, p.poke.query+";"+aq, append(p.poke.args, aargs...)...); err != nil {
		return nil, fmt.Errorf("write outbox: %w", err)
	}
	s.logFinish(ctx, now, items, p)
	return p.to, nil
}

// FinishManyConn is FinishMany inside a ConnTx: every UPDATE and the outbox INSERT go in one
// round trip, and the fences are checked on the rows each statement reports. On ErrFenced the
// caller must roll back, as for FinishMany.
func (s *Store) FinishManyConn(ctx context.Context, tx *ConnTx, now time.Time, items []Finishing) ([]job.Status, error) {
	p, err := s.planFinish(now, items)
	if err != nil {
		return nil, err
	}
	stmts := make([]string, 0, len(p.updates)+2)
	var args []any
	if len(p.requeued) > 0 {
		// The caller locked the job rows, in id order (see lockInOrder).
		q, targs := LockTenantsSQL(p.requeued)
		stmts = append(stmts, q)
		args = append(args, targs...)
	}
	for _, u := range p.updates {
		stmts = append(stmts, u.query)
		args = append(args, u.args...)
	}
	aq, aargs := s.finishAudit(ctx, items)
	stmts = append(stmts, p.poke.query, aq)
	args = append(append(args, p.poke.args...), aargs...)
	began := !tx.open
	res, err := tx.Exec(ctx, stmts, args...)
	if err != nil {
		return nil, fmt.Errorf("finish %d job(s): %w", len(items), err)
	}
	affected := res.AllRowsAffected()
	if began && len(affected) > 0 {
		affected = affected[1:] // START TRANSACTION's own result
	}
	if len(p.requeued) > 0 && len(affected) > 0 {
		affected = affected[1:] // the tenant lock's
	}
	if len(affected) != len(p.updates)+2 {
		return nil, fmt.Errorf("finish %d job(s): %d statement results for %d statements", len(items), len(affected), len(stmts))
	}
	for i := range p.updates {
		if err := p.check(i, affected[i]); err != nil {
			return nil, err
		}
	}
	s.logFinish(ctx, now, items, p)
	return p.to, nil
}

// finishPlan is the statements that apply a batch of outcomes.
type finishPlan struct {
	updates  []finishUpdate // one per kind of transition
	poke     finishUpdate   // the outbox INSERT of every release and enqueue poke
	to       []job.Status   // the state each job ends in
	codes    []string       // the error code each job ends with
	requeued []string       // the tenants of the jobs going back to queued
}

// Lock order. The triggers of migration 0010 lock a tenant's row whenever one of its jobs enters
// or leaves queued, in the order the rows are written. Two transactions moving jobs of the same
// tenants in different orders (two batches of requeues, a requeue and a claim) would each hold a
// tenant the other waits for. So every transaction that moves jobs into or out of queued locks
// first the job rows it writes, in id order, then their tenants' rows, in key order, then writes;
// an admission locks its tenants first but locks no existing job row, so it waits for nobody who
// waits for it.

// lockInOrder locks the job rows of items in id order, then the tenants' rows, in key order.
func lockInOrder(ctx context.Context, tx DB, items []Finishing, tenants []string) error {
	ids := make([]any, len(items))
	for i, it := range items {
		ids[i] = it.Row.ID
	}
	rows, err := tx.QueryContext(ctx, "SELECT id FROM jobs WHERE id IN ("+Placeholders(len(ids))+") ORDER BY id FOR UPDATE", ids...)
	if err != nil {
		return fmt.Errorf("lock jobs: %w", err)
	}
	if err := rows.Close(); err != nil {
		return fmt.Errorf("lock jobs: %w", err)
	}
	q, args := LockTenantsSQL(tenants)
	if _, err := tx.ExecContext(ctx, q, args...); err != nil {
		return fmt.Errorf("lock tenants: %w", err)
	}
	return nil
}

// LockTenantsSQL is the statement that locks the rows of tenants, in key order whatever the
// order and repeats of tenants: the second step of the lock order (see lockInOrder). An UPDATE
// that changes nothing rather than SELECT ... FOR UPDATE, so that it can go in a round trip of
// statements without result sets (FinishManyConn).
func LockTenantsSQL(tenants []string) (string, []any) {
	seen := map[string]bool{}
	var args []any
	for _, t := range tenants {
		if !seen[t] {
			seen[t] = true
			args = append(args, t)
		}
	}
	return "UPDATE tenants SET queued = queued WHERE tenant IN (" + Placeholders(len(args)) + ") ORDER BY tenant", args
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

// The bounds of the error columns: error_code is VARCHAR(64) in ASCII, error_message TEXT.
const (
	MaxErrorCode    = 64
	MaxErrorMessage = 65535
)

// ValidErrorCode reports whether code fits the error_code column: at most MaxErrorCode bytes
// of printable ASCII.
func ValidErrorCode(code string) bool {
	if len(code) > MaxErrorCode {
		return false
	}
	for i := 0; i < len(code); i++ {
		if code[i] < 0x20 || code[i] > 0x7e {
			return false
		}
	}
	return true
}

// CleanError makes an executor's error fields storable. The database runs in strict mode, so
// an error_code or error_message that does not fit would fail the whole outcome write, and the
// job would end lost once its lease ran out. A code that does not fit becomes executor_error,
// kept at the head of the message; the message is made valid UTF-8 and cut to the column at a
// character boundary.
func CleanError(code, msg string) (string, string) {
	if !ValidErrorCode(code) {
		msg = "error_code " + strconv.Quote(strings.ToValidUTF8(code, "\ufffd")) + ": " + msg
		code = "executor_error"
	}
	msg = strings.ToValidUTF8(msg, "\ufffd")
	if len(msg) > MaxErrorMessage {
		cut := MaxErrorMessage
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut]
	}
	return code, msg
}

func (s *Store) logFinish(ctx context.Context, now time.Time, items []Finishing, p finishPlan) {
	for i := range items {
		s.LogTransition(ctx, items[i].Row, p.to[i], items[i].Row.Version+1, now, p.codes[i])
	}
}

func (s *Store) planFinish(now time.Time, items []Finishing) (finishPlan, error) {
	type group struct {
		ids     []int64
		items   []int
		started string // the started_at expression of this kind of transition
		void    bool   // whether it voids the dispatch's nonce (see Outcome.Reported)
	}
	groups := map[string]*group{}
	order := []string{}
	to := make([]job.Status, len(items))
	codes := make([]string, len(items))
	msgs := make([]outbox.Message, 0, 2*len(items))
	for i := range items {
		r, o := items[i].Row, &items[i].Outcome
		o.ErrorCode, o.ErrorMessage = CleanError(o.ErrorCode, o.ErrorMessage)
		to[i], codes[i] = o.Status, o.ErrorCode
		if to[i] == job.Queued && o.CountFailure && o.Budget > 0 && r.DispatchFailures+1 >= o.Budget {
			to[i], codes[i] = job.Failed, string(job.CodeDispatchFailed)
			if o.ErrorMessage == "" {
				o.ErrorMessage = "dispatch budget spent"
			}
		}
		var kind, started string
		void := true
		switch {
		case to[i] == job.Queued:
			kind = "requeue"
		case to[i] == job.Lost:
			// Lost keeps started_at as it is: the discriminator between "never ran" and "died
			// mid-run".
			kind, started = "lost", "started_at"
		case to[i] == job.Failed && codes[i] == string(job.CodeDispatchFailed):
			kind, started = "never_started", "NULL"
		case to[i] == job.Succeeded || (to[i] == job.Failed && o.Reported):
			// A job that reports an outcome evidently started.
			kind, started, void = "done", "COALESCE(started_at, dispatched_at)", false
		case to[i] == job.Failed:
			// Failed by sluice after a confirmed start (a 429 or a 503): started_at stays as the
			// confirmation wrote it.
			kind, started = "failed_by_sluice", "started_at"
		default:
			return finishPlan{}, fmt.Errorf("finish job %d: unsupported outcome %q", r.ID, to[i])
		}
		g, ok := groups[kind]
		if !ok {
			g = &group{started: started, void: void}
			groups[kind] = g
			order = append(order, kind)
		}
		g.ids = append(g.ids, r.ID)
		g.items = append(g.items, i)
		msgs = append(msgs, outbox.PokeMessage(s.prefix(), outbox.Release, r.Tenant, r.ID))
		if to[i] == job.Queued {
			msgs = append(msgs, outbox.PokeMessage(s.prefix(), outbox.Enqueue, r.Tenant, r.ID))
		}
	}
	p := finishPlan{to: to, codes: codes}
	for i := range items {
		if to[i] == job.Queued {
			p.requeued = append(p.requeued, items[i].Row.Tenant)
		}
	}
	for _, kind := range order {
		g := groups[kind]
		var set strings.Builder
		var args []any
		col := func(name string, val func(i int) any) {
			set.WriteString(", " + name + " = CASE id")
			for _, i := range g.items {
				set.WriteString(" WHEN ? THEN ?")
				args = append(args, items[i].Row.ID, val(i))
			}
			set.WriteString(" END")
		}
		col("error_code", func(i int) any { return nullStr(codes[i]) })
		col("error_message", func(i int) any { return nullStr(items[i].Outcome.ErrorMessage) })
		var q string
		if kind == "requeue" {
			col("not_before", func(i int) any { return items[i].Outcome.NotBefore })
			// An increment, not the value read: a caller may hand back a row it never read whole.
			count := func(name string, counts func(o Outcome) bool) {
				set.WriteString(", " + name + " = " + name + " + CASE id")
				for _, i := range g.items {
					inc := 0
					if counts(items[i].Outcome) {
						inc = 1
					}
					set.WriteString(" WHEN ? THEN ?")
					args = append(args, items[i].Row.ID, inc)
				}
				set.WriteString(" END")
			}
			count("dispatch_failures", func(o Outcome) bool { return o.CountFailure })
			count("refusals", func(o Outcome) bool { return o.CountRefusal })
			q = `UPDATE jobs SET status = 'queued', version = version + 1, claimed_at = NULL,
				dispatched_at = NULL, started_at = NULL, lease_until = NULL, drainer_id = NULL,
				voided_nonce_sha256 = nonce_sha256, nonce_sha256 = NULL, nonce_expires_at = NULL` + set.String()
		} else {
			col("status", func(i int) any { return string(to[i]) })
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
		// The fence is a row-constructor IN over (id, version, status). The same fence as OR-ed
		// (id = ? AND version = ? AND status = ?) groups cost 7 ms to plan for 63 rows, six
		// times the update itself. The leading id IN (...) is needed too: MariaDB 10.11 plans a
		// row-constructor IN of a single tuple as a full index scan.
		q += " WHERE id IN (" + Placeholders(len(g.ids)) + ")"
		for _, id := range g.ids {
			args = append(args, id)
		}
		q += " AND (id, version, status) IN (" + strings.TrimSuffix(strings.Repeat("(?,?,?),", len(g.items)), ",") + ")"
		for _, i := range g.items {
			r := items[i].Row
			args = append(args, r.ID, r.Version, string(r.Status))
		}
		p.updates = append(p.updates, finishUpdate{kind: kind, query: q, args: args, rows: len(g.ids)})
	}
	p.poke.query, p.poke.args = outbox.Insert(now, msgs...)
	return p, nil
}

// ErrNotCancelable is returned by Cancel for a job that is in flight or terminal.
var ErrNotCancelable = errors.New("store: job is not cancelable")

// Cancel moves a queued job to canceled in tx. A job already canceled is returned as it is, with
// moved false: moved reports whether this call wrote the transition, for the caller to count once
// tx commits.
func (s *Store) Cancel(ctx context.Context, tx DB, now time.Time, id int64) (r Row, moved bool, err error) {
	r, err = Get(ctx, tx, id, true)
	if err != nil {
		return r, false, err
	}
	switch r.Status {
	case job.Canceled:
		return r, false, nil
	case job.Queued:
	default:
		return r, false, ErrNotCancelable
	}
	// The row is locked (Get above), so the UPDATE moves it and its audit row may go first.
	aq, aargs := AuditInsertSQL([]AuditEvent{transitionEvent(s.actor(ctx), r, job.Canceled, r.Version+1, r.Attempt, "")})
	if _, err := tx.ExecContext(ctx, aq+`;UPDATE jobs SET status = 'canceled', version = version + 1,
		finished_at = ? WHERE id = ? AND version = ? AND status = 'queued'`, append(aargs, now, id, r.Version)...); err != nil {
		return r, false, fmt.Errorf("cancel job %d: %w", id, err)
	}
	s.LogTransition(ctx, r, job.Canceled, r.Version+1, now, "")
	r.Status = job.Canceled
	r.Version++
	r.FinishedAt = &now
	return r, true, nil
}

// ExpiredCode is the error_code of a job that expired in the queue (max_queue_age_seconds).
const ExpiredCode = "max_queue_age"

// Expire moves to expired, in tx, up to limit queued jobs queued before cutoff (SPEC §9
// max_queue_age_seconds) and returns them as they were. Rows another transaction holds (a claim
// taking them, a cancel) are skipped: they are leaving the queue anyway, or are seen next time.
// A job that expires was never dispatched and held no slot, so no release poke is written.
func (s *Store) Expire(ctx context.Context, tx DB, now, cutoff time.Time, limit int) ([]Row, error) {
	// The claim index leads with status, so this reads the queued range only; queued_at is its
	// third column, so the age test is made on index entries without reading rows.
	rows, err := tx.QueryContext(ctx, "SELECT "+LockColumns+` FROM jobs FORCE INDEX (claim)
		WHERE status = 'queued' AND queued_at < ? LIMIT ? FOR UPDATE SKIP LOCKED`, cutoff, limit)
	if err != nil {
		return nil, fmt.Errorf("find expired queued jobs: %w", err)
	}
	var old []Row
	res := ResultsOf(rows)
	if err := errors.Join(res.EachRow(func(r Row) { old = append(old, r) }), res.Close()); err != nil {
		return nil, fmt.Errorf("find expired queued jobs: %w", err)
	}
	if len(old) == 0 {
		return nil, nil
	}
	tenants := make([]string, len(old))
	for i, r := range old {
		tenants[i] = r.Tenant
	}
	// The job rows are locked; their tenants' rows next, in key order (see lockInOrder).
	lq, largs := LockTenantsSQL(tenants)
	if _, err := tx.ExecContext(ctx, lq, largs...); err != nil {
		return nil, fmt.Errorf("expire queued jobs: lock tenants: %w", err)
	}
	events := make([]AuditEvent, len(old))
	for i, r := range old {
		events[i] = transitionEvent(s.actor(ctx), r, job.Expired, r.Version+1, r.Attempt, ExpiredCode)
	}
	// Before the UPDATE, in its round trip, so that RowsAffected is the UPDATE's.
	aq, args := AuditInsertSQL(events)
	args = append(args, now, ExpiredCode)
	for _, r := range old {
		args = append(args, r.ID)
	}
	// The rows are locked, so their versions cannot have moved since they were read.
	upd, err := tx.ExecContext(ctx, aq+`;UPDATE jobs SET status = 'expired', version = version + 1, finished_at = ?,
		error_code = ?, error_message = 'queued longer than max_queue_age_seconds'
		WHERE status = 'queued' AND id IN (`+Placeholders(len(old))+`)`, args...)
	if err != nil {
		return nil, fmt.Errorf("expire queued jobs: %w", err)
	}
	if n, err := upd.RowsAffected(); err == nil && n != int64(len(old)) {
		return nil, fmt.Errorf("expire queued jobs: %d of %d locked rows changed: %w", n, len(old), ErrFenced)
	}
	for _, r := range old {
		s.LogTransition(ctx, r, job.Expired, r.Version+1, now, ExpiredCode)
	}
	return old, nil
}

func strPtr(s sql.NullString) *string {
	if !s.Valid {
		return nil
	}
	v := s.String
	return &v
}

func timePtr(t sql.NullTime) *time.Time {
	if !t.Valid {
		return nil
	}
	v := t.Time.UTC()
	return &v
}

func nullStr(s string) any {
	if s == "" {
		return nil
	}
	return s
}
