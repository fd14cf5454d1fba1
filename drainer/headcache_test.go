package drainer_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/testdb"
)

// TestHeadCacheKeepsRequeuedJobFirst: a pass reads more of a tenant's queue heads than it
// claims and keeps the rest for the next passes. A job this drainer puts back in the queue keeps
// its place at the head, so the next pass must dispatch it again before the heads it kept.
func TestHeadCacheKeepsRequeuedJobFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	// The first dispatch's answer is lost (the job goes back to the queue, never started); every
	// later one finishes.
	sender := &drainertest.Executor{Record: true, Answer: func(_ context.Context, n int, _ executor.Dispatch) executor.Answer {
		if n == 1 {
			return executor.Answer{Kind: executor.Unknown, Err: errors.New("connection reset")}
		}
		return executor.Answer{Kind: executor.Done, Status: "succeeded"}
	}}
	d, recorded := cacheDrainer(t, db, db.DB, sender, "cache", 1)
	queueOld(t, db, 40) // more jobs than a heads read takes (32)
	var first int64
	if err := db.QueryRowContext(ctx, "SELECT MIN(id) FROM jobs").Scan(&first); err != nil {
		t.Fatal(err)
	}
	for pass := 1; pass <= 2; pass++ {
		p, err := d.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if p.Claimed != 1 {
			t.Fatalf("pass %d claimed %d jobs, want 1 (tenant cap 1)", pass, p.Claimed)
		}
		drainertest.AwaitRecorded(t, recorded, 1)
	}
	var sent []int64
	for _, d := range sender.Dispatches() {
		sent = append(sent, d.JobID)
	}
	if len(sent) != 2 || sent[0] != first || sent[1] != first {
		t.Fatalf("dispatched %v, want the oldest job %d twice (requeued after a lost answer)", sent, first)
	}
}

// TestClaimSkipsJobTakenMeanwhile: a pass chooses from heads it read earlier, so a chosen job
// may have left the queue meanwhile (canceled here). The claim's UPDATE skips it, and the claim
// must return only the jobs that carry its own nonces: the canceled one is never sent.
func TestClaimSkipsJobTakenMeanwhile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	sender := &drainertest.Executor{Record: true}
	d, recorded := cacheDrainer(t, db, db.DB, sender, "taken", 2)
	// More jobs than a heads read takes (32).
	if _, err := db.ExecContext(ctx, `INSERT INTO jobs (tenant, status, queued_at, payload)
		SELECT 'a', 'queued', UTC_TIMESTAMP(6) - INTERVAL (100 - seq) SECOND, CONCAT('"job ', seq, '"') FROM seq_1_to_40`); err != nil {
		t.Fatal(err)
	}
	db.RecountQueues(t, "a")
	// The jobs in queue order: ids on the server's auto_increment_increment, not always 1 apart.
	ids := drainertest.QueryIDs(t, db.DB, "SELECT id FROM jobs ORDER BY id")
	seq := map[int64]int{} // job id → the seq in its payload
	for i, id := range ids {
		seq[id] = i + 1
	}
	wait := func(n int) {
		t.Helper()
		drainertest.AwaitRecorded(t, recorded, n)
	}
	if p, err := d.RunOnce(ctx); err != nil || p.Claimed != 2 {
		t.Fatalf("first pass: %+v, %v; want 2 claimed (tenant cap 2)", p, err)
	}
	wait(2)
	// The pass kept the next heads; the first of them leaves the queue behind its back.
	if _, err := db.ExecContext(ctx, "UPDATE jobs SET status = 'canceled', version = version + 1 WHERE id = ?", ids[2]); err != nil {
		t.Fatal(err)
	}
	p, err := d.RunOnce(ctx)
	if err != nil || p.Claimed != 1 {
		t.Fatalf("second pass: %+v, %v; want 1 claimed (of the two chosen, one was canceled)", p, err)
	}
	wait(1)
	var sent []int64
	for _, d := range sender.Dispatches() {
		sent = append(sent, d.JobID)
		if want := fmt.Sprintf(`"job %d"`, seq[d.JobID]); string(d.Payload) != want {
			t.Errorf("job %d dispatched with payload %s, want %s", d.JobID, d.Payload, want)
		}
	}
	slices.Sort(sent) // a pass's dispatches run concurrently
	if want := []int64{ids[0], ids[1], ids[3]}; fmt.Sprint(sent) != fmt.Sprint(want) {
		t.Errorf("dispatched %v, want %v (never the canceled %d)", sent, want, ids[2])
	}
}

// TestHeadCacheKeepsAShortQueue: a read that finds a tenant's whole queue (fewer jobs than a
// heads read takes) is kept too, so the passes that follow take the tenant's next jobs from the
// cache instead of reading its queue again each time; a job admitted meanwhile, behind the kept
// ones, is read once they are claimed, and the jobs go out in queue order.
func TestHeadCacheKeepsAShortQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	counted, log := drainertest.CountedPool(t, db)
	sender := &drainertest.Executor{Record: true}
	d, recorded := cacheDrainer(t, db, counted, sender, "short", 1)
	queueOld(t, db, 5)
	const headsRead = "interactive, priority, 0 FROM jobs FORCE INDEX (claim)"
	pass := func(n int) (reads int) {
		t.Helper()
		log.Reset()
		p, err := d.RunOnce(ctx)
		if err != nil || p.Claimed != 1 {
			t.Fatalf("pass %d: %+v, %v; want 1 claimed (tenant cap 1)", n, p, err)
		}
		drainertest.AwaitRecorded(t, recorded, 1)
		for _, q := range log.Take() {
			reads += strings.Count(q, headsRead)
		}
		return reads
	}
	if reads := pass(1); reads != 1 {
		t.Fatalf("the first pass read the queue heads %d times, want once", reads)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO jobs (tenant, status, queued_at) VALUES ('a', 'queued', UTC_TIMESTAMP(6))"); err != nil {
		t.Fatal(err)
	}
	db.RecountQueues(t, "a")
	// The first read kept four heads: the next two passes, each taking one of them, leave more
	// than the pass's share cached, so they read nothing.
	for n := 2; n <= 3; n++ {
		if reads := pass(n); reads != 0 {
			t.Errorf("pass %d read the queue heads %d times with the tenant's next jobs cached, want none", n, reads)
		}
	}
	for n := 4; n <= 6; n++ {
		pass(n)
	}
	var sent []int64
	for _, d := range sender.Dispatches() {
		sent = append(sent, d.JobID)
	}
	want := drainertest.QueryIDs(t, db.DB, "SELECT id FROM jobs ORDER BY queued_at, id")
	if fmt.Sprint(sent) != fmt.Sprint(want) {
		t.Errorf("dispatched %v, want the queue's order %v (the job admitted during the drain last)", sent, want)
	}
}

// cacheDrainer sets caps of 4 in flight and tenantCap a tenant, creates tenant a, and starts a
// drainer on pool whose clock stands still, so only its first pass, run here on the empty queue,
// runs the upkeep that drops the cache. recorded receives each job whose outcome is recorded.
func cacheDrainer(t *testing.T, db *testdb.DB, pool *sql.DB, sender *drainertest.Executor, id string, tenantCap int) (d *drainer.Drainer, recorded chan int64) {
	t.Helper()
	ctx := context.Background()
	testdb.SetLimits(t, db.DB, func(c *config.Config) { c.GlobalInFlight, c.TenantInFlight = 4, tenantCap })
	if _, err := db.ExecContext(ctx, "INSERT INTO tenants (tenant, created_at) VALUES ('a', UTC_TIMESTAMP(6))"); err != nil {
		t.Fatal(err)
	}
	recorded = make(chan int64, 8)
	d = drainertest.NewDrainer(t, drainer.Config{DB: pool, Executor: sender, ID: id, Clock: clock.NewFake(time.Now()),
		Observer: drainer.ObserverFuncs{OnRecorded: func(id int64) { recorded <- id }}}, 10*time.Second)
	if p, err := d.RunOnce(ctx); err != nil || p.Claimed != 0 {
		t.Fatalf("pass on the empty queue: %+v, %v", p, err)
	}
	return d, recorded
}

// queueOld queues n jobs of tenant a, queued a second apart in the past, and counts them.
func queueOld(t *testing.T, db *testdb.DB, n int) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), fmt.Sprintf(`INSERT INTO jobs (tenant, status, queued_at)
		SELECT 'a', 'queued', UTC_TIMESTAMP(6) - INTERVAL (100 - seq) SECOND FROM seq_1_to_%d`, n)); err != nil {
		t.Fatal(err)
	}
	db.RecountQueues(t, "a")
}
