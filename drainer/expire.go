package drainer

import (
	"context"
	"database/sql"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// expirer moves queued jobs past max_queue_age_seconds to expired (SPEC §4: never dispatched).
// RunOnce is one sweep; the pass's upkeep calls it, and nothing else does. It owns no state.
type expirer struct {
	cfg    *Config
	store  *store.Store
	config *configView
}

// expireBatch bounds the jobs one transaction expires, and expireBatches the transactions of one
// upkeep: a queue put far past its age limit drains into expired over a few seconds instead of
// holding thousands of row locks at once.
const expireBatch, expireBatches = 500, 4

// RunOnce moves the queued jobs older than max_queue_age_seconds (0, the default, is off) to
// expired. It uses the config the last pass read: the claim reads it under the claim lock, and
// the upkeep re-reads it whenever queued work was left behind, which is when anything can expire.
func (e *expirer) RunOnce(ctx context.Context, now time.Time) (int, error) {
	age := e.config.get().MaxQueueAge()
	if age <= 0 {
		return 0, nil
	}
	cutoff := now.Add(-age)
	n := 0
	for range expireBatches {
		var gone []store.Row
		err := inTx(ctx, e.cfg.DB, func(tx *sql.Tx) (err error) {
			gone, err = e.store.Expire(ctx, tx, now, cutoff, expireBatch)
			return err
		})
		if err != nil {
			return n, err
		}
		n += len(gone)
		for _, r := range gone {
			e.store.Metrics.Finished(job.Expired, r.DispatchedAt, now)
		}
		if len(gone) < expireBatch {
			break
		}
	}
	return n, nil
}
