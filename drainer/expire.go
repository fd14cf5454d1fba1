package drainer

import (
	"context"
	"database/sql"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// expirer moves queued jobs past max_queue_age_seconds, and queued jobs past their start_by, to
// expired (SPEC §4: never dispatched). RunOnce is one sweep; the pass's upkeep calls it, and
// nothing else does. It owns no state.
type expirer struct {
	cfg    *Config
	store  *store.Store
	config *configView
}

// expireBatch bounds the jobs one transaction expires, and expireBatches the transactions of one
// upkeep: a queue put far past its age limit drains into expired over a few seconds instead of
// holding thousands of row locks at once.
const expireBatch, expireBatches = 500, 4

// endedPrioritiesBatch bounds the job_priorities rows of ended jobs one upkeep deletes.
const endedPrioritiesBatch = 1000

// RunOnce moves to expired the queued jobs older than max_queue_age_seconds (0, the default, is
// off) and, when queued is set (queued work may be waiting: the drainer left some behind, or is
// paused), those past their start_by; an idle drainer with an empty queue spends no statement on
// deadlines. It uses the config the last pass read: the claim reads it under the claim lock, and
// the upkeep re-reads it while queued work is left.
func (e *expirer) RunOnce(ctx context.Context, now time.Time, queued bool) (int, error) {
	n := 0
	if queued {
		var err error
		if n, err = e.deadlines(ctx, now); err != nil {
			return n, err
		}
	}
	age := e.config.get().MaxQueueAge()
	if age <= 0 {
		return n, nil
	}
	cutoff := now.Add(-age)
	aged, err := e.sweep(ctx, now, func(tx *sql.Tx) ([]store.Row, error) {
		return e.store.Expire(ctx, tx, now, cutoff, expireBatch)
	})
	return n + aged, err
}

// deadlines expires the queued jobs past their start_by, after one look for any.
func (e *expirer) deadlines(ctx context.Context, now time.Time) (int, error) {
	if any, err := store.StartDeadlinesPassed(ctx, e.cfg.DB, now); err != nil || !any {
		return 0, err
	}
	var ended []int64
	n, err := e.sweep(ctx, now, func(tx *sql.Tx) ([]store.Row, error) {
		gone, err := e.store.ExpireStartDeadlines(ctx, tx, now, expireBatch)
		for _, r := range gone {
			ended = append(ended, r.ID)
		}
		return gone, err
	})
	if len(ended) > 0 && e.cfg.Ended != nil {
		e.cfg.Ended(ended)
	}
	return n, err
}

// sweep runs expire in up to expireBatches transactions, until one expires fewer than
// expireBatch jobs, and counts what they expired.
func (e *expirer) sweep(ctx context.Context, now time.Time, expire func(tx *sql.Tx) ([]store.Row, error)) (int, error) {
	n := 0
	for range expireBatches {
		var gone []store.Row
		err := inTx(ctx, e.cfg.DB, func(tx *sql.Tx) (err error) {
			gone, err = expire(tx)
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
