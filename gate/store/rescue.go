package store

import (
	"context"
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

// ScanExpired lists, in one round trip and without locking them, up to 100 in-flight jobs
// whose lease ran out before p.Now, the longest expired first, as LockColumns. Their recovery
// (Finish) is fenced on the version read here, so a drainer that comes back finds its own
// writes refused.
func ScanExpired(ctx context.Context, db sqldb.DB, p ScanExpiredParams) ([]Row, error) {
	q := "SELECT " + LockColumns + ` FROM jobs
		WHERE status IN ('claimed','dispatched','running') AND lease_until < ? ORDER BY lease_until LIMIT 100`
	args := []any{p.Now}
	if hb := p.Heartbeat; hb != nil {
		hq, hargs := hb.statement()
		q = hq + ";" + q
		args = append(hargs, p.Now)
	}
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("scan expired leases: %w", err)
	}
	var expired []Row
	res := ResultsOf(rows)
	err = res.EachRow(func(r Row) { expired = append(expired, r) })
	if err = errors.Join(err, res.Close()); err != nil {
		return nil, fmt.Errorf("scan expired leases: %w", err)
	}
	return expired, nil
}
