package store

import (
	"bytes"
	"context"
	"encoding/json"
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
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("lock %d job(s) to start: %w", len(ids), err)
	}
	byID := make(map[int64]*Row, len(ids))
	for rows.Next() {
		r, err := ScanRow(rows)
		if err != nil {
			rows.Close()
			return fmt.Errorf("lock %d job(s) to start: %w", len(ids), err)
		}
		byID[r.ID] = &r
	}
	if err := rows.Close(); err != nil {
		return fmt.Errorf("lock %d job(s) to start: %w", len(ids), err)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("lock %d job(s) to start: %w", len(ids), err)
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
	if len(started) == 0 {
		return nil
	}
	var set strings.Builder
	args = args[:0]
	set.WriteString("UPDATE jobs SET status = 'running', started_at = ?, start_sha256 = CASE id")
	args = append(args, now)
	for _, st := range started {
		set.WriteString(" WHEN ? THEN ?")
		args = append(args, st.ID, st.Row.StartSHA256)
	}
	// No status in the WHERE: the rows are locked since the read that decided them, and with it
	// the optimizer walks the lease index's every dispatched job instead of the primary key.
	set.WriteString(" END WHERE id IN (" + Placeholders(len(started)) + ")")
	for _, st := range started {
		args = append(args, st.ID)
	}
	res, err := tx.ExecContext(ctx, set.String(), args...)
	if err != nil {
		return fmt.Errorf("confirm start of %d job(s): %w", len(started), err)
	}
	if n, err := res.RowsAffected(); err != nil || n != int64(len(started)) {
		// The rows are locked since the read, so this cannot happen unless something is badly
		// wrong: write nothing.
		return fmt.Errorf("confirm start of %d job(s): %d rows changed (%v)", len(started), n, err)
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
	// A statement of its own, in the start's transaction: tx may be on a pool that refuses
	// stacked statements (Open).
	if err := s.insertAudit(ctx, tx, events...); err != nil {
		return fmt.Errorf("confirm start of %d job(s): %w", len(started), err)
	}
	for _, st := range started {
		from := st.Row
		from.Status = job.Dispatched
		s.LogTransition(ctx, from, job.Running, from.Version, now, "")
	}
	return nil
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
