// Package store is the fenced SQL of the job lifecycle (SPEC §4): reading job rows and every
// statement that moves a job between states after admission. Admission, the executor-facing
// API (start, complete, cancel) and the drainer all go through it, so that fencing lives in one
// place: every write names the version and the state(s) its writer expects, and a writer whose
// condition fails has lost the job and must stop touching it.
//
// It sits under gate because it is the gate's data layer: the drainer consumes it, never the
// reverse. It imports only the shared vocabulary (gate/job) and the outbox.
package store

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/outbox"
)

// Placeholders returns n comma-separated placeholders, for an IN list or a VALUES row.
func Placeholders(n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat("?,", n-1) + "?"
}

// HashNonce returns the SHA-256 of a nonce: only the hash is stored.
func HashNonce(nonce string) []byte {
	sum := sha256.Sum256([]byte(nonce))
	return sum[:]
}

// Store writes job transitions. Safe for concurrent use.
type Store struct {
	// Prefix is the NATS subject prefix of the pokes written with transitions. Default "sluice".
	Prefix string
	// Log receives one line per job transition (SPEC §10). Default: discard.
	Log *slog.Logger
	// Metrics are the process's job-lifecycle collectors, shared by every Store of the process.
	// The methods here do not count (their caller's transaction may yet roll back): callers
	// report what they wrote once it has committed. Default none: nothing is counted.
	Metrics *Metrics
}

func (s *Store) prefix() string {
	if s.Prefix == "" {
		return outbox.DefaultPrefix
	}
	return s.Prefix
}

// LogTransition writes the one structured line per job transition of SPEC §10.
func (s *Store) LogTransition(ctx context.Context, r Row, to job.Status, version int64, now time.Time, code string) {
	if s.Log == nil {
		return
	}
	attrs := []slog.Attr{
		slog.Int64("job_id", r.ID),
		slog.String("tenant", r.Tenant),
		slog.String("from", string(r.Status)),
		slog.String("to", string(to)),
		slog.Int64("version", version),
	}
	if r.DispatchedAt != nil {
		attrs = append(attrs, slog.Int64("waited_ms", r.DispatchedAt.Sub(r.QueuedAt).Milliseconds()))
		if to.Terminal() {
			attrs = append(attrs, slog.Int64("ran_ms", now.Sub(*r.DispatchedAt).Milliseconds()))
		}
	} else if to == job.Dispatched {
		attrs = append(attrs, slog.Int64("waited_ms", now.Sub(r.QueuedAt).Milliseconds()))
	}
	if code != "" {
		attrs = append(attrs, slog.String("error_code", code))
	}
	s.Log.LogAttrs(ctx, slog.LevelInfo, "job transition", attrs...)
}
