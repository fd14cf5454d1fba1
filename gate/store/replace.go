package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/sqldb"
	"github.com/sluicehq/sluice/outbox"
)

// ReplacedCode is the error_code of a job a newer admission with its replace_key replaced.
const ReplacedCode = "replaced"

// TenantKey is a tenant's replace_key.
type TenantKey struct {
	Tenant, Key string
}

// LockReplaceable locks and returns the queued jobs that have one of keys, in tx, an admission's
// transaction that already holds the keys' tenants' rows (AdmissionTx.ReadAdmission): the job
// replace_keys (migration 0021) maps each key to, if it is still queued. One job at most per key,
// since every admission of a tenant holds its row while it replaces and maps. It takes the job
// rows without waiting: the lock order (lockorder.go) has job rows before tenants' rows, so an
// admission must not wait for a job a claim holds while that claim waits for the tenant the
// admission holds. A row held elsewhere fails the statement with a lock wait timeout (1205), and
// the admission is retried as a whole once that transaction ended: a claim then has taken the
// job out of the queue (a dispatched job is not replaced), or left it there.
func LockReplaceable(ctx context.Context, tx sqldb.DB, keys []TenantKey) ([]Row, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	var where strings.Builder
	args := make([]any, 0, 2*len(keys))
	for i, k := range keys {
		if i > 0 {
			where.WriteString(" OR ")
		}
		where.WriteString("(k.tenant = ? AND k.replace_key = ?)")
		args = append(args, k.Tenant, k.Key)
	}
	// Only the keys whose job is still queued, read without a lock: a job that left the queue
	// keeps its key's row until a newer admission or the purge, and a locking read of it would
	// fail (NOWAIT) whenever its outcome or a lease renewal held it.
	rows, err := tx.QueryContext(ctx, "SELECT k.job_id FROM replace_keys k JOIN jobs j ON j.id = k.job_id AND j.status = 'queued' WHERE "+
		where.String(), args...)
	if err != nil {
		return nil, fmt.Errorf("read the jobs of replace keys: %w", err)
	}
	var ids []any
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read the jobs of replace keys: %w", err)
		}
		ids = append(ids, id)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, fmt.Errorf("read the jobs of replace keys: %w", err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	jobs, err := tx.QueryContext(ctx, "SELECT "+LockColumns+" FROM jobs WHERE id IN ("+Placeholders(len(ids))+
		") AND status = 'queued' ORDER BY id FOR UPDATE NOWAIT", ids...)
	if err != nil {
		return nil, fmt.Errorf("lock the queued jobs of replace keys: %w", err)
	}
	var out []Row
	res := ResultsOf(jobs)
	if err := errors.Join(res.EachRow(func(r Row) { out = append(out, r) }), res.Close()); err != nil {
		return nil, fmt.Errorf("lock the queued jobs of replace keys: %w", err)
	}
	return out, nil
}

// JobKeys are what an admitted job's lookups need besides its row (migration 0021).
type JobKeys struct {
	ID         int64
	Tenant     string
	StartBy    *time.Time
	ReplaceKey *string
	// Priority, if set and not job.DefaultPriority, is recorded in job_priorities (migration
	// 0022) with QueuedAt, the job's place in its tenant's queue.
	Priority *int
	QueuedAt time.Time
	// RetryOf, if set, is the job it redrives, linked in job_redrives (migration 0027).
	RetryOf *int64
}

// RecordJobKeys writes, in tx, the admission's transaction that inserted jobs, each job's
// deadline into job_deadlines, its priority, if not the default, into job_priorities, its
// replace key into replace_keys (the key now maps to it; in jobs' order, so the last job of a key
// wins), and the job it redrives into job_redrives. Jobs with none of them are skipped; none, no
// statement.
func RecordJobKeys(ctx context.Context, tx sqldb.DB, jobs []JobKeys) error {
	var deadlines, keys, priorities, redrives []any
	for _, j := range jobs {
		if j.RetryOf != nil {
			redrives = append(redrives, *j.RetryOf, j.ID)
		}
		if j.Priority != nil && *j.Priority != job.DefaultPriority {
			priorities = append(priorities, j.ID, j.Tenant, *j.Priority, j.QueuedAt)
		}
		if j.StartBy != nil {
			deadlines = append(deadlines, j.ID, *j.StartBy)
		}
		if j.ReplaceKey != nil {
			keys = append(keys, j.Tenant, *j.ReplaceKey, j.ID)
		}
	}
	if len(deadlines) > 0 {
		if _, err := tx.ExecContext(ctx, "INSERT INTO job_deadlines (job_id, start_by) VALUES "+
			strings.TrimSuffix(strings.Repeat("(?,?),", len(deadlines)/2), ","), deadlines...); err != nil {
			return fmt.Errorf("record start deadlines: %w", err)
		}
	}
	if len(priorities) > 0 {
		if _, err := tx.ExecContext(ctx, "INSERT INTO job_priorities (job_id, tenant, priority, queued_at) VALUES "+
			strings.TrimSuffix(strings.Repeat("(?,?,?,?),", len(priorities)/4), ","), priorities...); err != nil {
			return fmt.Errorf("record priorities: %w", err)
		}
	}
	if len(redrives) > 0 {
		if _, err := tx.ExecContext(ctx, "INSERT INTO job_redrives (retry_of, job_id) VALUES "+
			strings.TrimSuffix(strings.Repeat("(?,?),", len(redrives)/2), ","), redrives...); err != nil {
			return fmt.Errorf("record redrives: %w", err)
		}
	}
	if len(keys) > 0 {
		if _, err := tx.ExecContext(ctx, "INSERT INTO replace_keys (tenant, replace_key, job_id) VALUES "+
			strings.TrimSuffix(strings.Repeat("(?,?,?),", len(keys)/3), ",")+
			" ON DUPLICATE KEY UPDATE job_id = VALUES(job_id)", keys...); err != nil {
			return fmt.Errorf("record replace keys: %w", err)
		}
	}
	return nil
}

// Replacement is a queued job, locked in the transaction (LockReplaceable, or inserted by it),
// and the job that replaces it.
type Replacement struct {
	Old Row
	By  int64
}

// Replace moves each replacement's old job from queued to replaced, pointing at its successor,
// in tx, with an audit event and a release poke each (a waiter on the old job learns its end).
// The old rows are locked in tx, so a row that is not queued any more is ErrFenced.
func (s *Store) Replace(ctx context.Context, tx sqldb.DB, now time.Time, rs []Replacement) error {
	if len(rs) == 0 {
		return nil
	}
	var cases strings.Builder
	args := []any{now, ReplacedCode}
	for _, r := range rs {
		cases.WriteString(" WHEN ? THEN ?")
		args = append(args, r.Old.ID, r.By)
	}
	for _, r := range rs {
		args = append(args, r.Old.ID)
	}
	upd, err := tx.ExecContext(ctx, `UPDATE jobs SET status = 'replaced', version = version + 1, finished_at = ?,
		error_code = ?, error_message = 'replaced by a newer job with the same replace_key', replaced_by = CASE id`+cases.String()+` END
		WHERE status = 'queued' AND id IN (`+Placeholders(len(rs))+`)`, args...)
	if err != nil {
		return fmt.Errorf("replace queued jobs: %w", err)
	}
	if n, err := upd.RowsAffected(); err == nil && n != int64(len(rs)) {
		return fmt.Errorf("replace queued jobs: %d of %d locked rows changed: %w", n, len(rs), ErrFenced)
	}
	events := make([]AuditEvent, len(rs))
	msgs := make([]outbox.Message, len(rs))
	for i, r := range rs {
		events[i] = transitionEvent(s.actor(ctx), r.Old, job.Replaced, r.Old.Version+1, r.Old.Attempt, ReplacedCode)
		msgs[i] = outbox.PokeMessage(s.prefix(), outbox.Release, r.Old.Tenant, r.Old.ID)
	}
	if err := s.insertAudit(ctx, tx, events...); err != nil {
		return fmt.Errorf("replace queued jobs: %w", err)
	}
	if _, err := outbox.Write(ctx, tx, now, msgs...); err != nil {
		return fmt.Errorf("replace queued jobs: release pokes: %w", err)
	}
	for _, r := range rs {
		s.LogTransition(ctx, r.Old, job.Replaced, r.Old.Version+1, now, ReplacedCode)
	}
	return nil
}
