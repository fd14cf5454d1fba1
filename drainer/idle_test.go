package drainer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/testdb"
)

// TestIdleDrainerRoundTrips pins what an idle drainer asks of the database, which is most of
// its CPU (SPEC §14: under 0.1 % of a core with the 1 Hz poll): each poll of an empty queue is
// two round trips, the lone-job probe and the heartbeat sent with the expired-lease scan, and
// no runtime config read. Passes are driven one at a time on a fake clock a poll period apart.
func TestIdleDrainerRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	counted, log := drainertest.CountedPool(t, db)
	clk := clock.NewFake(time.Now())
	d, err := drainer.New(drainer.Config{DB: counted, Executor: refusing(), Clock: clk, ID: "idle"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop(ctx)
	// The first pass reads the runtime config (nothing has yet); the later ones need not.
	if _, err := d.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		clk.Advance(time.Second)
		log.Reset()
		if _, err := d.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		got := log.Take()
		if len(got) != 2 || !strings.Contains(got[0], "FORCE INDEX (claim) WHERE status = 'queued' LIMIT 2") ||
			!strings.HasPrefix(got[1], "INSERT INTO drainers") || !strings.Contains(got[1], "lease_until < ") {
			t.Errorf("idle pass %d sent %d round trips, want the lone-job probe and the heartbeat with the lease scan:\n%s",
				i+1, len(got), strings.Join(got, "\n---\n"))
		}
		// The heartbeat in that round trip was written.
		var beat time.Time
		if err := db.QueryRowContext(ctx, "SELECT heartbeat_at FROM drainers WHERE id = 'idle'").Scan(&beat); err != nil {
			t.Fatal(err)
		}
		if now, _ := clk.Now(ctx); !beat.Equal(now) {
			t.Errorf("idle pass %d: heartbeat at %s, want the pass's time %s", i+1, beat, now)
		}
	}
}

// refusing returns an executor that fails the test if anything is dispatched.
func refusing() *drainertest.Executor {
	return &drainertest.Executor{Answer: func(context.Context, int, executor.Dispatch) executor.Answer {
		panic("an idle drainer dispatched a job")
	}}
}
