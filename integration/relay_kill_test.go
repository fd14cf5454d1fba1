package integration_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/integration/publishertest"
	"github.com/sluicehq/sluice/outbox"
	"github.com/sluicehq/sluice/publisher"
)

// TestRelayKilledBetweenPublishAndMark runs the relay in a child process 20 times; each child
// publishes a few batches and then SIGKILLs itself after a batch's acknowledgements and before
// its marks commit. The rows of that batch are published again by the next relay with the same
// message ids: a consumer still sees every row exactly once, and nothing stays unpublished.
func TestRelayKilledBetweenPublishAndMark(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	e := publishertest.NewEnv(t, ns.URL(), 1)
	ids := publishertest.InsertRows(t, e.DB, 2000)
	for i := 0; i < 20; i++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRelayChildProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(),
			"SLUICE_RELAY_CHILD_DSN="+e.DB.DSN,
			"SLUICE_RELAY_CHILD_NATS="+ns.URL(),
			"SLUICE_RELAY_CHILD_KILL_AT="+strconv.Itoa(i%4+1)) // marks i%4 batches, dies in the next
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("child %d was not killed (err %v): %s", i, err, out)
		}
		ws, ok := ee.Sys().(syscall.WaitStatus)
		if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("child %d ended with %v, want SIGKILL between publish and mark: %s", i, err, out)
		}
	}
	unpublished := publishertest.CountOutbox(t, e.DB, "published_at = "+outbox.Unpublished)
	if unpublished == 0 || unpublished == int64(len(ids)) {
		t.Fatalf("%d rows unpublished after the kills; want the children to have marked some, not all", unpublished)
	}
	r := e.Relay(t, publisher.RelayConfig{Batch: 25})
	for {
		n, err := r.RunOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	if n := publishertest.CountOutbox(t, e.DB, "published_at = "+outbox.Unpublished); n != 0 {
		t.Fatalf("%d rows unpublished at the end", n)
	}
	publishertest.AssertExactlyOnce(t, e.InstallID, ids, publishertest.ConsumeAll(t, e.JS))
}

// TestRelayChildProcess is the relay process of TestRelayKilledBetweenPublishAndMark; it does
// nothing unless started by it.
func TestRelayChildProcess(t *testing.T) {
	dsn := os.Getenv("SLUICE_RELAY_CHILD_DSN")
	if dsn == "" {
		t.Skip("only run as the child of TestRelayKilledBetweenPublishAndMark")
	}
	killAt, err := strconv.Atoi(os.Getenv("SLUICE_RELAY_CHILD_KILL_AT"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	db, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(os.Getenv("SLUICE_RELAY_CHILD_NATS"), publisher.ConnectOptions("relay child")...)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	installID, err := publisher.InstallationID(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	batches := 0
	r, err := publisher.NewRelay(publisher.RelayConfig{DB: db, NC: nc, JS: js, InstallID: installID, Batch: 25,
		AfterPublish: func(acked []int64) {
			if len(acked) == 0 {
				return
			}
			if batches++; batches == killAt {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the signal is on its way; nothing more may happen here
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	for {
		n, err := r.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			fmt.Println("child: nothing left to publish")
			return
		}
	}
}
