package integration_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/integration/publishertest"
	"github.com/sluicehq/sluice/outbox"
	"github.com/sluicehq/sluice/publisher"
)

// BenchmarkRelayBacklog measures SPEC §14's relay target: a 100,000-row outbox backlog (as left
// by an outage) published within 5 s. Beside it, the raw limit measured in the same run: the same
// number of messages of the same size published asynchronously with JetStream and acknowledged,
// with no database at all.
func BenchmarkRelayBacklog(b *testing.B) {
	const rows = 100000
	for _, batch := range []int{1000, 2000} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				ns := natstest.Start(b)
				e := publishertest.NewEnv(b, ns.URL(), 1)
				publishertest.InsertRows(b, e.DB, rows)
				payload := outbox.PokeMessage("sluice", outbox.Enqueue, "tenant-1", 12345).Payload

				raw := rawPublish(b, e.JS, rows, payload)

				reg := publishertest.NewRegistryMetrics()
				r := e.Relay(b, publisher.RelayConfig{Batch: batch, Metrics: reg.Metrics})
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				start := time.Now()
				go func() {
					defer close(done)
					r.Run(ctx)
				}()
				harness.WaitFor(b, 60*time.Second, "the backlog to be published", func() (bool, error) {
					return reg.Counter(b, "sluice_relay_published_total", "") >= rows, nil
				})
				took := time.Since(start)
				cancel()
				<-done
				if left := publishertest.CountOutbox(b, e.DB, "published_at = "+outbox.Unpublished); left != 0 {
					b.Fatalf("%d rows left unpublished", left)
				}
				rate := rows / took.Seconds()
				rawRate := rows / raw.Seconds()
				harness.Emit("relay_backlog", map[string]any{
					"rows": rows, "relay_batch": batch, "seconds": round3(took.Seconds()), "rows_per_s": int(rate),
					"raw_js_async_rows_per_s": int(rawRate), "ratio_to_raw": round3(rate / rawRate),
					"target_seconds": 5,
				})
			}
		})
	}
}

// rawPublish publishes n messages with JetStream asynchronously, each with its own message id,
// and waits for every acknowledgement; it returns the time taken.
func rawPublish(b *testing.B, js jetstream.JetStream, n int, payload []byte) time.Duration {
	b.Helper()
	start := time.Now()
	for i := 0; i < n; i++ {
		m := nats.NewMsg("sluice.raw.dGVuYW50LTE")
		m.Data = payload
		m.Header.Set(jetstream.MsgIDHeader, "raw-"+strconv.Itoa(i))
		if _, err := js.PublishMsgAsync(m); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(60 * time.Second):
		b.Fatal("raw publish: acknowledgements missing after 60 s")
	}
	return time.Since(start)
}

func round3(f float64) float64 { return float64(int(f*1000+0.5)) / 1000 }
