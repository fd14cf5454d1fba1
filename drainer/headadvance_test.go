package drainer_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/testdb"
)

// TestDrainerSetsHeadsForward: a claim leaves its tenant's queue head behind, on the job it
// dispatched (migration 0018), and the drainer that claimed sets it forward to the tenant's
// oldest queued job: within a poll interval while one page of a pass holds every tenant with
// work, within HeadAdvance once they fill more than a page. The first dispatch is answered at
// once (its pass also sets the head forward: nothing was set forward before); the later ones are
// held unanswered, so each tenant stays at its cap of 1 and nothing else moves its head.
func TestDrainerSetsHeadsForward(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		tenants int           // each with three queued jobs, tenant t0's oldest
		step    time.Duration // how far the clock moves before the pass that sets t0's head forward
	}{
		{name: "one page, a poll interval", tenants: 1, step: time.Minute},
		{name: "several pages, HeadAdvance", tenants: 6, step: time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t)
			testdb.SetLimits(t, db.DB, func(c *config.Config) { c.GlobalInFlight, c.TenantInFlight = 4, 1 })
			for i := range tc.tenants {
				tenant := fmt.Sprintf("t%d", i)
				if _, err := db.ExecContext(ctx, `INSERT INTO tenants (tenant, created_at) VALUES (?, UTC_TIMESTAMP(6))`, tenant); err != nil {
					t.Fatal(err)
				}
				if _, err := db.ExecContext(ctx, `INSERT INTO jobs (tenant, status, queued_at)
					SELECT ?, 'queued', UTC_TIMESTAMP(6) - INTERVAL (100 - ? - seq) SECOND FROM seq_1_to_3`, tenant, i*3); err != nil {
					t.Fatal(err)
				}
				db.RecountQueues(t, tenant)
			}
			ids := drainertest.QueryIDs(t, db.DB, "SELECT id FROM jobs WHERE tenant = 't0' ORDER BY queued_at, id")
			release := make(chan struct{})
			defer close(release)
			sender := &drainertest.Executor{Answer: func(_ context.Context, n int, _ executor.Dispatch) executor.Answer {
				if n > 1 {
					<-release
				}
				return executor.Answer{Kind: executor.Done, Status: "succeeded"}
			}}
			recorded := make(chan int64, 1)
			clk := clock.NewFake(time.Now())
			// One job a claim, so that a pass leaves room (an unanswered cap skips the pass).
			d := drainertest.NewDrainer(t, drainer.Config{DB: db.DB, Executor: sender, ID: "heads", Clock: clk,
				PollInterval: time.Minute, HeadAdvance: time.Second, ClaimBatch: 1,
				Observer: drainer.ObserverFuncs{OnRecorded: func(id int64) {
					select {
					case recorded <- id: // the first; the others are let go at the end
					default:
					}
				}}}, 10*time.Second)
			if p, err := d.RunOnce(ctx); err != nil || p.Claimed != 1 {
				t.Fatalf("first pass: %+v, %v", p, err)
			}
			drainertest.AwaitRecorded(t, recorded, 1)
			wantHead(t, db.DB, "t0", ids[1], "after the first pass")
			if p, err := d.RunOnce(ctx); err != nil || p.Claimed != 1 {
				t.Fatalf("second pass: %+v, %v", p, err)
			}
			wantHead(t, db.DB, "t0", ids[1], "after the claim of its oldest job")
			// t0 is at its cap; another tenant's job goes, if there is one.
			if p, err := d.RunOnce(ctx); err != nil || p.Claimed != min(tc.tenants-1, 1) {
				t.Fatalf("third pass: %+v, %v", p, err)
			}
			wantHead(t, db.DB, "t0", ids[1], "a pass later, the clock standing still")
			clk.Advance(tc.step)
			if _, err := d.RunOnce(ctx); err != nil {
				t.Fatal(err)
			}
			wantHead(t, db.DB, "t0", ids[2], "once the advance is due")
			drainertest.CheckQueueState(t, ctx, db.DB, "at the end", false)
		})
	}
}

// wantHead fails unless tenant's queue head is job id.
func wantHead(t *testing.T, db *sql.DB, tenant string, id int64, when string) {
	t.Helper()
	var head sql.NullInt64
	if err := db.QueryRowContext(context.Background(), "SELECT head_id FROM tenants WHERE tenant = ?", tenant).Scan(&head); err != nil {
		t.Fatal(err)
	}
	if head.Int64 != id {
		t.Fatalf("%s: tenant %s's head is job %v, want %d", when, tenant, head, id)
	}
}
