package drainer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// scanExpired lists, in one round trip, the in-flight jobs whose lease ran out before now, the
// longest expired first; hb, if not nil, is written in the same round trip.
func (d *Drainer) scanExpired(ctx context.Context, now time.Time, hb *heartbeatSQL) ([]store.Row, error) {
	q := "SELECT " + store.LockColumns + ` FROM jobs
		WHERE status IN ('claimed','dispatched','running') AND lease_until < ? ORDER BY lease_until LIMIT 100`
	args := []any{now}
	if hb != nil {
		q = hb.query + ";" + q
		args = append(append([]any{}, hb.args...), now)
	}
	rows, err := d.cfg.DB.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("scan expired leases: %w", err)
	}
	var expired []store.Row
	res := store.ResultsOf(rows)
	err = res.EachRow(func(r store.Row) { expired = append(expired, r) })
	if err = errors.Join(err, res.Close()); err != nil {
		return nil, fmt.Errorf("scan expired leases: %w", err)
	}
	return expired, nil
}

// recover takes back the expired jobs (scanExpired): their drainer died or froze. A job never
// sent goes back to queued; a dispatched job whose start was never confirmed goes back to
// queued with its nonce voided (or is lost when starts are not confirmed); a running job is lost,
// never re-run. Every write is fenced on the version read, so a drainer that comes back finds
// its own writes refused. fresh tells whether this pass's upkeep has read the runtime config; if
// not, it is read before anything is recovered, for the dispatch budget.
func (d *Drainer) recover(ctx context.Context, now time.Time, fresh bool, expired []store.Row) (int, error) {
	if len(expired) == 0 {
		return 0, nil
	}
	if !fresh {
		if err := d.refreshConfig(ctx); err != nil {
			return 0, err
		}
	}
	cfg := d.lastConfig()
	n := 0
	for _, r := range expired {
		var o store.Outcome
		switch {
		case r.Status == job.Claimed:
			o = store.Outcome{Status: job.Queued}
		case r.Status == job.Dispatched && !d.cfg.UnconfirmedStarts:
			o = store.Outcome{Status: job.Queued, CountFailure: true, Budget: cfg.DispatchAttempts,
				ErrorCode: "lease_expired", ErrorMessage: "the drainer's lease expired before the start was confirmed"}
		default:
			o = store.Outcome{Status: job.Lost, ErrorCode: "lease_expired",
				ErrorMessage: "the drainer's lease expired while the job was in flight"}
		}
		var to job.Status
		err := d.inTx(ctx, func(tx *sql.Tx) (err error) {
			to, err = d.store.Finish(ctx, tx, now, r, o)
			return err
		})
		switch {
		case errors.Is(err, store.ErrFenced):
			continue // someone else finished or recovered it first
		case err != nil:
			return n, err
		}
		d.store.Metrics.Finished(to, r.DispatchedAt, now)
		n++
	}
	if n > 0 {
		d.Wake()
	}
	return n, nil
}
