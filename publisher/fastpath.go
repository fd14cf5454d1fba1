package publisher

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/outbox"
)

// FastPathConfig configures a FastPath. Field docs give the defaults.
type FastPathConfig struct {
	// DB is the sluice database. Required.
	DB *sql.DB
	// NC is the NATS connection. Required.
	NC *nats.Conn
	// JS publishes with acknowledgements; nil selects core-NATS mode.
	JS jetstream.JetStream
	// InstallID prefixes message ids. Required.
	InstallID string
	// Queue bounds the rows waiting to be published; rows submitted beyond it are left to the
	// relay. Default 8192.
	Queue int
	// AckTimeout bounds the wait for acknowledgements. Default 2 s.
	AckTimeout time.Duration
	// Clock stamps published_at. Default: the database's clock, followed by clock.Synced.
	Clock clock.Clock
	// Log receives problems. Default: discard.
	Log *slog.Logger
	// Metrics, if set, counts publications.
	Metrics *RelayMetrics
}

// FastPath publishes rows that the admitting process itself just committed, so that a drainer
// hears of a job in about a millisecond instead of at the relay's next pass. It is only a fast
// path: a row it cannot publish at once (broker down, queue full, process killed) stays
// unpublished for the relay. Submit never blocks.
type FastPath struct {
	cfg  FastPathConfig
	rows chan outbox.Row
}

// NewFastPath returns a FastPath, or an "invalid config" error naming the field.
func NewFastPath(cfg FastPathConfig) (*FastPath, error) {
	switch {
	case cfg.DB == nil:
		return nil, errors.New("invalid config: DB: required")
	case cfg.NC == nil:
		return nil, errors.New("invalid config: NC: required")
	case cfg.InstallID == "":
		return nil, errors.New("invalid config: InstallID: required")
	}
	if cfg.Queue <= 0 {
		cfg.Queue = 8192
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = 2 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.NewDBSynced(cfg.DB)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &FastPath{cfg: cfg, rows: make(chan outbox.Row, cfg.Queue)}, nil
}

// Submit hands committed rows to the fast path. It gives up at once (leaving the rows to the
// relay) when the broker is disconnected or the queue is full.
func (f *FastPath) Submit(rows []outbox.Row) {
	if !f.cfg.NC.IsConnected() {
		return
	}
	for _, r := range rows {
		select {
		case f.rows <- r:
		default:
			return
		}
	}
}

// Run publishes submitted rows until ctx is done, batching whatever has queued up meanwhile.
func (f *FastPath) Run(ctx context.Context) {
	batch := make([]outbox.Row, 0, 256)
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			return
		case r := <-f.rows:
			batch = append(batch, r)
		}
	fill:
		for len(batch) < cap(batch) {
			select {
			case r := <-f.rows:
				batch = append(batch, r)
			default:
				break fill
			}
		}
		f.publishBatch(ctx, batch)
	}
}

func (f *FastPath) publishBatch(ctx context.Context, batch []outbox.Row) {
	msgs := make([]outMsg, len(batch))
	for i, row := range batch {
		msgs[i] = relayMsg(f.cfg.InstallID, row)
	}
	// Refused rows are left to the relay, which sets them aside under its row locks.
	res := publish(ctx, f.cfg.NC, f.cfg.JS, msgs, f.cfg.AckTimeout)
	if res.err != nil {
		f.cfg.Log.Debug("fast path publish failed; the relay will publish", "error", res.err)
	}
	if len(res.acked) == 0 {
		return
	}
	if f.cfg.Metrics != nil {
		f.cfg.Metrics.Published.Add(float64(len(res.acked)))
	}
	now, err := f.cfg.Clock.Now(ctx)
	if err == nil {
		err = outbox.MarkPublished(ctx, f.cfg.DB, now, res.acked)
	}
	if err != nil {
		// The rows were published but not marked: the relay publishes them again with the same
		// message ids, which the broker drops as duplicates.
		f.cfg.Log.Debug("fast path could not mark rows published", "error", err)
	}
}
