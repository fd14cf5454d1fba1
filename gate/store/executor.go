package store

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/sqldb"
)

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
	r, err := Get(ctx, tx, id, true)
	if err != nil {
		return r, err
	}
	hash := HashNonce(nonce)
	same := len(r.NonceSHA256) > 0 && bytes.Equal(r.NonceSHA256, hash)
	var startHash []byte // nil: an unnamed attempt, which no later confirmation can repeat
	if startID != "" {
		startHash = HashNonce(startID)
	}
	switch {
	case len(r.VoidedNonce) > 0 && bytes.Equal(r.VoidedNonce, hash):
		return r, &job.Error{Code: job.CodeDispatchVoid, Message: "the dispatch was voided; do not run the job",
			Detail: map[string]any{"status": r.Status}}
	case same && r.Status == job.Running:
		if startHash != nil && bytes.Equal(r.StartSHA256, startHash) {
			return r, nil
		}
		return r, &job.Error{Code: job.CodeNonceUsed, Message: "this dispatch has already started; do not run the job",
			Detail: map[string]any{"status": r.Status}}
	case same && r.Status == job.Dispatched:
		if r.NonceExpiresAt == nil || now.After(*r.NonceExpiresAt) {
			return r, &job.Error{Code: job.CodeNonceExpired, Message: "the nonce's time to start has passed",
				Detail: map[string]any{"status": r.Status}}
		}
	case same && r.Status.Terminal():
		return r, &job.Error{Code: job.CodeNonceUsed, Message: "this dispatch has already finished",
			Detail: map[string]any{"status": r.Status}}
	case r.Status == job.Dispatched || r.Status == job.Running || r.Status == job.Claimed:
		return r, &job.Error{Code: job.CodeNonceInvalid, Message: "the nonce does not belong to the job's current dispatch",
			Detail: map[string]any{"status": r.Status}}
	default:
		return r, &job.Error{Code: job.CodeDispatchVoid, Message: "the dispatch was voided; do not run the job",
			Detail: map[string]any{"status": r.Status}}
	}
	res, err := tx.ExecContext(ctx, `UPDATE jobs SET status = 'running', started_at = ?, start_sha256 = ?
		WHERE id = ? AND version = ? AND status = 'dispatched'`, now, startHash, id, r.Version)
	if err != nil {
		return r, fmt.Errorf("confirm start of job %d: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return r, &job.Error{Code: job.CodeDispatchVoid, Message: "the dispatch was voided; do not run the job"}
	}
	// A statement of its own, in the start's transaction: tx may be on a pool that refuses
	// stacked statements (Open).
	if err := s.insertAudit(ctx, tx, transitionEvent(s.actor(ctx), r, job.Running, r.Version, r.Attempt, "")); err != nil {
		return r, fmt.Errorf("confirm start of job %d: %w", id, err)
	}
	s.LogTransition(ctx, r, job.Running, r.Version, now, "")
	r.Status = job.Running
	r.StartedAt = &now
	r.StartSHA256 = startHash
	return r, nil
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
