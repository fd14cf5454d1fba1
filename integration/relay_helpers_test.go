package integration_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/integration/testdb"
	"github.com/sluicehq/sluice/outbox"
	"github.com/sluicehq/sluice/publisher"
)

// relayEnv is a database and a connection to a test-owned broker, for tests that drive the
// relay directly.
type relayEnv struct {
	db        *testdb.DB
	nc        *nats.Conn
	js        jetstream.JetStream
	installID string
}

// newRelayEnv connects to url (a test-owned broker), creates the stream with replicas, and
// gives the test its own database.
func newRelayEnv(t testing.TB, url string, replicas int) *relayEnv {
	t.Helper()
	e := &relayEnv{db: testdb.New(t)}
	var err error
	if e.nc, err = nats.Connect(url, publisher.ConnectOptions("relay test")...); err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(e.nc.Close)
	if e.js, err = jetstream.New(e.nc, jetstream.WithPublishAsyncMaxPending(8192)); err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := publisher.EnsureStream(ctx, e.js, publisher.StreamConfig{Replicas: replicas}); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if e.installID, err = publisher.InstallationID(ctx, e.db.DB); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *relayEnv) relay(t testing.TB, cfg publisher.RelayConfig) *publisher.Relay {
	t.Helper()
	cfg.DB, cfg.NC, cfg.JS, cfg.InstallID = e.db.DB, e.nc, e.js, e.installID
	r, err := publisher.NewRelay(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// insertRows commits n outbox rows (pokes spread over 7 tenants) in transactions of up to 1000
// rows and returns their ids.
func insertRows(t testing.TB, db *testdb.DB, n int) []int64 {
	t.Helper()
	ctx := context.Background()
	now := clock.Trunc(time.Now())
	var ids []int64
	for len(ids) < n {
		k := min(1000, n-len(ids))
		msgs := make([]outbox.Message, k)
		for i := range msgs {
			msgs[i] = outbox.PokeMessage("sluice", outbox.Enqueue, fmt.Sprintf("tenant-%d", (len(ids)+i)%7), int64(len(ids)+i))
		}
		got, err := outbox.Write(ctx, db, now, msgs...)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, got...)
	}
	return ids
}

func countOutbox(t testing.TB, db *testdb.DB, where string) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM outbox WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// streamMessages returns how many messages the SLUICE stream holds on the broker at url.
func streamMessages(t testing.TB, url string) uint64 {
	t.Helper()
	ctx := context.Background()
	s, err := natstest.JetStreamAt(t, url).Stream(ctx, "SLUICE")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// streamMsg is what a consumer saw of one message.
type streamMsg struct {
	msgID, outboxID, replayOf string
}

// consumeAll reads the whole stream SLUICE through a new durable consumer and returns what it
// saw, in stream order. It reads until the consumer has nothing pending.
func consumeAll(t testing.TB, js jetstream.JetStream) []streamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	name := fmt.Sprintf("check-%d", time.Now().UnixNano())
	cons, err := js.CreateOrUpdateConsumer(ctx, "SLUICE", jetstream.ConsumerConfig{Durable: name,
		AckPolicy: jetstream.AckNonePolicy, DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatalf("consumer info: %v", err)
	}
	want := int(info.NumPending)
	var out []streamMsg
	for len(out) < want {
		batch, err := cons.Fetch(min(1000, want-len(out)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatalf("fetch: %v", err)
		}
		got := 0
		for m := range batch.Messages() {
			h := m.Headers()
			out = append(out, streamMsg{msgID: h.Get(jetstream.MsgIDHeader), outboxID: h.Get(publisher.HeaderOutboxID),
				replayOf: h.Get(publisher.HeaderReplayOf)})
			got++
		}
		if err := batch.Error(); err != nil {
			t.Fatalf("fetch: %v", err)
		}
		if got == 0 {
			t.Fatalf("consumer stalled after %d of %d messages", len(out), want)
		}
	}
	_ = js.DeleteConsumer(ctx, "SLUICE", name)
	return out
}

// assertExactlyOnce fails t unless the consumer saw each of ids' original message ids exactly
// once and no other message.
func assertExactlyOnce(t testing.TB, installID string, ids []int64, seen []streamMsg) {
	t.Helper()
	count := map[string]int{}
	for _, m := range seen {
		count[m.msgID]++
	}
	var missing, dup []string
	for _, id := range ids {
		mid := publisher.MsgID(installID, id)
		switch count[mid] {
		case 1:
		case 0:
			missing = append(missing, mid)
		default:
			dup = append(dup, fmt.Sprintf("%s×%d", mid, count[mid]))
		}
		delete(count, mid)
	}
	if len(missing) > 0 || len(dup) > 0 || len(count) > 0 {
		var extra []string
		for k := range count {
			extra = append(extra, k)
		}
		t.Fatalf("consumer saw %d messages for %d rows: missing %d %s, duplicated %d %s, unexpected %d %s",
			len(seen), len(ids), len(missing), head(missing), len(dup), head(dup), len(extra), head(extra))
	}
}

func head(s []string) string {
	if len(s) > 5 {
		s = s[:5]
	}
	return "[" + strings.Join(s, " ") + "]"
}

func allOutboxIDs(t testing.TB, db *testdb.DB) []int64 {
	t.Helper()
	return drainertest.QueryIDs(t, db.DB, "SELECT id FROM outbox ORDER BY id")
}

// registryMetrics is a relay's collectors on a registry of the test's own.
type registryMetrics struct {
	reg *prometheus.Registry
	m   *publisher.RelayMetrics
}

func newRegistryMetrics() registryMetrics {
	reg := prometheus.NewRegistry()
	return registryMetrics{reg: reg, m: publisher.NewRelayMetrics(reg)}
}

// counter returns the value of counter name, or of its series with kind=label.
func (r registryMetrics) counter(t testing.TB, name, label string) float64 {
	t.Helper()
	if label == "" {
		return harness.Counter(t, r.reg, name)
	}
	return harness.Counter(t, r.reg, name, "kind", label)
}
