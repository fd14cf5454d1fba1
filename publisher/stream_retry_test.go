package publisher_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/integration/wait"
	"github.com/sluicehq/sluice/publisher"
)

// TestEnsureStreamRetriesUntilTheClusterCan: with two nodes of three down a stream of three
// replicas cannot be made (the lone node answers that it has no meta leader, or, while it still
// thinks itself the leader, that it has no peers to place the replicas on: each was seen);
// EnsureStream keeps asking, each request with its own time, and succeeds once the nodes are
// back, within the one context it was given. A single request that waited out its context failed
// TestRelayThroughClusterNodeLoss once, on a busy machine; without the retries this test fails at
// the first answer.
func TestEnsureStreamRetriesUntilTheClusterCan(t *testing.T) {
	t.Parallel()
	cl := natstest.StartCluster(t, 3)
	cl.Nodes[1].Stop()
	cl.Nodes[2].Stop()
	nc, err := nats.Connect(cl.Nodes[0].URL(), publisher.ConnectOptions("stream retry test")...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := publisher.EnsureStream(ctx, js, publisher.StreamConfig{Prefix: "retrytest", Name: "RETRYTEST", Replicas: 3})
		done <- err
	}()
	// The lone node answers that JetStream is not available: the call is still asking when it
	// has heard that answer itself.
	wait.For(t, 30*time.Second, "the lone node to refuse JetStream requests", func() (bool, error) {
		actx, acancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer acancel()
		_, err := js.AccountInfo(actx)
		return err != nil, nil
	})
	select {
	case err := <-done:
		t.Fatalf("EnsureStream returned with two nodes of three down: %v", err)
	default:
	}
	cl.Nodes[1].Restart(t)
	cl.Nodes[2].Restart(t)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("EnsureStream after the nodes came back: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("EnsureStream did not return within 90 s")
	}
	info, err := js.Stream(context.Background(), "RETRYTEST")
	if err != nil || info.CachedInfo().Config.Replicas != 3 {
		t.Fatalf("the stream after EnsureStream: %v (%v)", info, err)
	}
}
