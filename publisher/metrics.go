package publisher

import (
	"context"
	"database/sql"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/outbox"
)

// OutboxCollector exports the outbox backlog, read from the database at scrape time so that it
// is right whichever process relays: sluice_outbox_unpublished,
// sluice_outbox_oldest_unpublished_age_seconds and sluice_outbox_set_aside. A scrape that cannot
// read the database within 2 s exports nothing rather than stale figures.
type OutboxCollector struct {
	db          *sql.DB
	clock       clock.Clock
	log         *slog.Logger
	unpublished *prometheus.Desc
	oldestAge   *prometheus.Desc
	setAside    *prometheus.Desc
}

// NewOutboxCollector returns a collector reading db; register it on the process's registry.
// clk defaults to the database's clock and log to discard.
func NewOutboxCollector(db *sql.DB, clk clock.Clock, log *slog.Logger) *OutboxCollector {
	if clk == nil {
		clk = clock.DB{DB: db}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &OutboxCollector{
		db: db, clock: clk, log: log,
		unpublished: prometheus.NewDesc("sluice_outbox_unpublished", "Outbox rows committed but not yet published.", nil, nil),
		oldestAge: prometheus.NewDesc("sluice_outbox_oldest_unpublished_age_seconds",
			"Age of the oldest unpublished outbox row (0 when none).", nil, nil),
		setAside: prometheus.NewDesc("sluice_outbox_set_aside",
			"Outbox rows the broker refused permanently, kept in outbox_failed.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *OutboxCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.unpublished
	ch <- c.oldestAge
	ch <- c.setAside
}

// Collect implements prometheus.Collector.
func (c *OutboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	now, err := c.clock.Now(ctx)
	if err != nil {
		c.log.Debug("outbox metrics: no clock", "error", err)
		return
	}
	st, err := outbox.ReadStats(ctx, c.db, now)
	if err != nil {
		c.log.Debug("outbox metrics: no stats", "error", err)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.unpublished, prometheus.GaugeValue, float64(st.Unpublished))
	ch <- prometheus.MustNewConstMetric(c.oldestAge, prometheus.GaugeValue, st.OldestAgeSeconds)
	var n int64
	if err := c.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox_failed").Scan(&n); err == nil {
		ch <- prometheus.MustNewConstMetric(c.setAside, prometheus.GaugeValue, float64(n))
	}
}
