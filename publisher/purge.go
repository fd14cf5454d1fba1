package publisher

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"time"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/outbox"
)

// PurgerConfig configures a Purger. Field docs give the defaults.
type PurgerConfig struct {
	// DB is the sluice database. Required.
	DB *sql.DB
	// Retention returns how long published rows are kept: the replay horizon of
	// `sluice outbox replay` (runtime config outbox_retention_days). Required.
	Retention func() time.Duration
	// Batch is the number of rows one DELETE removes: small, so that no statement holds its locks
	// for long or produces a large undo log. Default 1000.
	Batch int
	// MaxBatches bounds the batches of one pass, so that a pass after a long pause still ends
	// soon; the next pass goes on. Default 100.
	MaxBatches int
	// Interval is the period of Run. Default 1 minute.
	Interval time.Duration
	// Clock decides the cutoff. Default: the database's clock.
	Clock clock.Clock
	// Log receives problems. Default: discard.
	Log *slog.Logger
	// Purge deletes up to limit rows older than cutoff and returns how many it deleted. Default:
	// published outbox rows (outbox.PurgePublished). The app also purges finished jobs with it
	// (store.PurgeSettled, runtime config retention_days).
	Purge func(ctx context.Context, db *sql.DB, cutoff time.Time, limit int) (int64, error)
	// Rows names what Purge deletes, for the log. Default "published outbox rows".
	Rows string
}

// Purger deletes rows older than a retention, in small batches: by default published outbox
// rows (unpublished and set-aside rows are never purged). Several purgers may run at once (each
// DELETE takes whatever rows are left).
type Purger struct {
	cfg PurgerConfig
}

// NewPurger returns a Purger, or an "invalid config" error naming the field.
func NewPurger(cfg PurgerConfig) (*Purger, error) {
	switch {
	case cfg.DB == nil:
		return nil, errors.New("invalid config: DB: required")
	case cfg.Retention == nil:
		return nil, errors.New("invalid config: Retention: required")
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 1000
	}
	if cfg.MaxBatches <= 0 {
		cfg.MaxBatches = 100
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Minute
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.DB{DB: cfg.DB}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Purge == nil {
		cfg.Purge = func(ctx context.Context, db *sql.DB, cutoff time.Time, limit int) (int64, error) {
			return outbox.PurgePublished(ctx, db, cutoff, limit)
		}
	}
	if cfg.Rows == "" {
		cfg.Rows = "published outbox rows"
	}
	return &Purger{cfg: cfg}, nil
}

// RunOnce deletes rows older than now minus the retention, batch by batch, until a batch
// comes back short or MaxBatches ran, and returns how many rows it deleted. A retention of zero
// or less purges nothing.
func (p *Purger) RunOnce(ctx context.Context) (int64, error) {
	keep := p.cfg.Retention()
	if keep <= 0 {
		return 0, nil
	}
	now, err := p.cfg.Clock.Now(ctx)
	if err != nil {
		return 0, err
	}
	cutoff := now.Add(-keep)
	var total int64
	for i := 0; i < p.cfg.MaxBatches; i++ {
		n, err := p.cfg.Purge(ctx, p.cfg.DB, cutoff, p.cfg.Batch)
		total += n
		if err != nil {
			return total, err
		}
		if n < int64(p.cfg.Batch) {
			break
		}
	}
	return total, nil
}

// Run purges every Interval until ctx is done.
func (p *Purger) Run(ctx context.Context) {
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		n, err := p.RunOnce(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			p.cfg.Log.Warn("purge failed; trying again next period", "what", p.cfg.Rows, "error", err)
		case n > 0:
			p.cfg.Log.Info("purged "+p.cfg.Rows, "rows", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
