package store

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// AuditQueueConfig configures an AuditQueue. Field docs give the defaults.
type AuditQueueConfig struct {
	// DB is the sluice database. Required.
	DB *sql.DB
	// Size bounds the events waiting to be written; beyond it an event is dropped and counted.
	// Default 10,000: a few seconds of refusals at the admission rates of SPEC §14.
	Size int
	// Batch is the most events one flush writes, in one INSERT. Default 500.
	Batch int
	// Registerer, if set, gets sluice_audit_dropped_total.
	Registerer prometheus.Registerer
	// Log receives a line when a flush fails. Default: discard.
	Log *slog.Logger
}

// AuditQueue holds the audit events of decisions that write nothing else (SPEC §10: refusals
// such as rate_limited and capacity_exceeded, replays) and writes them in batches. Add never
// blocks: a full queue drops the event and counts it. A crash loses at most what the queue
// holds. Safe for concurrent use; a nil *AuditQueue drops everything silently.
type AuditQueue struct {
	cfg     AuditQueueConfig
	events  chan AuditEvent
	wake    chan struct{}
	dropped prometheus.Counter
	lost    atomic.Int64 // what dropped counts, for Dropped
}

// NewAuditQueue returns an AuditQueue, or an "invalid config" error naming the field.
func NewAuditQueue(cfg AuditQueueConfig) (*AuditQueue, error) {
	if cfg.DB == nil {
		return nil, errors.New("invalid config: DB: required")
	}
	if cfg.Size <= 0 {
		cfg.Size = 10000
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 500
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	q := &AuditQueue{cfg: cfg, events: make(chan AuditEvent, cfg.Size), wake: make(chan struct{}, 1),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_audit_dropped_total",
			Help: "Audit events of refusals dropped because the in-process audit queue was full or its write failed."})}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(q.dropped); err != nil {
			return nil, err
		}
	}
	return q, nil
}

// Add queues e without blocking, and reports whether it was queued.
func (q *AuditQueue) Add(e AuditEvent) bool {
	if q == nil {
		return false
	}
	select {
	case q.events <- e:
	default:
		q.drop(1)
		return false
	}
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return true
}

// Dropped returns how many events were dropped so far.
func (q *AuditQueue) Dropped() int64 { return q.lost.Load() }

func (q *AuditQueue) drop(n int) {
	q.dropped.Add(float64(n))
	q.lost.Add(int64(n))
}

// RunOnce writes up to Batch queued events in one INSERT and returns how many it took. Events
// whose write fails are dropped and counted: the queue is bounded, and a database that refuses
// them would refuse them again.
func (q *AuditQueue) RunOnce(ctx context.Context) (int, error) {
	var batch []AuditEvent
	for len(batch) < q.cfg.Batch {
		select {
		case e := <-q.events:
			batch = append(batch, e)
			continue
		default:
		}
		break
	}
	if err := InsertAudit(ctx, q.cfg.DB, batch); err != nil {
		q.drop(len(batch))
		return len(batch), err
	}
	return len(batch), nil
}

// Run flushes the queue whenever events arrive, until ctx is done; then it writes what is left.
// A flush takes at most stopFlush.
func (q *AuditQueue) Run(ctx context.Context) {
	// A flush under way finishes even when ctx ends meanwhile: the events it took are out of the
	// queue, and a cancelled write would drop them.
	flush := func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopFlush)
		defer cancel()
		for {
			n, err := q.RunOnce(ctx)
			if err != nil {
				q.cfg.Log.Warn("could not write audit events; dropped", "events", n, "error", err)
			}
			if n < q.cfg.Batch {
				return
			}
		}
	}
	for {
		select {
		case <-ctx.Done():
			flush(ctx)
			return
		case <-q.wake:
			flush(ctx)
		}
	}
}

// stopFlush bounds one flush, the last one of a stopping process included.
const stopFlush = 2 * time.Second
