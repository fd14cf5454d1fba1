package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/sqldb"
	"github.com/sluicehq/sluice/outbox"
)

// ExpiredCode is the error_code of a job that expired in the queue (max_queue_age_seconds).
const ExpiredCode = "max_queue_age"

// StartDeadlineCode is the error_code of a job that was not dispatched by its start_by.
const StartDeadlineCode = string(job.CodeStartDeadline)

// Expire moves to expired, in tx, up to limit queued jobs queued before cutoff (SPEC §9
// max_queue_age_seconds) and returns them as they were. Rows another transaction holds (a claim
// taking them, a cancel) are skipped: they are leaving the queue anyway, or are seen next time.
// A job that expires was never dispatched and held no slot, so no release poke is written.
func (s *Store) Expire(ctx context.Context, tx sqldb.DB, now, cutoff time.Time, limit int) ([]Row, error) {
	// The claim index leads with status, so this reads the queued range only; queued_at is its
	// third column, so the age test is made on index entries without reading rows.
	old, err := lockExpiring(ctx, tx, `FORCE INDEX (claim) WHERE status = 'queued' AND queued_at < ?`, []any{cutoff}, limit)
	if err != nil || len(old) == 0 {
		return nil, err
	}
	return old, s.expire(ctx, tx, now, old, ExpiredCode, "queued longer than max_queue_age_seconds", false)
}

// ExpireStartDeadlines moves to expired, in tx, up to limit queued jobs whose start_by is before
// now, with error_code start_deadline, an audit event and a release poke each (a waiter on the
// job learns its end), and returns them as they were. The claim never dispatches such a job
// either (its UPDATE checks start_by), so a job past its deadline waits only for this sweep to
// say so. It reads job_deadlines (migration 0021) oldest deadline first, and deletes the rows it
// read whose job is no longer queued: those it expired, and those of jobs that left the queue in
// time. Rows another transaction holds are skipped, as in Expire, and their deadlines kept.
func (s *Store) ExpireStartDeadlines(ctx context.Context, tx sqldb.DB, now time.Time, limit int) ([]Row, error) {
	// The deadlines of jobs in flight are passed over (a requeue may put them back in the queue,
	// so they stay), else enough of them would fill every sweep's LIMIT and keep the queued jobs
	// behind them from expiring; the walk over them is bounded by the global cap.
	rows, err := tx.QueryContext(ctx, `SELECT d.job_id, j.status <=> 'queued' FROM job_deadlines d FORCE INDEX (start_by)
		LEFT JOIN jobs j ON j.id = d.job_id WHERE d.start_by < ? AND `+notInFlight+`
		ORDER BY d.start_by, d.job_id LIMIT ?`, now, limit)
	if err != nil {
		return nil, fmt.Errorf("find jobs past their start_by: %w", err)
	}
	var queued, done []any // done: the deadlines of jobs that ended (or are gone)
	for rows.Next() {
		var id int64
		var q bool
		if err := rows.Scan(&id, &q); err != nil {
			rows.Close()
			return nil, fmt.Errorf("find jobs past their start_by: %w", err)
		}
		if q {
			queued = append(queued, id)
		} else {
			done = append(done, id)
		}
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, fmt.Errorf("find jobs past their start_by: %w", err)
	}
	var old []Row
	if len(queued) > 0 {
		// A job held elsewhere is skipped, and keeps its deadline for a later sweep.
		if old, err = lockExpiring(ctx, tx, `WHERE id IN (`+Placeholders(len(queued))+`) AND status = 'queued' AND start_by < ?`,
			append(slices.Clone(queued), now), len(queued)); err != nil {
			return nil, err
		}
	}
	if len(old) > 0 {
		if err := s.expire(ctx, tx, now, old, StartDeadlineCode, "not dispatched by its start_by", true); err != nil {
			return nil, err
		}
		for _, r := range old {
			done = append(done, r.ID)
		}
	}
	if len(done) > 0 {
		if _, err := tx.ExecContext(ctx, `DELETE FROM job_deadlines WHERE job_id IN (`+Placeholders(len(done))+`)`, done...); err != nil {
			return nil, fmt.Errorf("forget the deadlines met: %w", err)
		}
	}
	return old, nil
}

// notInFlight is the condition on a job_deadlines row d, joined to its job j, that the sweep looks
// at: its job queued, ended or gone, not in flight.
const notInFlight = `(j.id IS NULL OR j.status NOT IN ('claimed','dispatched','running'))`

// StartDeadlinesPassed reports whether a deadline in job_deadlines is before now, of a job not in
// flight: one walk of its index, without a lock, past at most the jobs in flight, so that a sweep
// that finds nothing costs one statement.
func StartDeadlinesPassed(ctx context.Context, db sqldb.DB, now time.Time) (bool, error) {
	var any bool
	err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM job_deadlines d FORCE INDEX (start_by)
		LEFT JOIN jobs j ON j.id = d.job_id WHERE d.start_by < ? AND `+notInFlight+`)`, now).Scan(&any)
	if err != nil {
		return false, fmt.Errorf("look for jobs past their start_by: %w", err)
	}
	return any, nil
}

// lockExpiring locks up to limit queued jobs that where (an index hint and a WHERE clause with
// args) selects, skipping rows another transaction holds.
func lockExpiring(ctx context.Context, tx sqldb.DB, where string, args []any, limit int) ([]Row, error) {
	rows, err := tx.QueryContext(ctx, "SELECT "+LockColumns+" FROM jobs "+where+" LIMIT ? FOR UPDATE SKIP LOCKED", append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("find queued jobs to expire: %w", err)
	}
	var old []Row
	res := ResultsOf(rows)
	if err := errors.Join(res.EachRow(func(r Row) { old = append(old, r) }), res.Close()); err != nil {
		return nil, fmt.Errorf("find queued jobs to expire: %w", err)
	}
	return old, nil
}

// expire moves old, queued jobs locked in tx, to expired with code and msg, audits each, and
// with poke writes a release poke for each.
func (s *Store) expire(ctx context.Context, tx sqldb.DB, now time.Time, old []Row, code, msg string, poke bool) error {
	tenants := make([]string, len(old))
	for i, r := range old {
		tenants[i] = r.Tenant
	}
	// The job rows are locked; their tenants' rows next, in key order (see lockInOrder).
	lq, largs := lockTenantRowsSQL(tenants)
	if _, err := tx.ExecContext(ctx, lq, largs...); err != nil {
		return fmt.Errorf("expire queued jobs: lock tenants: %w", err)
	}
	args := []any{now, code, msg}
	for _, r := range old {
		args = append(args, r.ID)
	}
	// The rows are locked, so their versions cannot have moved since they were read.
	upd, err := tx.ExecContext(ctx, `UPDATE jobs SET status = 'expired', version = version + 1, finished_at = ?,
		error_code = ?, error_message = ? WHERE status = 'queued' AND id IN (`+Placeholders(len(old))+`)`, args...)
	if err != nil {
		return fmt.Errorf("expire queued jobs: %w", err)
	}
	if n, err := upd.RowsAffected(); err == nil && n != int64(len(old)) {
		return fmt.Errorf("expire queued jobs: %d of %d locked rows changed: %w", n, len(old), ErrFenced)
	}
	events := make([]AuditEvent, len(old))
	for i, r := range old {
		events[i] = transitionEvent(s.actor(ctx), r, job.Expired, r.Version+1, r.Attempt, code)
	}
	if err := s.insertAudit(ctx, tx, events...); err != nil {
		return fmt.Errorf("expire queued jobs: %w", err)
	}
	if poke {
		msgs := make([]outbox.Message, len(old))
		for i, r := range old {
			msgs[i] = outbox.PokeMessage(s.prefix(), outbox.Release, r.Tenant, r.ID)
		}
		if _, err := outbox.Write(ctx, tx, now, msgs...); err != nil {
			return fmt.Errorf("expire queued jobs: release pokes: %w", err)
		}
	}
	for _, r := range old {
		s.LogTransition(ctx, r, job.Expired, r.Version+1, now, code)
	}
	return nil
}
