package publisher_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/publisher"
)

// TestPrepareStreamKeepsOperatorSettings: a process starting up creates a missing stream, but
// never resets one an operator configured with `sluice nats init`.
func TestPrepareStreamKeepsOperatorSettings(t *testing.T) {
	ctx := context.Background()
	js := jetStreamOf(t)
	_, change, err := publisher.PrepareStream(ctx, js, publisher.StreamConfig{})
	if err != nil || change != publisher.StreamCreated {
		t.Fatalf("missing stream: change %v, %v; want created", change, err)
	}
	if _, err := publisher.EnsureStream(ctx, js, publisher.StreamConfig{Duplicates: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	s, change, err := publisher.PrepareStream(ctx, js, publisher.StreamConfig{})
	if err != nil || change != publisher.StreamKept {
		t.Fatalf("existing stream: change %v, %v; want kept", change, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Duplicates != 10*time.Minute {
		t.Errorf("start-up reset the duplicate window to %s; the operator set 10m", info.Config.Duplicates)
	}
	// A stream of that name for another prefix is kept as it is, and reported.
	if _, _, err := publisher.PrepareStream(ctx, js, publisher.StreamConfig{Prefix: "other"}); err == nil ||
		!strings.Contains(err.Error(), "not other.>") {
		t.Errorf("stream for sluice.> checked for prefix other: %v, want an error naming other.>", err)
	}
	if info, err := s.Info(ctx); err != nil || len(info.Config.Subjects) != 1 || info.Config.Subjects[0] != "sluice.>" {
		t.Errorf("the stream's subjects became %v (%v), want sluice.> kept", info.Config.Subjects, err)
	}
}

// TestPrepareStreamRaisesAShortWindow: a stream whose duplicate window is below SPEC §7's two
// minutes gets two minutes at start-up, and keeps the rest of what was set on it.
func TestPrepareStreamRaisesAShortWindow(t *testing.T) {
	ctx := context.Background()
	js := jetStreamOf(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SLUICE", Subjects: []string{"sluice.>"},
		Storage: jetstream.MemoryStorage, Duplicates: 30 * time.Second, MaxAge: time.Minute, MaxMsgs: 777}); err != nil {
		t.Fatal(err)
	}
	s, change, err := publisher.PrepareStream(ctx, js, publisher.StreamConfig{})
	if err != nil || change != publisher.WindowRaised {
		t.Fatalf("stream with a 30s window: change %v, %v; want the window raised", change, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := info.Config
	if c.Duplicates != publisher.MinDuplicateWindow || c.MaxAge != publisher.MinDuplicateWindow ||
		c.MaxMsgs != 777 || c.Storage != jetstream.MemoryStorage {
		t.Errorf("after start-up: window %s, max age %s, max msgs %d, storage %s; want 2m, 2m, 777 and memory kept",
			c.Duplicates, c.MaxAge, c.MaxMsgs, c.Storage)
	}
	if _, change, err := publisher.PrepareStream(ctx, js, publisher.StreamConfig{}); err != nil || change != publisher.StreamKept {
		t.Errorf("second start-up: change %v, %v; want the stream kept", change, err)
	}
}

// jetStreamOf starts a broker of the test's own and returns a JetStream client of it.
func jetStreamOf(t *testing.T) jetstream.JetStream {
	t.Helper()
	return natstest.JetStreamAt(t, natstest.Start(t).URL())
}
