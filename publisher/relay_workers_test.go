package publisher_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/integration/publishertest"
	"github.com/sluicehq/sluice/integration/wait"
	"github.com/sluicehq/sluice/outbox"
	"github.com/sluicehq/sluice/publisher"
)

// TestRelayWorkersPublishEachRowOnce: a relay with several workers in flight publishes a
// backlog with every row acknowledged exactly once (two workers never take the same rows) and
// every message on the stream once.
func TestRelayWorkersPublishEachRowOnce(t *testing.T) {
	t.Parallel()
	const rows = 10000
	ns := natstest.Start(t)
	e := publishertest.NewEnv(t, ns.URL(), 1)
	ids := publishertest.InsertRows(t, e.DB, rows)
	reg := publishertest.NewRegistryMetrics()
	r := e.Relay(t, publisher.RelayConfig{Workers: 4, Batch: 500, Metrics: reg.Metrics})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx)
	}()
	wait.For(t, 60*time.Second, "the backlog to be marked published", func() (bool, error) {
		return publishertest.CountOutbox(t, e.DB, "published_at = "+outbox.Unpublished) == 0, nil
	})
	cancel()
	<-done
	if n := reg.Counter(t, "sluice_relay_published_total", ""); n != rows {
		t.Fatalf("%v publications acknowledged for %d rows: some row was published twice", n, rows)
	}
	publishertest.AssertExactlyOnce(t, e.InstallID, ids, publishertest.ConsumeAll(t, e.JS))
}
