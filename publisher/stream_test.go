package publisher_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/publisher"
)

// TestCreateStreamIfMissingKeepsOperatorSettings: a process starting up creates a missing stream,
// but never resets one an operator configured with `sluice nats init`.
func TestCreateStreamIfMissingKeepsOperatorSettings(t *testing.T) {
	ctx := context.Background()
	srv := natstest.Start(t)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	_, created, err := publisher.CreateStreamIfMissing(ctx, js, publisher.StreamConfig{})
	if err != nil || !created {
		t.Fatalf("missing stream: created %v, %v", created, err)
	}
	if _, err := publisher.EnsureStream(ctx, js, publisher.StreamConfig{Duplicates: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	s, created, err := publisher.CreateStreamIfMissing(ctx, js, publisher.StreamConfig{})
	if err != nil || created {
		t.Fatalf("existing stream: created %v, %v", created, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Duplicates != 10*time.Minute {
		t.Errorf("start-up reset the duplicate window to %s; the operator set 10m", info.Config.Duplicates)
	}
}
