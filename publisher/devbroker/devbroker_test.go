package devbroker

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestBrokerRunsJetStreamAndCleansUp: the embedded server takes connections on loopback with
// JetStream enabled, and Stop closes it and removes its store.
func TestBrokerRunsJetStreamAndCleansUp(t *testing.T) {
	b, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			b.Stop()
		}
	})
	nc, err := nats.Connect(b.URL(), nats.NoReconnect())
	if err != nil {
		t.Fatalf("connect to %s: %v", b.URL(), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatalf("create a file-backed stream: %v", err)
	}
	if _, err := js.Publish(ctx, "t.x", []byte("hi")); err != nil {
		t.Fatalf("publish with acknowledgement: %v", err)
	}
	if _, err := os.Stat(b.store); err != nil {
		t.Fatalf("store directory: %v", err)
	}

	b.Stop()
	stopped = true
	if _, err := os.Stat(b.store); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the store %s is still there after Stop: %v", b.store, err)
	}
	if c, err := nats.Connect(b.URL(), nats.NoReconnect(), nats.Timeout(time.Second)); err == nil {
		c.Close()
		t.Errorf("the server at %s still takes connections after Stop", b.URL())
	}
}
