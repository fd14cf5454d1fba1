package store

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice/gate/sqldb"
)

// RecountQueues recomputes the queue state of tenants (every tenant when none is named) from
// their jobs (migration 0010: the queued count and the oldest queued job), each tenant's row under
// its lock. Admission counts the jobs
// it inserts, and the triggers count jobs leaving and re-entering queued, so sluice itself never
// needs this: it is for jobs inserted some other way (a test's or an operator's raw INSERT), which
// no claim would see until their tenant is recounted. It reads every tenant's jobs once, so it
// is an operation to run by hand, not in a loop.
func RecountQueues(ctx context.Context, db sqldb.DB, tenants ...string) error {
	q, args := recountSQL, []any{}
	if len(tenants) > 0 {
		q += " WHERE t.tenant IN (" + Placeholders(len(tenants)) + ")"
		for _, t := range tenants {
			args = append(args, t)
		}
	}
	if _, err := db.ExecContext(ctx, q, args...); err != nil {
		return fmt.Errorf("recount tenants' queues: %w", err)
	}
	return nil
}

// recountSQL is the backfill statement of migration 0010 (TestRecountIsTheBackfill).
const recountSQL = `UPDATE tenants t SET
  queued = (SELECT COUNT(*) FROM jobs j FORCE INDEX (claim) WHERE j.status = 'queued' AND j.tenant = t.tenant),
  head_id = (SELECT j.id FROM jobs j FORCE INDEX (claim) WHERE j.status = 'queued' AND j.tenant = t.tenant
    ORDER BY j.queued_at, j.id LIMIT 1),
  head_at = (SELECT j.queued_at FROM jobs j WHERE j.id = t.head_id)`
