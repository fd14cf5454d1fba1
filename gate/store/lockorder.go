package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/gate/sqldb"
)

// Lock order. The triggers of migration 0010 lock a tenant's row whenever one of its jobs enters
// or leaves queued, in the order the rows are written. Two transactions moving jobs of the same
// tenants in different orders (two batches of requeues, a requeue and a claim) would each hold a
// tenant the other waits for. So every transaction that moves jobs into or out of queued locks
// first the job rows it writes, in id order, then their tenants' rows, in key order, then writes;
// an admission locks its tenants first but locks no existing job row, so it waits for nobody who
// waits for it. tenant_time (ordering fair_time) comes last: an outcome's charge locks its
// tenants' rows there, in key order, after everything else its transaction holds, and nothing
// that holds one waits for another lock.

// lockInOrder locks the job rows of items in id order, then the tenants' rows, in key order.
func lockInOrder(ctx context.Context, tx sqldb.DB, items []Finishing, tenants []string) error {
	ids := make([]any, len(items))
	for i, it := range items {
		ids[i] = it.Row.ID
	}
	rows, err := tx.QueryContext(ctx, "SELECT id FROM jobs WHERE id IN ("+Placeholders(len(ids))+") ORDER BY id FOR UPDATE", ids...)
	if err != nil {
		return fmt.Errorf("lock jobs: %w", err)
	}
	if err := rows.Close(); err != nil {
		return fmt.Errorf("lock jobs: %w", err)
	}
	q, args := lockTenantRowsSQL(tenants)
	if _, err := tx.ExecContext(ctx, q, args...); err != nil {
		return fmt.Errorf("lock tenants: %w", err)
	}
	return nil
}

// lockTenantRowsSQL is the statement that locks the rows of tenants, in key order whatever the
// order and repeats of tenants: the second step of the lock order (see lockInOrder). An UPDATE
// that changes nothing rather than SELECT ... FOR UPDATE, so that it can go in a round trip of
// statements without result sets (FinishManyCommit).
func lockTenantRowsSQL(tenants []string) (string, []any) {
	seen := map[string]bool{}
	var args []any
	for _, t := range tenants {
		if !seen[t] {
			seen[t] = true
			args = append(args, t)
		}
	}
	return "UPDATE tenants SET queued = queued WHERE tenant IN (" + Placeholders(len(args)) + ") ORDER BY tenant", args
}

// LockJobs begins tx, if its first round trip, and locks the jobs ids in id order (the first
// step of the lock order), reading them as LockColumns in the same round trip: a batch of
// outcomes locks the rows it will write and checks their versions before it writes (FinishManyCommit).
// Ids that do not exist are left out.
func LockJobs(ctx context.Context, tx *ConnTx, ids []int64) ([]Row, error) {
	res, err := tx.Query(ctx, []string{lockJobsSQL(len(ids))}, int64Args(ids)...)
	if err != nil {
		return nil, fmt.Errorf("lock dispatched jobs: %w", err)
	}
	var out []Row
	err = res.EachRow(func(r Row) { out = append(out, r) })
	if err = errors.Join(err, res.Close()); err != nil {
		return nil, fmt.Errorf("lock dispatched jobs: %w", err)
	}
	return out, nil
}

// lockJobsSQL locks n jobs by id, in id order, and reads them as LockColumns.
func lockJobsSQL(n int) string {
	return "SELECT " + LockColumns + " FROM jobs WHERE id IN (" + Placeholders(n) + ") ORDER BY id FOR UPDATE"
}
