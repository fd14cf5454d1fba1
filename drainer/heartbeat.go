package drainer

import (
	"context"
	"fmt"
	"time"
)

// heartbeat writes this drainer's row in the drainers table: when it last polled and claimed,
// and how many jobs it holds, at most twice a poll period. The pass calls due (when the
// heartbeat rides in the rescuer's round trip), RunOnce (when it does not), and claimed; nothing
// else does, so its state needs no lock. Stop calls markStopped once the passes are over.
type heartbeat struct {
	cfg    *Config
	leases *leaseKeeper // the jobs held, for in_flight
	host   string       // read once, not on every beat
	pid    int

	lastBeat  time.Time
	lastClaim time.Time
}

// heartbeatSQL is the statement that writes this drainer's heartbeat row.
type heartbeatSQL struct {
	query string
	args  []any
}

// claimed notes that a pass claimed jobs at now.
func (h *heartbeat) claimed(now time.Time) { h.lastClaim = now }

// due returns the heartbeat to write if one is due (at most two a poll period), and records it
// as written.
func (h *heartbeat) due(now time.Time) *heartbeatSQL {
	if now.Sub(h.lastBeat) < h.cfg.PollInterval/2 && !now.Before(h.lastBeat) {
		return nil
	}
	h.lastBeat = now
	var lastClaim any
	if !h.lastClaim.IsZero() {
		lastClaim = h.lastClaim
	}
	// A drainer restarted under the same id (a fixed SLUICE_DRAINER_ID) is a new process: the
	// row's start time follows the pid, and a clean stop recorded earlier is cleared.
	return &heartbeatSQL{query: `INSERT INTO drainers (id, host, pid, version, started_at, heartbeat_at,
		last_poll_at, last_claim_at, in_flight, poll_interval_ms)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE
		started_at = IF(pid = VALUES(pid) AND host = VALUES(host), started_at, VALUES(started_at)),
		host = VALUES(host), pid = VALUES(pid), version = VALUES(version),
		heartbeat_at = VALUES(heartbeat_at), last_poll_at = VALUES(last_poll_at),
		last_claim_at = VALUES(last_claim_at), in_flight = VALUES(in_flight),
		poll_interval_ms = VALUES(poll_interval_ms), stopped_at = NULL`,
		args: []any{h.cfg.ID, h.host, h.pid, h.cfg.BuildVersion, now, now, now, lastClaim, h.leases.count(), h.cfg.PollInterval.Milliseconds()}}
}

// RunOnce writes the heartbeat if one is due.
func (h *heartbeat) RunOnce(ctx context.Context, now time.Time) error {
	hb := h.due(now)
	if hb == nil {
		return nil
	}
	if _, err := h.cfg.DB.ExecContext(ctx, hb.query, hb.args...); err != nil {
		return fmt.Errorf("drainer heartbeat: %w", err)
	}
	return nil
}

// markStopped records a clean stop in the heartbeat row, so that status does not report a
// drainer that exited on purpose as stalled. Best effort: a drainer killed instead is judged by
// its heartbeat's age.
func (h *heartbeat) markStopped() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := h.cfg.DB.ExecContext(ctx, "UPDATE drainers SET stopped_at = UTC_TIMESTAMP(6), in_flight = ? WHERE id = ?",
		h.leases.count(), h.cfg.ID); err != nil {
		h.cfg.Log.Warn("could not record the drainer's stop", "error", err)
	}
}
