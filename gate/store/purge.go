package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/gate/sqldb"
)

// PurgeSettled deletes up to limit jobs that reached a final state (succeeded, failed, canceled,
// rejected, lost, expired, replaced) before cutoff, oldest first, and returns how many it deleted. Their
// idempotency keys go with them (SPEC §9 retention_days). Jobs still queued or in flight are
// never deleted, however old. The tenants of the deleted jobs that have no job left lose their
// tenants row too, so tenants that stopped sending work (or a flood of one-off tenant names) do
// not stay forever; a tenant that sends again gets a new row at its next admission.
//
// No index orders jobs by finished_at, and one would cost every admission an index entry. The
// delete walks the primary key instead, bounded by the first job queued at or after cutoff:
// a job finished before cutoff was queued before it, and ids follow queued_at closely (they
// disagree only for admissions committing at the same moment, which the next pass catches).
func PurgeSettled(ctx context.Context, db sqldb.DB, cutoff time.Time, limit int) (int64, error) {
	bound, err := firstQueuedSince(ctx, db, cutoff)
	if err != nil || bound == 0 {
		return 0, err
	}
	const batch = `FROM jobs WHERE id < ? AND settled_status IS NOT NULL AND finished_at < ? ORDER BY id LIMIT ?`
	tenants, err := batchTenants(ctx, db, "SELECT DISTINCT tenant FROM (SELECT tenant "+batch+") b", bound, cutoff, limit)
	if err != nil {
		return 0, err
	}
	res, err := db.ExecContext(ctx, "DELETE "+batch, bound, cutoff, limit)
	if err != nil {
		return 0, fmt.Errorf("purge finished jobs: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("purge finished jobs: %w", err)
	}
	if n > 0 {
		if err := purgeReplaceKeys(ctx, db, bound); err != nil {
			return n, err
		}
		if err := purgeRedrives(ctx, db, bound); err != nil {
			return n, err
		}
	}
	if len(tenants) > 0 {
		// The foreign key from jobs makes this fail rather than delete a tenant that an admission
		// gave a job meanwhile; the next purge tries again.
		if _, err := db.ExecContext(ctx, `DELETE FROM tenants WHERE tenant IN (`+Placeholders(len(tenants))+`)
			AND queued = 0 AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.tenant = tenants.tenant)`, tenants...); err != nil {
			return n, fmt.Errorf("purge tenants with no jobs left: %w", err)
		}
		// Their time used (ordering fair_time) goes with them; a tenant that the delete kept
		// keeps it.
		if _, err := db.ExecContext(ctx, `DELETE FROM tenant_time WHERE tenant IN (`+Placeholders(len(tenants))+`)
			AND NOT EXISTS (SELECT 1 FROM tenants t WHERE t.tenant = tenant_time.tenant)`, tenants...); err != nil {
			return n, fmt.Errorf("purge the time used of tenants purged: %w", err)
		}
	}
	return n, nil
}

// purgeReplaceKeys deletes the replace keys (migration 0021) that name jobs below bound that are
// gone. The read does not lock (a locking read of jobs would wait for claims); the delete names
// the jobs it found, so a key an admission maps to a new job meanwhile stays.
func purgeReplaceKeys(ctx context.Context, db sqldb.DB, bound int64) error {
	return deleteJobRows(ctx, db, "purge the replace keys of finished jobs", "replace_keys",
		`SELECT k.job_id FROM replace_keys k FORCE INDEX (job_id)
		LEFT JOIN jobs j ON j.id = k.job_id WHERE k.job_id < ? AND j.id IS NULL LIMIT 1000`, bound)
}

// purgeRedrives deletes the links of job_redrives (migration 0027) from redrives below bound that
// are gone. A link lives as long as its redrive: the job redriven ended before the redrive was
// admitted, so it is purged no later.
func purgeRedrives(ctx context.Context, db sqldb.DB, bound int64) error {
	return deleteJobRows(ctx, db, "purge the links of redrives purged", "job_redrives",
		`SELECT r.job_id FROM job_redrives r FORCE INDEX (job_id)
		LEFT JOIN jobs j ON j.id = r.job_id WHERE r.job_id < ? AND j.id IS NULL LIMIT 1000`, bound)
}

// DeleteEndedPriorities deletes up to limit rows of job_priorities (migration 0022) whose jobs
// have ended or are gone, and reports whether rows are left: a heads read passes over them, and
// while the table has any row every tenants page dives into it for each tenant (tenantsSQL), so
// the caller keeps calling until it is empty. A job that has ended never returns to the queue,
// so the rows read are deleted by their ids without a lock; the read walks the small table,
// whose rows are the queued and running jobs of another priority than the default and those
// ended since the last call.
func DeleteEndedPriorities(ctx context.Context, db sqldb.DB, limit int) (left bool, err error) {
	if err := db.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM job_priorities)").Scan(&left); err != nil || !left {
		if err != nil {
			return true, fmt.Errorf("delete the priorities of ended jobs: any: %w", err)
		}
		return false, nil // one dive into an empty table: the usual answer
	}
	if err := deleteJobRows(ctx, db, "delete the priorities of ended jobs", "job_priorities",
		`SELECT p.job_id FROM job_priorities p LEFT JOIN jobs j ON j.id = p.job_id
		WHERE j.id IS NULL OR j.status NOT IN ('queued','claimed','dispatched','running') LIMIT ?`, limit); err != nil {
		return true, err
	}
	if err := db.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM job_priorities)").Scan(&left); err != nil {
		return true, fmt.Errorf("delete the priorities of ended jobs: any left: %w", err)
	}
	return left, nil
}

// deleteJobRows deletes from table (keyed by job_id) the rows of the job ids that q, with args,
// reads, in a statement of its own after the read; what names the work in errors.
func deleteJobRows(ctx context.Context, db sqldb.DB, what, table, q string, args ...any) error {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	var ids []any
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return fmt.Errorf("%s: %w", what, err)
		}
		ids = append(ids, id)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if len(ids) == 0 {
		return nil
	}
	if _, err := db.ExecContext(ctx, `DELETE FROM `+table+` WHERE job_id IN (`+Placeholders(len(ids))+`)`, ids...); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// batchTenants returns the tenants q (one column) lists.
func batchTenants(ctx context.Context, db sqldb.DB, q string, args ...any) ([]any, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("purge finished jobs: their tenants: %w", err)
	}
	defer rows.Close()
	var out []any
	for rows.Next() {
		var t []byte
		if err := rows.Scan(&t); err != nil {
			return nil, fmt.Errorf("purge finished jobs: their tenants: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("purge finished jobs: their tenants: %w", err)
	}
	return out, nil
}

// firstQueuedSince returns an id bound: the jobs below it were queued before cutoff, those from
// it on at or after cutoff (the id after the last job if all were queued before; 0 if there are
// no jobs). It is a binary search of the primary key: about 25 point reads for 30 million jobs.
func firstQueuedSince(ctx context.Context, db sqldb.DB, cutoff time.Time) (int64, error) {
	var lo, hi sql.NullInt64
	if err := db.QueryRowContext(ctx, "SELECT MIN(id), MAX(id) + 1 FROM jobs").Scan(&lo, &hi); err != nil {
		return 0, fmt.Errorf("purge finished jobs: id range: %w", err)
	}
	if !lo.Valid {
		return 0, nil
	}
	l, h := lo.Int64, hi.Int64 // the answer is in [l, h]
	for l < h {
		mid := l + (h-l)/2
		var id int64
		var queued time.Time
		// A job scheduled for later (run_at: queued_at and not_before both at its due time) is
		// stepped over: its queued_at says when it is due, not when its id was given, and would
		// stop the bound at its id until then.
		err := db.QueryRowContext(ctx, `SELECT id, queued_at FROM jobs WHERE id >= ?
			AND NOT (status = 'queued' AND queued_at <=> not_before) ORDER BY id LIMIT 1`, mid).Scan(&id, &queued)
		switch {
		case errors.Is(err, sql.ErrNoRows) || (err == nil && id >= h): // no job in [mid, h)
			h = mid
		case err != nil:
			return 0, fmt.Errorf("purge finished jobs: %w", err)
		case queued.Before(cutoff):
			l = id + 1
		default:
			h = id
		}
	}
	return l, nil
}
