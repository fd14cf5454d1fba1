package publisher_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/integration/publishertest"
	"github.com/sluicehq/sluice/integration/testdb"
	"github.com/sluicehq/sluice/integration/wait"
	"github.com/sluicehq/sluice/outbox"
	"github.com/sluicehq/sluice/publisher"
)

// TestRelayCoreNATSMode: against a broker without JetStream, the relay publishes with core NATS
// and marks rows once the flush succeeded; a row over the server's max payload is refused by the
// client before sending and set aside, without holding up the rest.
func TestRelayCoreNATSMode(t *testing.T) {
	t.Parallel()
	ns := natstest.StartWith(t, func(o *server.Options) { o.JetStream = false; o.MaxPayload = 4096 })
	db := testdb.New(t)
	ctx := context.Background()
	nc, err := nats.Connect(ns.URL(), publisher.ConnectOptions("core relay test")...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var mu sync.Mutex
	seen := map[string]int{}
	sub, err := nc.Subscribe("sluice.>", func(m *nats.Msg) {
		mu.Lock()
		seen[m.Header.Get(publisher.HeaderOutboxID)]++
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	installID, err := publisher.InstallationID(ctx, db.DB)
	if err != nil {
		t.Fatal(err)
	}
	ids := publishertest.InsertRows(t, db, 50)
	big, err := outbox.Write(ctx, db, clock.Trunc(time.Now()), outbox.Message{Subject: "sluice.release.Yg",
		Payload: []byte(strings.Repeat("y", 8000))})
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, publishertest.InsertRows(t, db, 50)...)
	r, err := publisher.NewRelay(publisher.RelayConfig{DB: db.DB, NC: nc, InstallID: installID})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.RunOnce(ctx); err != nil || n != 100 {
		t.Fatalf("core pass published %d (err %v), want 100", n, err)
	}
	if n := publishertest.CountOutbox(t, db, "published_at = "+outbox.Unpublished); n != 0 {
		t.Fatalf("%d rows unpublished", n)
	}
	total, failed, err := outbox.ReadFailed(ctx, db, 1)
	if err != nil || total != 1 || failed[0].ID != big[0] {
		t.Fatalf("set aside %d %+v (err %v), want row %d", total, failed, err, big[0])
	}
	wait.For(t, 5*time.Second, "the subscriber to receive the 100 rows", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == 100, nil
	})
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if n := seen[strconv.FormatInt(id, 10)]; n != 1 {
			t.Errorf("row %d received %d times, want 1", id, n)
		}
	}
}
