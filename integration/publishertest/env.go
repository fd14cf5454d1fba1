package publishertest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/testdb"
	"github.com/sluicehq/sluice/outbox"
	"github.com/sluicehq/sluice/publisher"
)

// Env is a database and a connection to a test-owned broker, for tests that drive the relay
// directly.
type Env struct {
	DB        *testdb.DB
	NC        *nats.Conn
	JS        jetstream.JetStream
	InstallID string
}

// NewEnv connects to url (a test-owned broker), creates the stream with replicas, and gives the
// test its own database.
func NewEnv(t testing.TB, url string, replicas int) *Env {
	t.Helper()
	e := &Env{DB: testdb.New(t)}
	var err error
	if e.NC, err = nats.Connect(url, publisher.ConnectOptions("relay test")...); err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(e.NC.Close)
	if e.JS, err = jetstream.New(e.NC, jetstream.WithPublishAsyncMaxPending(8192)); err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := publisher.EnsureStream(ctx, e.JS, publisher.StreamConfig{Replicas: replicas}); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if e.InstallID, err = publisher.InstallationID(ctx, e.DB.DB); err != nil {
		t.Fatal(err)
	}
	return e
}

// Relay returns a relay of cfg on e's database, connection, stream and installation id.
func (e *Env) Relay(t testing.TB, cfg publisher.RelayConfig) *publisher.Relay {
	t.Helper()
	cfg.DB, cfg.NC, cfg.JS, cfg.InstallID = e.DB.DB, e.NC, e.JS, e.InstallID
	r, err := publisher.NewRelay(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// InsertRows commits n outbox rows (pokes spread over 7 tenants) in transactions of up to 1000
// rows and returns their ids.
func InsertRows(t testing.TB, db *testdb.DB, n int) []int64 {
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

// CountOutbox returns how many outbox rows match where (an SQL condition).
func CountOutbox(t testing.TB, db *testdb.DB, where string) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM outbox WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// AllOutboxIDs returns the ids of every outbox row, in order.
func AllOutboxIDs(t testing.TB, db *testdb.DB) []int64 {
	t.Helper()
	return drainertest.QueryIDs(t, db.DB, "SELECT id FROM outbox ORDER BY id")
}
