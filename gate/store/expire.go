package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/sqldb"
)

// ExpiredCode is the error_code of a job that expired in the queue (max_queue_age_seconds).
const ExpiredCode = "max_queue_age"

// Expire moves to expired, in tx, up to limit queued jobs queued before cutoff (SPEC §9
// max_queue_age_seconds) and returns them as they were. Rows another transaction holds (a claim
// taking them, a cancel) are skipped: they are leaving the queue anyway, or are seen next time.
// A job that expires was never dispatched and held no slot, so no release poke is written.
func (s *Store) Expire(ctx context.Context, tx sqldb.DB, now, cutoff time.Time, limit int) ([]Row, error) {
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
	args := []any{now, ExpiredCode}
	for _, r := range old {
		args = append(args, r.ID)
	}
	// The rows are locked, so their versions cannot have moved since they were read.
	upd, err := tx.ExecContext(ctx, `UPDATE jobs SET status = 'expired', version = version + 1, finished_at = ?,
		error_code = ?, error_message = 'queued longer than max_queue_age_seconds'
		WHERE status = 'queued' AND id IN (`+Placeholders(len(old))+`)`, args...)
	if err != nil {
		return nil, fmt.Errorf("expire queued jobs: %w", err)
	}
	if n, err := upd.RowsAffected(); err == nil && n != int64(len(old)) {
		return nil, fmt.Errorf("expire queued jobs: %d of %d locked rows changed: %w", n, len(old), ErrFenced)
	}
	events := make([]AuditEvent, len(old))
	for i, r := range old {
		events[i] = transitionEvent(s.actor(ctx), r, job.Expired, r.Version+1, r.Attempt, ExpiredCode)
	}
	if err := s.insertAudit(ctx, tx, events...); err != nil {
		return nil, fmt.Errorf("expire queued jobs: %w", err)
	}
	for _, r := range old {
		s.LogTransition(ctx, r, job.Expired, r.Version+1, now, ExpiredCode)
	}
	return old, nil
}
