package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/sqldb"
)

// JobVersion names a job as a writer last saw it: the fence of a write on it.
type JobVersion struct {
	ID      int64
	Version int64
}

// RenewLeasesParams are the leases one drainer renews.
type RenewLeasesParams struct {
	// DrainerID is the drainer that holds the jobs.
	DrainerID string
	// Now is the renewal's time; Until the new end of each lease (Now plus the lease).
	Now, Until time.Time
	// DispatchedAfter is the wall's bound: a job dispatched at or before it has run past its
	// wall and is not renewed, so that recovery takes it when its lease runs out.
	DispatchedAfter time.Time
	// Jobs are the jobs to renew, each fenced on its version. At least one.
	Jobs []JobVersion
}

// RenewLeases extends the leases of p.Jobs that p.DrainerID still holds in flight at the
// version it claimed, and returns how many it extended. A renewal only ever extends: a 202
// recorded while the renewal was on its way has moved the job's lease to its wall (LeaseToWall),
// and must not be cut back to one lease. It locks the rows it changes, no others: the primary key
// is forced, because the optimizer, seeing the status range, may walk the claim index instead
// and take next-key locks over every job in flight, and the outcome writer moving a job out of
// that range then deadlocks with it (seen as a failed pass in BenchmarkWeightedPass).
func RenewLeases(ctx context.Context, db sqldb.DB, p RenewLeasesParams) (int, error) {
	q := "UPDATE jobs FORCE INDEX (PRIMARY) SET lease_until = GREATEST(COALESCE(lease_until, ?), ?) WHERE drainer_id = ? AND status IN ('claimed','dispatched','running') AND dispatched_at > ? AND ("
	args := []any{p.Now, p.Until, p.DrainerID, p.DispatchedAfter}
	for i, j := range p.Jobs {
		if i > 0 {
			q += " OR "
		}
		q += "(id = ? AND version = ?)"
		args = append(args, j.ID, j.Version)
	}
	q += ")"
	res, err := db.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("renew leases: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// Lease is what a drainer checks of a job it holds: whether it still owns it.
type Lease struct {
	ID           int64
	Version      int64
	Status       job.Status
	DrainerID    string // "" when none
	DispatchedAt *time.Time
}

// ReadLeases reads the lease columns of the jobs ids that exist, without locking them.
func ReadLeases(ctx context.Context, db sqldb.DB, ids []int64) ([]Lease, error) {
	rows, err := db.QueryContext(ctx, "SELECT id, version, status, drainer_id, dispatched_at FROM jobs WHERE id IN ("+Placeholders(len(ids))+")", int64Args(ids)...)
	if err != nil {
		return nil, fmt.Errorf("check held jobs: %w", err)
	}
	defer rows.Close()
	var out []Lease
	for rows.Next() {
		var l Lease
		var status string
		var drainer sql.NullString
		var dispatched sql.NullTime
		if err := rows.Scan(&l.ID, &l.Version, &status, &drainer, &dispatched); err != nil {
			return nil, fmt.Errorf("check held jobs: %w", err)
		}
		l.Status, l.DrainerID, l.DispatchedAt = job.Status(status), drainer.String, timePtr(dispatched)
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("check held jobs: %w", err)
	}
	return out, nil
}

// LeaseToWallParams name a job an executor accepted (202) and the end of its wall.
type LeaseToWallParams struct {
	Job  JobVersion
	Wall time.Time
}

// LeaseToWall records a 202: the executor has the job and will report through /complete, so its
// lease runs to its wall at once and recovery takes it only then (SPEC §8). Fenced on the
// version and the dispatched or running state: it reports false, and changes nothing, when the
// job moved on (an early /complete).
func LeaseToWall(ctx context.Context, db sqldb.DB, p LeaseToWallParams) (bool, error) {
	res, err := db.ExecContext(ctx, `UPDATE jobs SET lease_until = ?
		WHERE id = ? AND version = ? AND status IN ('dispatched','running')`,
		p.Wall, p.Job.ID, p.Job.Version)
	if err != nil {
		return false, fmt.Errorf("extend the lease of accepted job %d to its wall: %w", p.Job.ID, err)
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

func int64Args(ids []int64) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}
