package publisher

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/outbox"
)

// ReplayConfig configures Replay. Field docs give the defaults.
type ReplayConfig struct {
	// DB is the sluice database. Required.
	DB *sql.DB
	// NC is the NATS connection. Required unless DryRun.
	NC *nats.Conn
	// JS publishes with acknowledgements; nil selects core-NATS mode.
	JS jetstream.JetStream
	// InstallID prefixes message ids. Required.
	InstallID string
	// Selection names the published rows to replay.
	Selection outbox.Selection
	// DryRun counts what would be replayed and publishes nothing.
	DryRun bool
	// Batch is the number of rows read and published at a time. Default 500.
	Batch int
	// AckTimeout bounds the wait for a batch's acknowledgements. Default 5 s.
	AckTimeout time.Duration
	// RetryFor bounds how long a batch is retried (with backoff, same message ids) before the
	// replay stops with an error. Default 1 minute.
	RetryFor time.Duration
	// Progress, if set, is called after every batch.
	Progress func(ReplayProgress)
	// Clock stamps the replay record. Default: the database's clock.
	Clock clock.Clock
}

// ReplayProgress is where a replay stands.
type ReplayProgress struct {
	// Replay is n in the replayed message ids (<installation id>-<row id>-r<n>); 0 in a dry run.
	Replay int64
	// Selected is the number of rows the selection held when the replay began.
	Selected int64
	// Published counts rows published (acknowledged) so far; in a dry run, rows read.
	Published int64
	// Refused counts rows the broker refused permanently (they are skipped).
	Refused int64
	// FirstID and LastID are the lowest and highest row ids handled so far.
	FirstID, LastID int64
}

// Replay republishes already-published outbox rows for consumers that lost state (SPEC §7): in
// id order, each with a new message id <installation id>-<row id>-r<n> (n is this replay's
// number, from outbox_replays) and a Sluice-Replay-Of header naming the original, so that the
// broker's duplicate window does not swallow it. Rows not yet published are left to the relay,
// which publishes them under their original ids. It blocks until done, ctx ends, or a batch
// could not be published within RetryFor.
func Replay(ctx context.Context, cfg ReplayConfig) (ReplayProgress, error) {
	var p ReplayProgress
	switch {
	case cfg.DB == nil:
		return p, errors.New("invalid config: DB: required")
	case cfg.NC == nil && !cfg.DryRun:
		return p, errors.New("invalid config: NC: required")
	case cfg.InstallID == "":
		return p, errors.New("invalid config: InstallID: required")
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 500
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = 5 * time.Second
	}
	if cfg.RetryFor <= 0 {
		cfg.RetryFor = time.Minute
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.DB{DB: cfg.DB}
	}
	var err error
	if p.Selected, err = outbox.CountPublished(ctx, cfg.DB, cfg.Selection); err != nil {
		return p, err
	}
	if !cfg.DryRun {
		now, err := cfg.Clock.Now(ctx)
		if err != nil {
			return p, err
		}
		res, err := cfg.DB.ExecContext(ctx, "INSERT INTO outbox_replays (started_at, from_id, since) VALUES (?, ?, ?)",
			now, cfg.Selection.FromID, cfg.Selection.Since)
		if err != nil {
			return p, fmt.Errorf("replay: record: %w", err)
		}
		if p.Replay, err = res.LastInsertId(); err != nil {
			return p, fmt.Errorf("replay: record: %w", err)
		}
	}
	after := int64(0)
	for {
		rows, err := outbox.ReadPublished(ctx, cfg.DB, cfg.Selection, after, cfg.Batch)
		if err != nil {
			return p, err
		}
		if len(rows) == 0 {
			break
		}
		if p.FirstID == 0 {
			p.FirstID = rows[0].ID
		}
		after = rows[len(rows)-1].ID
		if cfg.DryRun {
			p.Published += int64(len(rows))
		} else if err := replayBatch(ctx, cfg, &p, rows); err != nil {
			return p, err
		}
		p.LastID = after
		if cfg.Progress != nil {
			cfg.Progress(p)
		}
	}
	if !cfg.DryRun {
		now, err := cfg.Clock.Now(ctx)
		if err == nil {
			_, err = cfg.DB.ExecContext(ctx, "UPDATE outbox_replays SET finished_at = ?, published = ? WHERE id = ?",
				now, p.Published, p.Replay)
		}
		if err != nil {
			return p, fmt.Errorf("replay: record the end: %w", err)
		}
	}
	return p, nil
}

// replayBatch publishes rows until each is acknowledged or refused, retrying the rest with the
// same message ids (so a retry inside the duplicate window cannot duplicate) under backoff.
func replayBatch(ctx context.Context, cfg ReplayConfig, p *ReplayProgress, rows []outbox.Row) error {
	todo := make([]outMsg, len(rows))
	for i, row := range rows {
		todo[i] = replayMsg(cfg.InstallID, p.Replay, row)
	}
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 100 * time.Millisecond
	bo.MaxInterval = 5 * time.Second
	bo.MaxElapsedTime = cfg.RetryFor
	return backoff.Retry(func() error {
		res := publish(ctx, cfg.NC, cfg.JS, todo, cfg.AckTimeout)
		p.Published += int64(len(res.acked))
		p.Refused += int64(len(res.refused))
		done := make(map[int64]bool, len(res.acked)+len(res.refused))
		for _, id := range res.acked {
			done[id] = true
		}
		for _, r := range res.refused {
			done[r.ID] = true
		}
		rest := todo[:0]
		for _, m := range todo {
			if !done[m.id] {
				rest = append(rest, m)
			}
		}
		todo = rest
		switch {
		case ctx.Err() != nil:
			return backoff.Permanent(ctx.Err())
		case len(todo) == 0:
			return nil
		case res.err != nil:
			return fmt.Errorf("replay %d: %w", p.Replay, res.err)
		default:
			return fmt.Errorf("replay %d: %d rows unacknowledged", p.Replay, len(todo))
		}
	}, backoff.WithContext(bo, ctx))
}
