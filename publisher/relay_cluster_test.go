package publisher_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/integration/publishertest"
	"github.com/sluicehq/sluice/integration/wait"
	"github.com/sluicehq/sluice/outbox"
	"github.com/sluicehq/sluice/publisher"
)

// TestRelayThroughClusterNodeLoss relays 10,000 rows into a stream with three replicas on a
// three-node cluster and kills the stream's leader node partway: the relay retries what was not
// acknowledged with the same message ids, so nothing is lost and nothing is duplicated at the
// consumer.
func TestRelayThroughClusterNodeLoss(t *testing.T) {
	t.Parallel()
	cl := natstest.StartCluster(t, 3)
	e := publishertest.NewEnv(t, cl.URLs(), 3)
	ids := publishertest.InsertRows(t, e.DB, 10000)
	reg := publishertest.NewRegistryMetrics()
	r := e.Relay(t, publisher.RelayConfig{Batch: 250, AckTimeout: 2 * time.Second, MaxBackoff: time.Second, Metrics: reg.Metrics})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })

	wait.For(t, 60*time.Second, "a first share of the rows to be published", func() (bool, error) {
		return publishertest.CountOutbox(t, e.DB, "published_at > "+outbox.Unpublished) >= 1000, nil
	})
	info, err := e.JS.Stream(context.Background(), "SLUICE")
	if err != nil {
		t.Fatal(err)
	}
	leader := info.CachedInfo().Cluster.Leader
	var killed bool
	for _, n := range cl.Nodes {
		if n.Name() == leader {
			n.Stop()
			killed = true
		}
	}
	if !killed {
		t.Fatalf("stream leader %q is none of the nodes", leader)
	}
	if done := publishertest.CountOutbox(t, e.DB, "published_at > "+outbox.Unpublished); done == int64(len(ids)) {
		t.Fatal("the relay finished before the node was killed; the test proves nothing")
	}
	wait.For(t, 90*time.Second, "every row to be published after losing a node", func() (bool, error) {
		return publishertest.CountOutbox(t, e.DB, "published_at = "+outbox.Unpublished) == 0, nil
	})
	cancel()
	wg.Wait()
	t.Logf("stream leader %s killed; relay errors: timeout %v, broker_down %v, other %v", leader,
		reg.Counter(t, "sluice_relay_publish_errors_total", "timeout"),
		reg.Counter(t, "sluice_relay_publish_errors_total", "broker_down"),
		reg.Counter(t, "sluice_relay_publish_errors_total", "other"))
	publishertest.AssertExactlyOnce(t, e.InstallID, ids, publishertest.ConsumeAll(t, e.JS))
}
