package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/gate/sqldb"
)

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

// DrainerBeat is a drainer's heartbeat row as status reads it.
type DrainerBeat struct {
	ID           string
	Host         string
	PID          int
	Version      string
	StartedAt    time.Time
	HeartbeatAt  time.Time
	LastClaim    *time.Time // nil if it never claimed
	InFlight     int
	PollInterval time.Duration // 0 when the row does not say
}

// ReadDrainers returns the heartbeat rows of the drainers not stopped that beat after since, by
// id.
func ReadDrainers(ctx context.Context, db sqldb.DB, since time.Time) ([]DrainerBeat, error) {
	rows, err := db.QueryContext(ctx, `SELECT id, host, pid, version, heartbeat_at, last_claim_at,
		in_flight, poll_interval_ms, started_at FROM drainers
		WHERE stopped_at IS NULL AND heartbeat_at > ? ORDER BY id`, since)
	if err != nil {
		return nil, fmt.Errorf("drainers: %w", err)
	}
	defer rows.Close()
	var out []DrainerBeat
	for rows.Next() {
		var b DrainerBeat
		var lastClaim sql.NullTime
		var pollMS int64
		if err := rows.Scan(&b.ID, &b.Host, &b.PID, &b.Version, &b.HeartbeatAt, &lastClaim,
			&b.InFlight, &pollMS, &b.StartedAt); err != nil {
			return nil, fmt.Errorf("drainers: %w", err)
		}
		b.LastClaim, b.PollInterval = timePtr(lastClaim), time.Duration(pollMS)*time.Millisecond
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("drainers: %w", err)
	}
	return out, nil
}
