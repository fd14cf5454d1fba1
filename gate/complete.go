package gate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/outbox"
)

// CompleterConfig configures a Completer. Field docs give the defaults.
type CompleterConfig struct {
	// Prefix is the NATS subject prefix of the release poke; it must match the relay's. Default
	// "sluice".
	Prefix string
	// Log receives one line per job transition (SPEC §10). Default: discard.
	Log *slog.Logger
}

// Completer is the Go twin of POST /v1/jobs/{id}/complete for producers that share sluice's
// database (an executor that records outcomes itself): it writes a job's completion inside the
// producer's own transaction, so that the outcome commits or rolls back together with the
// producer's change (SPEC §3). Its release poke is published by the relay after that
// transaction commits; nothing is sent before. It lives in gate, beside the API's /complete,
// because it moves a job through gate/store; publisher.Producer writes the plain
// capacity-release events. Safe for concurrent use.
type Completer struct {
	store *store.Store
}

// NewCompleter returns a Completer, or an "invalid config" error naming the field.
func NewCompleter(cfg CompleterConfig) (*Completer, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = outbox.DefaultPrefix
	}
	if err := outbox.CheckPrefix(cfg.Prefix); err != nil {
		return nil, fmt.Errorf("invalid config: Prefix: %w", err)
	}
	return &Completer{store: &store.Store{Prefix: cfg.Prefix, Log: cfg.Log}}, nil
}

// Completion is an executor's report of a job's outcome: Nonce is the nonce of the dispatch,
// Status succeeded, failed or not_started (a start never confirmed: the job is queued again).
type Completion = store.Completion

// Complete records the outcome of job id in tx, exactly as POST /v1/jobs/{id}/complete does: the
// terminal state (fenced on the dispatch's nonce) and a release poke, both in tx. It returns the
// job as tx now sees it. Errors are *job.Error with the API's codes (nonce_invalid,
// dispatch_void, outcome_conflict, invalid_request), store.ErrNotFound, or a wrapped database
// error; on any error the caller should roll tx back. It blocks on the job's row lock.
//
// Unlike the API's /complete, it counts nothing in sluice_jobs_finished_total or
// sluice_execution_seconds: only the caller knows whether tx commits, and the producer's process
// exports no sluice metrics.
func (c *Completer) Complete(ctx context.Context, tx *sql.Tx, id int64, comp Completion) (job.Job, error) {
	if tx == nil {
		return job.Job{}, errors.New("gate: a transaction is required")
	}
	now, err := clock.Read(ctx, tx)
	if err != nil {
		return job.Job{}, err
	}
	row, _, err := c.store.Complete(ctx, tx, now, id, comp)
	if err != nil {
		return row.Job, err
	}
	return row.Job, nil
}
