package publisher_test

import (
	"context"
	"strings"
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
	// A stream of that name for another prefix is kept as it is, and reported.
	if _, _, err := publisher.CreateStreamIfMissing(ctx, js, publisher.StreamConfig{Prefix: "other"}); err == nil ||
		!strings.Contains(err.Error(), "not other.>") {
		t.Errorf("stream for sluice.> checked for prefix other: %v, want an error naming other.>", err)
	}
	if info, err := s.Info(ctx); err != nil || len(info.Config.Subjects) != 1 || info.Config.Subjects[0] != "sluice.>" {
		t.Errorf("the stream's subjects became %v (%v), want sluice.> kept", info.Config.Subjects, err)
	}
}
