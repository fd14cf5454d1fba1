package publisher

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/outbox"
)

// RelayConfig configures a Relay. Field docs give the defaults.
type RelayConfig struct {
	// DB is the sluice database. Required.
	DB *sql.DB
	// NC is the NATS connection. Required.
	NC *nats.Conn
	// JS publishes with acknowledgements. Nil selects core-NATS mode: a row counts as published
	// once the client's flush succeeds (SPEC §7).
	JS jetstream.JetStream
	// InstallID prefixes message ids. Required.
	InstallID string
	// Batch bounds the rows published per pass. Default 2000: marking rows published is the
	// relay's main cost and is cheaper per row in larger statements (BenchmarkRelayBacklog);
	// keep Workers × Batch below the JetStream context's async max pending (8192 in sluice).
	Batch int
	// Workers is how many batches Run keeps in flight at once, so that one batch's rows are
	// claimed and marked in the database while another's messages are being acknowledged; SKIP
	// LOCKED gives each its own rows. Default 2. Messages of different batches may then reach
	// the stream out of id order, which no consumer may rely on anyway (commits are not in id
	// order either).
	Workers int
	// AckTimeout bounds the wait for a batch's acknowledgements. Default 5 s.
	AckTimeout time.Duration
	// Interval is the idle poll period of Run. Default 500 ms.
	Interval time.Duration
	// Clock stamps published_at. Default: the database's clock, followed by clock.Synced.
	Clock clock.Clock
	// Log receives problems. Default: discard.
	Log *slog.Logger
	// MaxBackoff caps the wait between failed passes. Default 5 s: an outage is noticed within
	// it, and a reconnection ends the wait at once anyway.
	MaxBackoff time.Duration
	// Metrics, if set, counts publications.
	Metrics *RelayMetrics
	// AfterPublish, if set, is called after a batch's acknowledgements and before their marks
	// commit, with the acknowledged ids. A test signal (tests kill the relay there); nil in
	// production.
	AfterPublish func(acked []int64)
}

// RelayMetrics are the relay's collectors.
type RelayMetrics struct {
	Published prometheus.Counter
	Errors    *prometheus.CounterVec
}

// NewRelayMetrics creates and registers the relay's collectors on reg.
func NewRelayMetrics(reg prometheus.Registerer) *RelayMetrics {
	m := &RelayMetrics{
		Published: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_relay_published_total",
			Help: "Outbox rows published and acknowledged."}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_relay_publish_errors_total",
			Help: "Failed publications, by kind."}, []string{"kind"}),
	}
	reg.MustRegister(m.Published, m.Errors)
	return m
}

// Relay publishes committed outbox rows. Safe for concurrent use; several relays (in one or many
// processes) may run at once.
type Relay struct {
	cfg RelayConfig
}

// NewRelay returns a Relay, or an "invalid config" error naming the field.
func NewRelay(cfg RelayConfig) (*Relay, error) {
	switch {
	case cfg.DB == nil:
		return nil, errors.New("invalid config: DB: required")
	case cfg.NC == nil:
		return nil, errors.New("invalid config: NC: required")
	case cfg.InstallID == "":
		return nil, errors.New("invalid config: InstallID: required")
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 2000
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 2
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = 5 * time.Second
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 500 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.NewDBSynced(cfg.DB)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Relay{cfg: cfg}, nil
}

// RunOnce publishes one batch of unpublished rows and returns how many were acknowledged. The
// batch's rows stay locked (SKIP LOCKED for other relays) until their marks commit, so a row is
// published twice only if this process dies between the acknowledgement and the commit; the
// broker's duplicate window absorbs that. Rows the broker refuses permanently are set aside in
// the same transaction and counted. With the broker disconnected it returns at once, touching
// neither the database nor the broker.
func (r *Relay) RunOnce(ctx context.Context) (int, error) {
	if !r.cfg.NC.IsConnected() {
		r.countError(errBrokerDown)
		return 0, errBrokerDown
	}
	tx, err := r.cfg.DB.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("relay: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	rows, err := outbox.ClaimUnpublished(ctx, tx, r.cfg.Batch)
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	msgs := make([]outMsg, len(rows))
	for i, row := range rows {
		msgs[i] = relayMsg(r.cfg.InstallID, row)
	}
	res := publish(ctx, r.cfg.NC, r.cfg.JS, msgs, r.cfg.AckTimeout)
	if r.cfg.AfterPublish != nil {
		r.cfg.AfterPublish(res.acked)
	}
	now, err := r.cfg.Clock.Now(ctx)
	if err != nil {
		return 0, err
	}
	if err := outbox.MarkPublished(ctx, tx, now, res.acked); err != nil {
		return 0, err
	}
	if err := outbox.SetAside(ctx, tx, now, res.refused); err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("relay: commit marks: %w", err)
	}
	for _, ref := range res.refused {
		r.cfg.Log.Error("relay: the broker refused an outbox row permanently; set aside in outbox_failed",
			"outbox_id", ref.ID, "error", ref.Err)
	}
	if r.cfg.Metrics != nil {
		r.cfg.Metrics.Published.Add(float64(len(res.acked)))
		if len(res.refused) > 0 {
			r.cfg.Metrics.Errors.WithLabelValues("refused").Add(float64(len(res.refused)))
		}
	}
	if res.err != nil {
		r.countError(res.err)
		return len(res.acked), res.err
	}
	return len(res.acked), nil
}

func (r *Relay) countError(err error) {
	if r.cfg.Metrics != nil {
		r.cfg.Metrics.Errors.WithLabelValues(errorKind(err)).Inc()
	}
}

var errBrokerDown = errors.New("relay: broker not connected")

// Run publishes until ctx is done, with Workers batches in flight. In each worker a full batch
// is followed at once by the next, an idle worker looks again every Interval or when woken, and
// failures back off exponentially (capped at MaxBackoff, with jitter) so that a broker outage
// costs no busy loop. When the connection comes back the backoff is reset and the backlog
// published at once, instead of at the next backoff tick.
func (r *Relay) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for range r.cfg.Workers - 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.loop(ctx)
		}()
	}
	r.loop(ctx)
	wg.Wait()
}

// loop is one of Run's workers.
func (r *Relay) loop(ctx context.Context) {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 100 * time.Millisecond
	bo.MaxInterval = r.cfg.MaxBackoff
	bo.MaxElapsedTime = 0
	reconnected := r.cfg.NC.StatusChanged(nats.CONNECTED)
	defer r.cfg.NC.RemoveStatusListener(reconnected)
	t := time.NewTimer(0)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case _, ok := <-reconnected:
			if !ok {
				reconnected = nil // closed with the connection: nothing more will come
			}
			bo.Reset()
		}
		n, err := r.RunOnce(ctx)
		var wait time.Duration
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			if !failing {
				r.cfg.Log.Warn("relay: publishing failed; backing off", "error", err)
			}
			failing = true
			wait = bo.NextBackOff()
		default:
			if failing {
				r.cfg.Log.Info("relay: publishing again")
			}
			failing = false
			bo.Reset()
			if n < r.cfg.Batch {
				wait = r.cfg.Interval
			}
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(wait)
	}
}
