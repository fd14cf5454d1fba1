package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/gate/sqldb"
)

// ScanExpiredParams ask for the in-flight jobs whose lease ran out.
type ScanExpiredParams struct {
	// Now is the scan's time: a lease that ended before it has run out.
	Now time.Time
	// Heartbeat, if not nil, is written in the scan's round trip (an idle drainer's upkeep costs
	// one statement a second fewer than the two apart).
	Heartbeat *Heartbeat
}

// ScanExpiredWithSlots lists, in one round trip and without locking them, up to 100 in-flight
// jobs whose lease ran out before p.Now, the longest expired first, as LockColumns. Their
// recovery (Finish) is fenced on the version read here, so a drainer that comes back finds its
// own writes refused. With slots > 0 it also reads, in the same round trip (db must then take
// several statements: an OpenMulti pool), up to that many slots whose lease ran out (database
// clock), oldest first, for the upkeep's sweep (SweepSlots). The jobs are read by the claim
// index's in-flight range, every job in flight (the global cap bounds them), and sorted by lease:
// no index holds the leases since migration 0026, whose every renewal and transition moved it.
func ScanExpiredWithSlots(ctx context.Context, db sqldb.DB, p ScanExpiredParams, slots int) ([]Row, []ExpiredSlot, error) {
	q := "SELECT " + LockColumns + ` FROM jobs FORCE INDEX (claim)
		WHERE status IN ('claimed','dispatched','running') AND lease_until < ? ORDER BY lease_until LIMIT 100`
	args := []any{p.Now}
	if hb := p.Heartbeat; hb != nil {
		hq, hargs := hb.statement()
		q = hq + ";" + q
		args = append(hargs, p.Now)
	}
	if slots > 0 {
		q += ";" + expiredSlotsSQL
		args = append(args, slots)
	}
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("scan expired leases: %w", err)
	}
	var expired []Row
	var lost []ExpiredSlot
	res := ResultsOf(rows)
	err = res.EachRow(func(r Row) { expired = append(expired, r) })
	if err == nil && slots > 0 {
		var srows *sql.Rows
		if srows, err = res.Next(); err == nil {
			lost, err = scanExpiredSlots(srows)
		}
	}
	if err = errors.Join(err, res.Close()); err != nil {
		return nil, nil, fmt.Errorf("scan expired leases: %w", err)
	}
	return expired, lost, nil
}
