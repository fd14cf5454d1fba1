package drainer

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// rescuer recovers the jobs whose lease expired: their drainer died or froze (SPEC §4); and it
// deletes the slots whose lease ran out (SPEC §5a: their holder stopped renewing). RunOnce is one
// scan, recovery and sweep; the pass's upkeep calls it, and nothing else does. It owns no state:
// it reads the Drainer's Config and the runtime config in config (re-read through refresh when
// the pass has not), and wakes a pass (wake) when it requeued something or swept a slot.
type rescuer struct {
	cfg     *Config
	store   *store.Store
	config  *configView
	refresh func(context.Context) error // re-reads the runtime config (Drainer.refreshConfig)
	wake    func()
}

// slotSweepBatch bounds the expired slots one upkeep deletes: the sweep's transaction stays
// short, and a backlog of expired slots (they no longer count) drains over a few poll periods.
const slotSweepBatch = 100

// RunOnce recovers the jobs whose lease expired before now (store.ScanExpiredWithSlots,
// recover) and sweeps the slots whose lease ran out (sweep), and returns how many jobs it
// recovered and slots it deleted. hb, if not nil, is written in the scan's round trip; fresh
// tells whether this pass has already re-read the runtime config.
func (rs *rescuer) RunOnce(ctx context.Context, now time.Time, hb *store.Heartbeat, fresh bool) (recovered, lost int, err error) {
	// The heartbeat, the lease scan and the expired slots' scan are one round trip.
	expired, slots, err := store.ScanExpiredWithSlots(ctx, rs.cfg.TxDB, store.ScanExpiredParams{Now: now, Heartbeat: hb}, slotSweepBatch)
	if err != nil {
		return 0, 0, err
	}
	if lost, err = rs.sweep(ctx, now, slots); err != nil {
		return 0, lost, err
	}
	recovered, err = rs.recover(ctx, now, fresh, expired)
	return recovered, lost, err
}

// sweep deletes the expired slots the scan found (store.SweepSlots: their lost audit rows and a
// release poke per tenant in the same transaction) and wakes a pass, since the capacity they
// held was counted until their lease ran out. The slots stopped counting at expiry already:
// the sweep only tidies and tells.
func (rs *rescuer) sweep(ctx context.Context, now time.Time, slots []store.ExpiredSlot) (int, error) {
	if len(slots) == 0 {
		return 0, nil
	}
	n, err := rs.store.SweepSlots(ctx, rs.cfg.TxDB, now, rs.cfg.ID, slots)
	if err != nil {
		return 0, err
	}
	if n > 0 {
		if rs.cfg.Metrics != nil {
			rs.cfg.Metrics.SlotsLost.Add(float64(n))
		}
		rs.wake()
	}
	return n, nil
}

// recover takes back the expired jobs (store.ScanExpiredWithSlots): their drainer died or froze. A job never
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
