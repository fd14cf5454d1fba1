package store

import (
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

// ErrNotFound is returned for a job id that does not exist.
var ErrNotFound = errors.New("store: job not found")

// Row is a job row with the internal columns the API does not show.
type Row struct {
	job.Job
	Payload          []byte
	DispatchFailures int
	NonceSHA256      []byte
	VoidedNonce      []byte // the nonce hash of the last voided dispatch
	StartSHA256      []byte // the start_id hash of the attempt that confirmed the running dispatch
	Refusals         int    // times an executor refused it with 503 before it started
	NonceExpiresAt   *time.Time
	LeaseUntil       *time.Time
	DrainerID        *string
	Caller           string
	IdempotencyKey   *string
	RequestSHA256    []byte
}

// Columns is the select list that ScanRow reads, in order.
const Columns = `id, tenant, rate_key_sha256, status, version, attempt, queued_at, claimed_at,
	dispatched_at, started_at, finished_at, error_code, error_message, result, retry_of, payload,
	dispatch_failures, nonce_sha256, nonce_expires_at, lease_until, drainer_id, caller,
	idempotency_key, request_sha256, not_before, voided_nonce_sha256, refusals, lanes, interactive,
	start_sha256, start_by, replace_key, replaced_by, priority`

// ListColumns is Columns with only what a job's JSON shows (job.Job, the result included) read
// from the row, and NULL or zero in place of the rest, for ScanRow: a listing of up to 1,000 jobs
// must not read back up to 256 KiB of payload each, nor the nonce and idempotency columns it
// never returns.
const ListColumns = `id, tenant, rate_key_sha256, status, version, attempt, queued_at, claimed_at,
	dispatched_at, started_at, finished_at, error_code, error_message, result, retry_of, NULL,
	0, NULL, NULL, NULL, NULL, '',
	NULL, NULL, not_before, NULL, 0, lanes, interactive,
	NULL, start_by, replace_key, replaced_by, priority`

// LockColumns is Columns with NULL in place of the result and the payload, for ScanRow: what a
// transition needs of the rows it locks, without reading back up to 256 KiB of payload a job.
const LockColumns = `id, tenant, rate_key_sha256, status, version, attempt, queued_at, claimed_at,
	dispatched_at, started_at, finished_at, error_code, error_message, NULL, retry_of, NULL,
	dispatch_failures, nonce_sha256, nonce_expires_at, lease_until, drainer_id, caller,
	idempotency_key, request_sha256, not_before, voided_nonce_sha256, refusals, lanes, interactive,
	start_sha256, start_by, replace_key, replaced_by, priority`

// Scanner is *sql.Row or *sql.Rows.
type Scanner interface{ Scan(dest ...any) error }

// ScanRow reads one row selected with Columns.
func ScanRow(s Scanner) (Row, error) {
	var r Row
	var status string
	var rateKey, errCode, errMsg, drainerID, idemKey, replaceKey sql.NullString
	var claimed, dispatched, started, finished, nonceExp, lease, notBefore, startBy sql.NullTime
	var retryOf, replacedBy sql.NullInt64
	var result []byte
	var lanes string
	err := s.Scan(&r.ID, &r.Tenant, &rateKey, &status, &r.Version, &r.Attempt, &r.QueuedAt, &claimed,
		&dispatched, &started, &finished, &errCode, &errMsg, &result, &retryOf, &r.Payload,
		&r.DispatchFailures, &r.NonceSHA256, &nonceExp, &lease, &drainerID, &r.Caller,
		&idemKey, &r.RequestSHA256, &notBefore, &r.VoidedNonce, &r.Refusals, &lanes, &r.Interactive,
		&r.StartSHA256, &startBy, &replaceKey, &replacedBy, &r.Priority)
	if err != nil {
		return r, err
	}
	r.Status = job.Status(status)
	r.Lanes = SplitLanes(lanes)
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
	r.StartBy = timePtr(startBy)
	r.ReplaceKey = strPtr(replaceKey)
	if replacedBy.Valid {
		v := replacedBy.Int64
		r.ReplacedBy = &v
	}
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
func Get(ctx context.Context, db sqldb.DB, id int64, forUpdate bool) (Row, error) {
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
func Position(ctx context.Context, db sqldb.DB, tenant string, queuedAt time.Time, id int64) (int64, error) {
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
func WithPosition(ctx context.Context, db sqldb.DB, j job.Job) (job.Job, error) {
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

// JoinLanes is how a job's lanes are stored: sorted, comma-joined, "" for none (migrations 0014, 0015); the lanes of a job and of a slot are stored the same way.
// Lane names never hold a comma (limits.validName).
func JoinLanes(lanes []string) string {
	s := slices.Clone(lanes)
	slices.Sort(s)
	return strings.Join(slices.Compact(s), ",")
}

// SplitLanes reads a job's stored lanes (JoinLanes): [] for none.
func SplitLanes(s string) []string {
	if s == "" {
		return []string{}
	}
	return strings.Split(s, ",")
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

// JobState is the part of a job that says whether it moved: a transition changes its status,
// its version, or both.
type JobState struct {
	Status  job.Status
	Version int64
}

// States reads the state of each job of ids that exists, by primary key in one statement.
func States(ctx context.Context, db sqldb.DB, ids []int64) (map[int64]JobState, error) {
	out := make(map[int64]JobState, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := db.QueryContext(ctx, "SELECT id, status, version FROM jobs WHERE id IN ("+Placeholders(len(ids))+")", int64Args(ids)...)
	if err != nil {
		return nil, fmt.Errorf("read job states: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var s JobState
		if err := rows.Scan(&id, &s.Status, &s.Version); err != nil {
			return nil, fmt.Errorf("read job states: %w", err)
		}
		out[id] = s
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read job states: %w", err)
	}
	return out, nil
}

// recentServiceJobs is how many of a tenant's last succeeded jobs RecentServiceTime reads.
const recentServiceJobs = 20

// RecentServiceTime returns the median time from start to outcome of tenant's last succeeded
// jobs (at most recentServiceJobs, newest first through tenant_settled_id), and false when it
// has none.
func RecentServiceTime(ctx context.Context, db sqldb.DB, tenant string) (time.Duration, bool, error) {
	rows, err := db.QueryContext(ctx, `SELECT TIMESTAMPDIFF(MICROSECOND, COALESCE(started_at, dispatched_at), finished_at)
		FROM jobs FORCE INDEX (tenant_settled_id) WHERE tenant = ? AND settled_status = 'succeeded'
		ORDER BY id DESC LIMIT ?`, tenant, recentServiceJobs)
	if err != nil {
		return 0, false, fmt.Errorf("read tenant %q's recent service times: %w", tenant, err)
	}
	defer rows.Close()
	var us []int64
	for rows.Next() {
		var v sql.NullInt64
		if err := rows.Scan(&v); err != nil {
			return 0, false, fmt.Errorf("read tenant %q's recent service times: %w", tenant, err)
		}
		if v.Valid {
			us = append(us, max(v.Int64, 0))
		}
	}
	if err := rows.Err(); err != nil {
		return 0, false, fmt.Errorf("read tenant %q's recent service times: %w", tenant, err)
	}
	if len(us) == 0 {
		return 0, false, nil
	}
	slices.Sort(us)
	return time.Duration(us[len(us)/2]) * time.Microsecond, true, nil
}
