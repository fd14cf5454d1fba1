package drainer

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// rescuer recovers the jobs whose lease expired: their drainer died or froze (SPEC §4). RunOnce
// is one scan and recovery; the pass's upkeep calls it, and nothing else does. It owns no state:
// it reads the Drainer's Config and the runtime config in config (re-read through refresh when
// the pass has not), and wakes a pass (wake) when it requeued something.
type rescuer struct {
	cfg     *Config
	store   *store.Store
	config  *configView
	refresh func(context.Context) error // re-reads the runtime config (Drainer.refreshConfig)
	wake    func()
}

// RunOnce recovers the jobs whose lease expired before now (store.ScanExpired, recover) and returns
// how many it recovered. hb, if not nil, is written in the scan's round trip; fresh tells whether
// this pass has already re-read the runtime config.
func (rs *rescuer) RunOnce(ctx context.Context, now time.Time, hb *store.Heartbeat, fresh bool) (int, error) {
	db := rs.cfg.DB
	if hb != nil {
		db = rs.cfg.TxDB // the heartbeat and the scan are two statements in one round trip
	}
	expired, err := store.ScanExpired(ctx, db, store.ScanExpiredParams{Now: now, Heartbeat: hb})
	if err != nil {
		return 0, err
	}
	return rs.recover(ctx, now, fresh, expired)
}

// recover takes back the expired jobs (store.ScanExpired): their drainer died or froze. A job never
// sent goes back to queued; a dispatched job whose start was never confirmed goes back to
// queued with its nonce voided (or is lost when starts are not confirmed); a running job is lost,
// never re-run. Every write is fenced on the version read, so a drainer that comes back finds
// its own writes refused. fresh tells whether this pass's upkeep has read the runtime config; if
// not, it is read before anything is recovered, for the dispatch budget.
func (rs *rescuer) recover(ctx context.Context, now time.Time, fresh bool, expired []store.Row) (int, error) {
	if len(expired) == 0 {
		return 0, nil
	}
	if !fresh {
		if err := rs.refresh(ctx); err != nil {
			return 0, err
		}
	}
	cfg := rs.config.get()
	n := 0
	for _, r := range expired {
		var o store.Outcome
		switch {
		case r.Status == job.Claimed:
			o = store.Outcome{Status: job.Queued}
		case r.Status == job.Dispatched && !rs.cfg.UnconfirmedStarts:
			o = store.Outcome{Status: job.Queued, CountFailure: true, Budget: cfg.DispatchAttempts,
				ErrorCode: "lease_expired", ErrorMessage: "the drainer's lease expired before the start was confirmed"}
		default:
			o = store.Outcome{Status: job.Lost, ErrorCode: "lease_expired",
				ErrorMessage: "the drainer's lease expired while the job was in flight"}
		}
		var to job.Status
		err := inTx(ctx, rs.cfg.DB, func(tx *sql.Tx) (err error) {
			to, err = rs.store.Finish(ctx, tx, now, r, o)
			return err
		})
		switch {
		case errors.Is(err, store.ErrFenced):
			continue // someone else finished or recovered it first
		case err != nil:
			return n, err
		}
		rs.store.Metrics.Finished(to, r.DispatchedAt, now)
		n++
	}
	if n > 0 {
		rs.wake()
	}
	return n, nil
}
