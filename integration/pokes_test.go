package integration_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/outbox"
)

// TestPokesCoalesce sends a burst of 10,000 pokes: the drainer hears all of them but runs a
// handful of passes, not 10,000.
func TestPokesCoalesce(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{})
	reg := env.App.Registry()
	nc, err := nats.Connect(env.NATS.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	pokesBefore := harness.Counter(t, reg, "sluice_pokes_received_total")
	passesBefore := harness.Counter(t, reg, "sluice_drainer_passes_total")
	msg := outbox.PokeMessage(outbox.DefaultPrefix, outbox.Enqueue, "burst", 1)
	for i := 0; i < 10000; i++ {
		if err := nc.Publish(msg.Subject, msg.Payload); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 30*time.Second, "the drainer to receive 10,000 pokes", func() (bool, error) {
		return harness.Counter(t, reg, "sluice_pokes_received_total")-pokesBefore >= 10000, nil
	})
	passes := harness.Counter(t, reg, "sluice_drainer_passes_total") - passesBefore
	t.Logf("10,000 pokes caused %.0f drain passes", passes)
	// Each pass takes at least a few database round trips (~1 ms), while the whole burst arrives
	// within a few tens of milliseconds: every poke that arrives during a pass collapses into the
	// one pending pass after it.
	if passes > 100 {
		t.Errorf("10,000 pokes caused %.0f passes; pokes must coalesce", passes)
	}
}
