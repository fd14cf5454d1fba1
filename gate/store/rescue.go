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

// Heartbeat is one drainer's row in the drainers table, which status reads (SPEC §6).
type Heartbeat struct {
	DrainerID string
	Host      string
	PID       int
	Version   string // the build's
	// Now is the heartbeat's time: the last poll.
	Now time.Time
	// LastClaim is when the drainer last claimed jobs; zero if it never did.
	LastClaim    time.Time
	InFlight     int // jobs the drainer holds
	PollInterval time.Duration
}

// statement returns the upsert that writes hb. A drainer restarted under the same id (a fixed
// SLUICE_DRAINER_ID) is a new process: the row's start time follows the pid, and a clean stop
// recorded earlier is cleared.
func (hb *Heartbeat) statement() (string, []any) {
	var lastClaim any
	if !hb.LastClaim.IsZero() {
		lastClaim = hb.LastClaim
	}
	return `INSERT INTO drainers (id, host, pid, version, started_at, heartbeat_at,
		last_poll_at, last_claim_at, in_flight, poll_interval_ms)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE
		started_at = IF(pid = VALUES(pid) AND host = VALUES(host), started_at, VALUES(started_at)),
		host = VALUES(host), pid = VALUES(pid), version = VALUES(version),
		heartbeat_at = VALUES(heartbeat_at), last_poll_at = VALUES(last_poll_at),
		last_claim_at = VALUES(last_claim_at), in_flight = VALUES(in_flight),
		poll_interval_ms = VALUES(poll_interval_ms), stopped_at = NULL`,
		[]any{hb.DrainerID, hb.Host, hb.PID, hb.Version, hb.Now, hb.Now, hb.Now, lastClaim, hb.InFlight, hb.PollInterval.Milliseconds()}
}

// WriteHeartbeat writes hb in a statement of its own.
func WriteHeartbeat(ctx context.Context, db sqldb.DB, hb Heartbeat) error {
	q, args := hb.statement()
	if _, err := db.ExecContext(ctx, q, args...); err != nil {
		return fmt.Errorf("drainer heartbeat: %w", err)
	}
	return nil
}

// MarkStopped records a clean stop of drainerID, holding inFlight jobs, in its heartbeat row,
// so that status does not report a drainer that exited on purpose as stalled.
func MarkStopped(ctx context.Context, db sqldb.DB, drainerID string, inFlight int) error {
	if _, err := db.ExecContext(ctx, "UPDATE drainers SET stopped_at = UTC_TIMESTAMP(6), in_flight = ? WHERE id = ?",
		inFlight, drainerID); err != nil {
		return fmt.Errorf("record the drainer's stop: %w", err)
	}
	return nil
}
