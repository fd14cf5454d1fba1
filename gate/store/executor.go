package store

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/sqldb"
)

// Start is one executor's confirmation of a dispatch's start (POST /v1/jobs/{id}/start), for
// ConfirmStarts, which records its outcome in Row and Err.
type Start struct {
	ID      int64
	Nonce   string
	StartID string
	Actor   string // who confirms, for the audit trail (ActorOf the request); "": the Store's

	Row Row   // the job as the decision left it
	Err error // the confirmation's refusal (*job.Error) or ErrNotFound; nil when it started
	// Locked reports that another transaction held the job's row, so ConfirmStarts, told not to
	// wait, decided nothing: the caller confirms it again in a transaction that waits.
	Locked bool
}

// ConfirmStart moves job id from dispatched to running for the dispatch that minted nonce, if
// that nonce is still within its TTL at now, and records startID, the executor's random name for
// this start attempt (SPEC §4). A dispatch starts at most once: a later confirmation with the
// same nonce succeeds again only when it carries the same non-empty startID (the attempt repeating
// itself after its answer was lost); any other is nonce_used, so a dispatch replayed to another
// or a restarted executor is never run. Errors are *job.Error with codes nonce_invalid,
// nonce_expired, nonce_used (the dispatch already started, or its outcome is recorded) or
// dispatch_void (sluice ended the dispatch: requeued, lost or failed it), or ErrNotFound. The
// version does not change, so the drainer's outcome write still matches.
func (s *Store) ConfirmStart(ctx context.Context, tx sqldb.DB, now time.Time, id int64, nonce, startID string) (Row, error) {
	st := &Start{ID: id, Nonce: nonce, StartID: startID, Actor: ActorOf(ctx)}
	if err := s.ConfirmStarts(ctx, tx, now, []*Start{st}, false); err != nil {
		return st.Row, err
	}
	return st.Row, st.Err
}

// ConfirmStarts decides starts in tx, in order, as ConfirmStart decides one: one read that locks
// their rows, one UPDATE for those that start and one audit statement, so that concurrent
// confirmations share a transaction (group commit). A later start of the same job sees the
// earlier one's effect. With skipLocked, a row another transaction holds is not waited for: its
// starts come back Locked and undecided, and the transaction never waits for a lock, so a group
// cannot stall behind, or deadlock with, the drainer's writes. The error is the transaction's
// (nothing may be committed); each start's own refusal is in its Err.
func (s *Store) ConfirmStarts(ctx context.Context, tx sqldb.DB, now time.Time, starts []*Start, skipLocked bool) error {
	q, args := lockStartsSQL(starts, skipLocked)
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("lock %d job(s) to start: %w", len(args), err)
	}
	started, err := s.decideStarts(rows, now, starts, skipLocked)
	if err != nil || len(started) == 0 {
		return err
	}
	stmts, wargs := s.startWritesSQL(now, started)
	for i, q := range stmts {
		res, err := tx.ExecContext(ctx, q, wargs[i]...)
		if err != nil {
			return fmt.Errorf("confirm start of %d job(s): %w", len(started), err)
		}
		if i == 0 {
			n, err := res.RowsAffected()
			if err := startsWritten(n, err, started); err != nil {
				return err
			}
		}
	}
	s.logStarts(ctx, now, started)
	return nil
}

// ErrInCommitTrip marks an error of the round trip that carried a COMMIT: if the connection
// broke there, the outcome is unknown.
var ErrInCommitTrip = errors.New("in the round trip that commits")

// ConfirmStartsCommit is ConfirmStarts in a transaction of its own on db, an OpenMulti pool, in
// two round trips: BEGIN with the locking read, then the writes with COMMIT (where database/sql's
// Tx takes five). A group that starts nothing commits nothing. An error means nothing committed,
// unless the connection broke with the COMMIT sent, when the outcome is unknown.
func (s *Store) ConfirmStartsCommit(ctx context.Context, db *sql.DB, now time.Time, starts []*Start, skipLocked bool) error {
	tx, err := BeginConnTx(ctx, db)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Close()
	q, args := lockStartsSQL(starts, skipLocked)
	res, err := tx.Query(ctx, []string{q}, args...)
	if err != nil {
		return fmt.Errorf("lock %d job(s) to start: %w", len(args), err)
	}
	rows, err := res.Next()
	if err != nil {
		res.Close()
		return fmt.Errorf("lock %d job(s) to start: %w", len(args), err)
	}
	started, err := s.decideStarts(rows, now, starts, skipLocked)
	if cerr := res.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("lock %d job(s) to start: %w", len(args), cerr)
	}
	if err != nil || len(started) == 0 {
		return err
	}
	stmts, wargs := s.startWritesSQL(now, started)
	var all []any
	for _, a := range wargs {
		all = append(all, a...)
	}
	out, err := tx.ExecCommit(ctx, stmts, all...)
	if err != nil {
		return fmt.Errorf("confirm start of %d job(s): %w: %w", len(started), ErrInCommitTrip, err)
	}
	if err := startsWritten(out.AllRowsAffected()[0], nil, started); err != nil {
		// Committed all the same: the rows were locked, so this cannot happen unless something
		// is badly wrong, and the caller is told.
		return err
	}
	s.logStarts(ctx, now, started)
	return nil
}

// lockStartsSQL is the read that locks the jobs of starts, in id order.
func lockStartsSQL(starts []*Start, skipLocked bool) (string, []any) {
	ids := make([]int64, 0, len(starts))
	for _, st := range starts {
		ids = append(ids, st.ID)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	q := "SELECT " + LockColumns + " FROM jobs WHERE id IN (" + Placeholders(len(ids)) + ") ORDER BY id FOR UPDATE"
	if skipLocked {
		q += " SKIP LOCKED"
	}
	return q, args
}

// decideStarts reads the rows of lockStartsSQL and decides starts in order, recording each
// one's outcome in it, and returns those that start the job.
func (s *Store) decideStarts(rows *sql.Rows, now time.Time, starts []*Start, skipLocked bool) ([]*Start, error) {
	byID := make(map[int64]*Row, len(starts))
	for rows.Next() {
		r, err := ScanRow(rows)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("lock job(s) to start: %w", err)
		}
		byID[r.ID] = &r
	}
	if err := rows.Close(); err != nil {
		return nil, fmt.Errorf("lock job(s) to start: %w", err)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("lock job(s) to start: %w", err)
	}
	var started []*Start
	for _, st := range starts {
		r, ok := byID[st.ID]
		if !ok {
			if skipLocked {
				// Another's lock, or gone: only a transaction that waits can tell.
				st.Locked = true
			} else {
				st.Err = ErrNotFound
			}
			continue
		}
		st.Row, st.Err = *r, decideStart(*r, now, HashNonce(st.Nonce), st.StartID)
		if st.Err != nil || r.Status == job.Running {
			continue // refused, or the same attempt repeated
		}
		started = append(started, st)
		r.Status, r.StartedAt = job.Running, &now
		if st.StartID != "" {
			r.StartSHA256 = HashNonce(st.StartID)
		}
		st.Row = *r
	}
	return started, nil
}

// startWritesSQL is the statements that write started (at least one): the UPDATE, first, and
// the audit rows unless the audit is off, each with its arguments.
func (s *Store) startWritesSQL(now time.Time, started []*Start) ([]string, [][]any) {
	var set strings.Builder
	args := []any{now}
	set.WriteString("UPDATE jobs SET status = 'running', started_at = ?, start_sha256 = CASE id")
	for _, st := range started {
		set.WriteString(" WHEN ? THEN ?")
		args = append(args, st.ID, st.Row.StartSHA256)
	}
	// No status in the WHERE: the rows are locked since the read that decided them, and with it
	// the optimizer walks a status index's every dispatched job instead of the primary key.
	set.WriteString(" END WHERE id IN (" + Placeholders(len(started)) + ")")
	for _, st := range started {
		args = append(args, st.ID)
	}
	stmts, all := []string{set.String()}, [][]any{args}
	if s.AuditOff {
		return stmts, all
	}
	events := make([]AuditEvent, len(started))
	for i, st := range started {
		from := st.Row
		from.Status = job.Dispatched
		actor := st.Actor
		if actor == "" {
			actor = s.Actor
		}
		events[i] = transitionEvent(actor, from, job.Running, from.Version, from.Attempt, "")
	}
	q, aargs := auditInsertSQL(events)
	return append(stmts, q), append(all, aargs)
}

// startsWritten checks the UPDATE of startWritesSQL changed every row it was to.
func startsWritten(n int64, err error, started []*Start) error {
	if err != nil || n != int64(len(started)) {
		return fmt.Errorf("confirm start of %d job(s): %d rows changed (%v)", len(started), n, err)
	}
	return nil
}

// logStarts writes the transition line of each start.
func (s *Store) logStarts(ctx context.Context, now time.Time, started []*Start) {
	for _, st := range started {
		from := st.Row
		from.Status = job.Dispatched
		s.LogTransition(ctx, from, job.Running, from.Version, now, "")
	}
}

// decideStart is ConfirmStart's decision for job r and a confirmation whose nonce hashes to hash:
// nil to start it, or to answer a repeat of the attempt that started it, else the refusal.
func decideStart(r Row, now time.Time, hash []byte, startID string) error {
	same := len(r.NonceSHA256) > 0 && bytes.Equal(r.NonceSHA256, hash)
	switch {
	case len(r.VoidedNonce) > 0 && bytes.Equal(r.VoidedNonce, hash):
		return &job.Error{Code: job.CodeDispatchVoid, Message: "the dispatch was voided; do not run the job",
			Detail: map[string]any{"status": r.Status}}
	case same && r.Status == job.Running:
		// nil startHash: an unnamed attempt, which no later confirmation can repeat
		if startID != "" && bytes.Equal(r.StartSHA256, HashNonce(startID)) {
			return nil
		}
		return &job.Error{Code: job.CodeNonceUsed, Message: "this dispatch has already started; do not run the job",
			Detail: map[string]any{"status": r.Status}}
	case same && r.Status == job.Dispatched:
		if r.NonceExpiresAt == nil || now.After(*r.NonceExpiresAt) {
			return &job.Error{Code: job.CodeNonceExpired, Message: "the nonce's time to start has passed",
				Detail: map[string]any{"status": r.Status}}
		}
		return nil
	case same && r.Status.Terminal():
		return &job.Error{Code: job.CodeNonceUsed, Message: "this dispatch has already finished",
			Detail: map[string]any{"status": r.Status}}
	case r.Status == job.Dispatched || r.Status == job.Running || r.Status == job.Claimed:
		return &job.Error{Code: job.CodeNonceInvalid, Message: "the nonce does not belong to the job's current dispatch",
			Detail: map[string]any{"status": r.Status}}
	default:
		return &job.Error{Code: job.CodeDispatchVoid, Message: "the dispatch was voided; do not run the job",
			Detail: map[string]any{"status": r.Status}}
	}
}

// NotStartedCode is the error_code of a job queued again by a not_started completion.
const NotStartedCode = "not_started"

// endedByNotStarted reports whether the dispatch whose nonce r holds as voided was ended by a
// not_started completion. Every requeue voids the nonce and writes its own error_code, and after
// it only a terminal outcome or an expiry writes error_code again; of those, only succeeded and
// failed carry a code an executor chose (the terminal outcomes sluice decides void the nonce
// too, with a code of sluice's). So NotStartedCode on a job in any other state was written by
// the requeue that voided the nonce.
func endedByNotStarted(r Row) bool {
	return r.ErrorCode != nil && *r.ErrorCode == NotStartedCode && r.Status != job.Succeeded && r.Status != job.Failed
}

// Completion is an executor's report through POST /v1/jobs/{id}/complete.
type Completion struct {
	Nonce        string
	Status       string // succeeded, failed or not_started
	ErrorCode    string
	ErrorMessage string
	Result       json.RawMessage
}

// Complete records an executor's completion of job id in tx (SPEC §6): the terminal state plus a
// release poke, or for not_started on a job whose start was never confirmed, queued again (and
// returned with its position). The same outcome the executor reported (here or in its answer to
// the dispatch) again returns the job as it is now, also a not_started repeated after its
// requeue voided the nonce; a different one is outcome_conflict. A dispatch that sluice ended
// (requeued, recovered, lost, failed after a 429 or a 503 or for a spent dispatch budget) voided
// its nonce, and a late outcome on it is dispatch_void with the job's status. moved reports
// whether this call wrote a transition (false for a repeated outcome), for the caller to count
// once tx commits; the job returned is then as it ended, dispatched_at and finished_at included.
// With an error other than ErrNotFound, r is the job as read, under its lock, for the decision,
// so a caller may still ask r.SentNonce(c.Nonce) whether the report was the executor's own.
func (s *Store) Complete(ctx context.Context, tx sqldb.DB, now time.Time, id int64, c Completion) (r Row, moved bool, err error) {
	r, err = Get(ctx, tx, id, true)
	if err != nil {
		return r, false, err
	}
	hash := HashNonce(c.Nonce)
	same := len(r.NonceSHA256) > 0 && bytes.Equal(r.NonceSHA256, hash)
	voided := len(r.VoidedNonce) > 0 && bytes.Equal(r.VoidedNonce, hash)
	if !same {
		if voided && endedByNotStarted(r) {
			// The executor's own not_started ended this dispatch; a repeat (a lost response
			// retried) is the same outcome again, anything else a different one.
			if c.Status == "not_started" {
				r.Job, err = WithPosition(ctx, tx, r.Job)
				return r, false, err
			}
			return r, false, &job.Error{Code: job.CodeOutcomeConflict, Message: "a different outcome is already recorded: not_started",
				Detail: map[string]any{"status": r.Status}}
		}
		if !voided && (r.Status == job.Dispatched || r.Status == job.Running) {
			return r, false, &job.Error{Code: job.CodeNonceInvalid, Message: "the nonce does not belong to the job's current dispatch",
				Detail: map[string]any{"status": r.Status}}
		}
		return r, false, &job.Error{Code: job.CodeDispatchVoid, Message: "the dispatch was voided; the outcome was not recorded",
			Detail: map[string]any{"status": r.Status}}
	}
	if r.Status.Terminal() {
		if string(r.Status) == c.Status {
			return r, false, nil
		}
		if r.Status != job.Succeeded && r.Status != job.Failed {
			// Lost under an earlier version of sluice, which kept a lost job's nonce: the late
			// report is void all the same.
			return r, false, &job.Error{Code: job.CodeDispatchVoid, Message: "the dispatch was voided; the outcome was not recorded",
				Detail: map[string]any{"status": r.Status}}
		}
		return r, false, &job.Error{Code: job.CodeOutcomeConflict, Message: "a different outcome is already recorded",
			Detail: map[string]any{"status": r.Status}}
	}
	var o Outcome
	switch c.Status {
	case string(job.Succeeded), string(job.Failed):
		o = Outcome{Status: job.Status(c.Status), ErrorCode: c.ErrorCode, ErrorMessage: c.ErrorMessage, Result: c.Result,
			Reported: true}
	case "not_started":
		if r.Status != job.Dispatched {
			return r, false, &job.Error{Code: job.CodeOutcomeConflict, Message: "the job's start was confirmed; it cannot be not_started",
				Detail: map[string]any{"status": r.Status}}
		}
		msg := c.ErrorMessage
		if msg == "" {
			msg = "the executor reported that it did not start the job"
		}
		// NotStartedCode is what tells a repeat of this outcome from a late report on a
		// dispatch that recovery voided (endedByNotStarted).
		o = Outcome{Status: job.Queued, ErrorCode: NotStartedCode, ErrorMessage: msg}
	default:
		return r, false, job.Invalid("status", "status must be succeeded, failed or not_started")
	}
	if _, err := s.Finish(ctx, tx, now, r, o); err != nil {
		return r, false, err
	}
	if r, err = Get(ctx, tx, id, false); err != nil {
		return r, false, err
	}
	r.Job, err = WithPosition(ctx, tx, r.Job)
	return r, err == nil, err
}

// SentNonce reports whether nonce is the one sluice sent with r's current dispatch, or with the
// last dispatch it voided (a not_started requeue, a recovery): only the executor that dispatch
// reached can hold it, so a report carrying it is that executor's own even when its outcome is
// refused. An older dispatch's nonce, or a made-up one, is not.
func (r Row) SentNonce(nonce string) bool {
	hash := HashNonce(nonce)
	return (len(r.NonceSHA256) > 0 && bytes.Equal(r.NonceSHA256, hash)) ||
		(len(r.VoidedNonce) > 0 && bytes.Equal(r.VoidedNonce, hash))
}
