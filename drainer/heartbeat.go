package drainer

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/gate/store"
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

// claimed notes that a pass claimed jobs at now.
func (h *heartbeat) claimed(now time.Time) { h.lastClaim = now }

// due returns the heartbeat to write if one is due (at most two a poll period), and records it
// as written.
func (h *heartbeat) due(now time.Time) *store.Heartbeat {
	if now.Sub(h.lastBeat) < h.cfg.PollInterval/2 && !now.Before(h.lastBeat) {
		return nil
	}
	h.lastBeat = now
	return &store.Heartbeat{DrainerID: h.cfg.ID, Host: h.host, PID: h.pid, Version: h.cfg.BuildVersion, Now: now,
		LastClaim: h.lastClaim, InFlight: h.leases.count(), PollInterval: h.cfg.PollInterval}
}

// RunOnce writes the heartbeat if one is due.
func (h *heartbeat) RunOnce(ctx context.Context, now time.Time) error {
	hb := h.due(now)
	if hb == nil {
		return nil
	}
	return store.WriteHeartbeat(ctx, h.cfg.DB, *hb)
}

// markStopped records a clean stop in the heartbeat row, so that status does not report a
// drainer that exited on purpose as stalled. Best effort: a drainer killed instead is judged by
// its heartbeat's age.
func (h *heartbeat) markStopped() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := store.MarkStopped(ctx, h.cfg.DB, h.cfg.ID, h.leases.count()); err != nil {
		h.cfg.Log.Warn("could not record the drainer's stop", "error", err)
	}
}
