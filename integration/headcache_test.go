package integration_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/gate/limits"
	"github.com/sluicehq/sluice/integration/testdb"
)

// firstUnknownSender loses the answer of its first dispatch (the job goes back to the queue,
// never started) and finishes every later one.
type firstUnknownSender struct {
	mu   sync.Mutex
	sent []int64
}

func (s *firstUnknownSender) Send(_ context.Context, d executor.Dispatch) executor.Answer {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = append(s.sent, d.JobID)
	if len(s.sent) == 1 {
		return executor.Answer{Kind: executor.Unknown, Err: errors.New("connection reset")}
	}
	return executor.Answer{Kind: executor.Done, Status: "succeeded"}
}

// TestHeadCacheKeepsRequeuedJobFirst: a pass reads more of a tenant's queue heads than it
// claims and keeps the rest for the next passes. A job this drainer puts back in the queue keeps
// its place at the head, so the next pass must dispatch it again before the heads it kept.
func TestHeadCacheKeepsRequeuedJobFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	setLimits(t, db, func(c *limits.Config) { c.GlobalInFlight, c.TenantInFlight = 4, 1 })
	if _, err := db.ExecContext(ctx, "INSERT INTO tenants (tenant, created_at) VALUES ('a', UTC_TIMESTAMP(6))"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO jobs (tenant, status, queued_at)
		SELECT 'a', 'queued', UTC_TIMESTAMP(6) - INTERVAL (100 - seq) SECOND FROM seq_1_to_20`); err != nil {
		t.Fatal(err)
	}
	var first int64
	if err := db.QueryRowContext(ctx, "SELECT MIN(id) FROM jobs").Scan(&first); err != nil {
		t.Fatal(err)
	}
	sender := &firstUnknownSender{}
	recorded := make(chan int64, 4)
	d, err := drainer.New(drainer.Config{DB: db.DB, Executor: sender, ID: "cache",
		Recorded: func(id int64) { recorded <- id }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		d.Stop(sctx)
	})
	for pass := 1; pass <= 2; pass++ {
		p, err := d.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if p.Claimed != 1 {
			t.Fatalf("pass %d claimed %d jobs, want 1 (tenant cap 1)", pass, p.Claimed)
		}
		select {
		case <-recorded:
		case <-time.After(10 * time.Second):
			t.Fatalf("pass %d: the outcome was not recorded within 10 s", pass)
		}
	}
	sender.mu.Lock()
	defer sender.mu.Unlock()
	if len(sender.sent) != 2 || sender.sent[0] != first || sender.sent[1] != first {
		t.Fatalf("dispatched %v, want the oldest job %d twice (requeued after a lost answer)", sender.sent, first)
	}
}
