package drainer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/testdb"
	"github.com/sluicehq/sluice/integration/wait"
)

// gatedKeys is a gate store in which every key of its set is gated for an hour.
type gatedKeys map[string]bool

func (g gatedKeys) NotBefore(_ context.Context, hashes []string) (map[string]time.Time, error) {
	out := map[string]time.Time{}
	for _, h := range hashes {
		if g[h] {
			out[h] = time.Now().Add(time.Hour)
		}
	}
	return out, nil
}

func (g gatedKeys) Extend(context.Context, string, int) (time.Time, error) {
	return time.Now().Add(time.Hour), nil
}

// TestLoneJobClaim drives passes of a drainer whose queue holds one job at a time, the case its
// lone-job claim serves (one read before the claim transaction instead of four, the payload
// with it). That claim must decide exactly as the normal pass: a tenant at its cap gets nothing,
// a deferred job waits, a gated rate key waits, and the job it does dispatch carries the
// payload and the attempt the claim counted. Every pass runs once as a poll and once after a
// Poke, whose probe goes inside the claim transaction.
func TestLoneJobClaim(t *testing.T) {
	t.Parallel()
	for _, poked := range []bool{false, true} {
		name := "polled"
		if poked {
			name = "poked"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testLoneJobClaim(t, poked)
		})
	}
}

func testLoneJobClaim(t *testing.T, poked bool) {
	ctx := context.Background()
	db := testdb.New(t)
	testdb.SetLimits(t, db.DB, func(c *config.Config) { c.GlobalInFlight, c.TenantInFlight = 4, 1 })
	fake := clock.NewFake(time.Now())
	sender := &drainertest.Executor{Record: true}
	recorded := make(chan int64, 16)
	const gatedHash = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	d := drainertest.NewDrainer(t, drainer.Config{DB: db.DB, Executor: sender, Clock: fake, ID: "lone",
		RateGates: gatedKeys{gatedHash: true}, Observer: drainer.ObserverFuncs{OnRecorded: func(id int64) { recorded <- id }}}, 10*time.Second)
	exec := func(q string, args ...any) int64 {
		t.Helper()
		r, err := db.ExecContext(ctx, q, args...)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		id, _ := r.LastInsertId()
		if strings.HasPrefix(q, "INSERT INTO jobs") {
			db.RecountQueues(t) // a raw insert; admission counts its own
		}
		return id
	}
	pass := func(want int) {
		t.Helper()
		if poked {
			d.Poke()
		}
		p, err := d.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if p.Claimed != want {
			t.Fatalf("pass claimed %d job(s), want %d", p.Claimed, want)
		}
		drainertest.AwaitRecorded(t, recorded, want)
	}
	status := func(id int64) string {
		t.Helper()
		var s string
		if err := db.QueryRowContext(ctx, "SELECT status FROM jobs WHERE id = ?", id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	exec("INSERT INTO tenants (tenant, created_at) VALUES ('a', UTC_TIMESTAMP(6)), ('b', UTC_TIMESTAMP(6)), ('c', UTC_TIMESTAMP(6))")

	pass(0) // an empty queue

	// Tenant a holds its one slot (a job another drainer dispatched): its lone queued job waits.
	busy := exec(`INSERT INTO jobs (tenant, status, version, attempt, queued_at, dispatched_at, lease_until, drainer_id)
		VALUES ('a', 'dispatched', 1, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, 'other')`)
	job := exec(`INSERT INTO jobs (tenant, payload, status, attempt, queued_at) VALUES ('a', '{"n":7}', 'queued', 2, UTC_TIMESTAMP(6))`)
	pass(0)
	if s := status(job); s != "queued" {
		t.Fatalf("job of a tenant at its cap is %s, want queued", s)
	}
	// The slot frees: the job is dispatched with its payload, as attempt 3 (two before it).
	exec("UPDATE jobs SET status = 'succeeded', version = version + 1 WHERE id = ?", busy)
	pass(1)
	got := sender.Dispatches()
	if len(got) != 1 || got[0].JobID != job || string(got[0].Payload) != `{"n":7}` || got[0].Attempt != 3 {
		t.Fatalf("dispatches %+v, want job %d with payload {\"n\":7} as attempt 3", got, job)
	}
	var attempt int
	if err := db.QueryRowContext(ctx, "SELECT attempt FROM jobs WHERE id = ?", job).Scan(&attempt); err != nil {
		t.Fatal(err)
	}
	if attempt != 3 || status(job) != "succeeded" {
		t.Fatalf("job is %s with attempt %d, want succeeded with attempt 3", status(job), attempt)
	}

	// A lone job whose rate key is gated waits; so does a lone job deferred past now.
	gated := exec("INSERT INTO jobs (tenant, rate_key_sha256, status, queued_at) VALUES ('b', ?, 'queued', UTC_TIMESTAMP(6))", gatedHash)
	pass(0)
	exec("UPDATE jobs SET status = 'canceled', version = version + 1 WHERE id = ?", gated)
	now, _ := fake.Now(ctx)
	deferred := exec("INSERT INTO jobs (tenant, status, queued_at, not_before) VALUES ('c', 'queued', UTC_TIMESTAMP(6), ?)", now.Add(time.Hour))
	pass(0)
	fake.Advance(time.Hour + time.Second)
	pass(1)
	if s := status(deferred); s != "succeeded" {
		t.Fatalf("deferred job is %s after its time came, want succeeded", s)
	}
	if n := len(sender.Dispatches()); n != 2 {
		t.Fatalf("%d dispatches, want 2", n)
	}
}

// TestPokedLoneClaimRoundTrips: after a Poke, a drainer that found the queue empty claims the
// lone job in two round trips (the claim lock, the in-flight counts and the probe; the claim and
// its commit), where a poll takes three (the probe first, on its own).
func TestPokedLoneClaimRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	counted, log := drainertest.CountedPool(t, db)
	exec := drainertest.NewHeld() // holds each dispatch, so that no outcome write joins the log
	d := drainertest.NewDrainer(t, drainer.Config{DB: counted, Executor: exec, Clock: clock.NewFake(time.Now()), ID: "poked"}, 10*time.Second)
	if _, err := db.ExecContext(ctx, "INSERT INTO tenants (tenant, created_at) VALUES ('a', UTC_TIMESTAMP(6))"); err != nil {
		t.Fatal(err)
	}
	if p, err := d.RunOnce(ctx); err != nil || p.Claimed != 0 {
		t.Fatalf("pass over the empty queue: claimed %d (%v)", p.Claimed, err)
	}
	for _, poked := range []bool{true, false} {
		if _, err := db.ExecContext(ctx, "INSERT INTO jobs (tenant, status, queued_at) VALUES ('a', 'queued', UTC_TIMESTAMP(6))"); err != nil {
			t.Fatal(err)
		}
		db.RecountQueues(t, "a")
		log.Reset()
		if poked {
			d.Poke()
		}
		if p, err := d.RunOnce(ctx); err != nil || p.Claimed != 1 {
			t.Fatalf("poked %v: claimed %d (%v), want the lone job", poked, p.Claimed, err)
		}
		var trips []string
		for _, q := range log.Take() {
			if !strings.HasPrefix(q, "INSERT INTO drainers") { // a heartbeat falling due
				trips = append(trips, q)
			}
		}
		want := 3
		if poked {
			want = 2
		}
		if len(trips) != want || strings.Contains(trips[0], "FOR UPDATE") != poked {
			t.Errorf("poked %v: %d round trips, want %d (the probe inside the first only when poked):\n%s",
				poked, len(trips), want, strings.Join(trips, "\n---\n"))
		}
		exec.Next(t)
		exec.Replies <- executor.Answer{Kind: executor.Done, Status: "succeeded"}
		wait.For(t, 10*time.Second, "the outcome to be recorded", func() (bool, error) {
			var n int
			err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE status = 'succeeded'").Scan(&n)
			return n >= 1 && d.InFlight() == 0, err
		})
		// The outcome's wake finds the queue empty again, so the next job is a lone one too.
		if p, err := d.RunOnce(ctx); err != nil || p.Claimed != 0 {
			t.Fatalf("pass after the outcome: claimed %d (%v)", p.Claimed, err)
		}
	}
}
