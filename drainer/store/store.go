// Package store is the fenced SQL of the job lifecycle (SPEC §4): reading job rows and every
// statement that moves a job between states after admission. The drainer, the executor-facing
// API (start, complete, cancel) and the producers' publisher all go through it, so that fencing
// lives in one place: every write names the version and the state(s) its writer expects, and a
// writer whose condition fails has lost the job and must stop touching it.
package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

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
	idempotency_key, request_sha256, not_before, voided_nonce_sha256`

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
		&idemKey, &r.RequestSHA256, &notBefore, &r.VoidedNonce)
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
	// NotBefore, for a requeue, delays the job's next claim (an executor's 503).
	NotBefore *time.Time
	// CountFailure, for a requeue, spends one unit of the dispatch budget.
	CountFailure bool
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
	to := o.Status
	code := o.ErrorCode
	if to == job.Queued && o.CountFailure && o.Budget > 0 && r.DispatchFailures+1 >= o.Budget {
		to = job.Failed
		code = string(job.CodeDispatchFailed)
		if o.ErrorMessage == "" {
			o.ErrorMessage = "dispatch budget spent"
		}
	}
	var res sql.Result
	var err error
	switch to {
	case job.Queued:
		fail := 0
		if o.CountFailure {
			fail = 1
		}
		res, err = tx.ExecContext(ctx, `UPDATE jobs SET status = 'queued', version = version + 1,
			claimed_at = NULL, dispatched_at = NULL, started_at = NULL, lease_until = NULL,
			drainer_id = NULL, voided_nonce_sha256 = nonce_sha256, nonce_sha256 = NULL,
			nonce_expires_at = NULL, not_before = ?,
			dispatch_failures = dispatch_failures + ?, error_code = ?, error_message = ?
			WHERE id = ? AND version = ? AND status = ?`,
			o.NotBefore, fail, nullStr(code), nullStr(o.ErrorMessage), r.ID, r.Version, string(r.Status))
	case job.Succeeded, job.Failed, job.Lost:
		var result any
		if len(o.Result) > 0 {
			result = []byte(o.Result)
		}
		// A job that reports an outcome evidently started; Lost keeps started_at as it is, the
		// discriminator between "never ran" and "died mid-run".
		startedExpr := "COALESCE(started_at, dispatched_at)"
		if to == job.Lost {
			startedExpr = "started_at"
		}
		if to == job.Failed && code == string(job.CodeDispatchFailed) {
			startedExpr = "NULL"
		}
		res, err = tx.ExecContext(ctx, `UPDATE jobs SET status = ?, version = version + 1,
			started_at = `+startedExpr+`, finished_at = ?, lease_until = NULL,
			error_code = ?, error_message = ?, result = ?
			WHERE id = ? AND version = ? AND status = ?`,
			string(to), now, nullStr(code), nullStr(o.ErrorMessage), result, r.ID, r.Version, string(r.Status))
	default:
		return "", fmt.Errorf("finish job %d: unsupported outcome %q", r.ID, to)
	}
	if err != nil {
		return "", fmt.Errorf("finish job %d as %s: %w", r.ID, to, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return "", fmt.Errorf("finish job %d: %w", r.ID, err)
	} else if n == 0 {
		return "", ErrFenced
	}
	msgs := []outbox.Message{outbox.PokeMessage(s.prefix(), outbox.Release, r.Tenant, r.ID)}
	if to == job.Queued {
		msgs = append(msgs, outbox.PokeMessage(s.prefix(), outbox.Enqueue, r.Tenant, r.ID))
	}
	if _, err := outbox.Write(ctx, tx, now, msgs...); err != nil {
		return "", err
	}
	s.LogTransition(ctx, r, to, r.Version+1, now, code)
	return to, nil
}

// ErrNotCancelable is returned by Cancel for a job that is in flight or terminal.
var ErrNotCancelable = errors.New("store: job is not cancelable")

// Cancel moves a queued job to canceled in tx. A job already canceled is returned as it is.
func (s *Store) Cancel(ctx context.Context, tx DB, now time.Time, id int64) (Row, error) {
	r, err := Get(ctx, tx, id, true)
	if err != nil {
		return r, err
	}
	switch r.Status {
	case job.Canceled:
		return r, nil
	case job.Queued:
	default:
		return r, ErrNotCancelable
	}
	if _, err := tx.ExecContext(ctx, `UPDATE jobs SET status = 'canceled', version = version + 1,
		finished_at = ? WHERE id = ? AND version = ? AND status = 'queued'`, now, id, r.Version); err != nil {
		return r, fmt.Errorf("cancel job %d: %w", id, err)
	}
	s.LogTransition(ctx, r, job.Canceled, r.Version+1, now, "")
	r.Status = job.Canceled
	r.Version++
	r.FinishedAt = &now
	return r, nil
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
