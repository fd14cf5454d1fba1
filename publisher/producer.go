package publisher

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/outbox"
)

// ProducerConfig configures a Producer. Field docs give the defaults.
type ProducerConfig struct {
	// Prefix is the NATS subject prefix; it must match the relay's. Default "sluice".
	Prefix string
}

// Producer is the Go client for producers that share sluice's database and emit
// capacity-release events (SPEC §3): it writes the event's outbox row inside the producer's own
// transaction, so that the event commits or rolls back together with the producer's change. The
// relay publishes the row after that transaction commits; nothing is sent before. It needs only
// the outbox: recording a job's outcome in the same transaction is gate.Completer's job. Safe
// for concurrent use.
type Producer struct {
	prefix string
}

// NewProducer returns a Producer, or an "invalid config" error naming the field.
func NewProducer(cfg ProducerConfig) (*Producer, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = outbox.DefaultPrefix
	}
	if err := outbox.CheckPrefix(cfg.Prefix); err != nil {
		return nil, fmt.Errorf("invalid config: Prefix: %w", err)
	}
	return &Producer{prefix: cfg.Prefix}, nil
}

// Release writes a capacity-release event for tenant in tx (a sandbox stopped, a slot freed
// outside sluice) and returns its outbox row id. It changes no job: drainers woken by it read
// the truth from the database. Errors are *job.Error (invalid_request) for an invalid tenant or
// a wrapped database error.
func (p *Producer) Release(ctx context.Context, tx *sql.Tx, tenant string) (int64, error) {
	if err := job.ValidTenant("tenant", tenant); err != nil {
		return 0, err
	}
	if tx == nil {
		return 0, errors.New("publisher: a transaction is required")
	}
	now, err := clock.Read(ctx, tx)
	if err != nil {
		return 0, err
	}
	ids, err := outbox.Write(ctx, tx, now, outbox.PokeMessage(p.prefix, outbox.Release, tenant, 0))
	if err != nil {
		return 0, fmt.Errorf("release for tenant %q: %w", tenant, err)
	}
	return ids[0], nil
}
