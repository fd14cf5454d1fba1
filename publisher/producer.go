package publisher

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/outbox"
)

// ProducerConfig configures a Producer. Field docs give the defaults.
type ProducerConfig struct {
	// Prefix is the NATS subject prefix; it must match the relay's. Default "sluice".
	Prefix string
	// Log receives one line per job transition (SPEC §10). Default: discard.
	Log *slog.Logger
}

// Producer is the Go API for producers that share sluice's database: it writes a job's
// completion or a capacity-release event inside the producer's own transaction, so that the
// event commits or rolls back together with the producer's change (SPEC §3). Its rows are
// published by the relay after that transaction commits; nothing is sent before. Safe for
// concurrent use.
type Producer struct {
	store *store.Store
}

// NewProducer returns a Producer, or an "invalid config" error naming the field.
func NewProducer(cfg ProducerConfig) (*Producer, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = outbox.DefaultPrefix
	}
	if strings.ContainsAny(cfg.Prefix, " *>\t\r\n") || strings.HasPrefix(cfg.Prefix, ".") || strings.HasSuffix(cfg.Prefix, ".") {
		return nil, fmt.Errorf("invalid config: Prefix: %q is not a valid subject prefix", cfg.Prefix)
	}
	return &Producer{store: &store.Store{Prefix: cfg.Prefix, Log: cfg.Log}}, nil
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
func (p *Producer) Complete(ctx context.Context, tx *sql.Tx, id int64, c Completion) (job.Job, error) {
	now, err := txNow(ctx, tx)
	if err != nil {
		return job.Job{}, err
	}
	row, _, err := p.store.Complete(ctx, tx, now, id, c)
	if err != nil {
		return row.Job, err
	}
	return row.Job, nil
}

// Release writes a capacity-release event for tenant in tx (a sandbox stopped, a slot freed
// outside sluice) and returns its outbox row id. It changes no job: drainers woken by it read
// the truth from the database. Errors are *job.Error (invalid_request) for an invalid tenant or
// a wrapped database error.
func (p *Producer) Release(ctx context.Context, tx *sql.Tx, tenant string) (int64, error) {
	if err := gate.ValidTenant("tenant", tenant); err != nil {
		return 0, err
	}
	now, err := txNow(ctx, tx)
	if err != nil {
		return 0, err
	}
	return p.store.Release(ctx, tx, now, tenant)
}

// txNow reads the database clock inside tx: one timestamp per transaction, the database's, as
// every other writer uses (leases and TTLs are judged by it).
func txNow(ctx context.Context, tx *sql.Tx) (time.Time, error) {
	if tx == nil {
		return time.Time{}, errors.New("publisher: a transaction is required")
	}
	var t time.Time
	if err := tx.QueryRowContext(ctx, "SELECT UTC_TIMESTAMP(6)").Scan(&t); err != nil {
		return time.Time{}, fmt.Errorf("read database clock: %w", err)
	}
	return t.UTC(), nil
}
