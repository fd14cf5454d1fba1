package integration_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/testdb"
)

// rawTx times the same kind of work without sluice: a two-statement transaction (an UPDATE of
// one job row and an outbox INSERT) on the same database, as the reference for this run.
func rawTx(tb testing.TB, db *testdb.DB, n int) []time.Duration {
	tb.Helper()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "INSERT IGNORE INTO tenants (tenant, created_at) VALUES ('raw', UTC_TIMESTAMP(6))"); err != nil {
		tb.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO jobs (tenant, status, queued_at) VALUES ('raw', 'succeeded', UTC_TIMESTAMP(6))"); err != nil {
		tb.Fatal(err)
	}
	out := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		start := time.Now()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, "UPDATE jobs SET version = version + 1 WHERE tenant = 'raw'"); err != nil {
			tb.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO outbox (subject, payload, created_at) VALUES ('raw', 'x', UTC_TIMESTAMP(6))"); err != nil {
			tb.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			tb.Fatal(err)
		}
		out = append(out, time.Since(start))
	}
	return out
}

// rawDrain drains jobs jobs spread evenly over tenants tenants, into a fresh database with the
// same schema, without sluice: on one connection, one transaction per 64 jobs that marks the
// previous 64 succeeded and the next 64 (by id) dispatched, and commits. It is the drain's raw
// limit for this run: the schema's own cost of moving a job through a claim and an outcome (the
// row, its indexes and the tenant count the triggers keep) at sluice's batch size, without
// choosing, capping, fencing, auditing or the outbox. It returns jobs per second and the work
// per job (snapshotWork): the physical floor beside the drain's drain_work_per_job.
func rawDrain(tb testing.TB, tenants, jobs int) (float64, map[string]any) {
	tb.Helper()
	ctx := context.Background()
	db := testdb.New(tb)
	drainertest.QueueJobs(tb, db, tenants, jobs)
	// The jobs by id, read before the clock starts: ids are on the server's
	// auto_increment_increment (the cluster's size on Galera), not 1 apart.
	all := drainertest.QueryIDs(tb, db.DB, "SELECT id FROM jobs WHERE status = 'queued' ORDER BY id")
	if len(all) != jobs {
		tb.Fatalf("%d jobs queued, want %d", len(all), jobs)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close()
	const batch = 64
	ids := func(from int, n int) string {
		var b strings.Builder
		for i, id := range all[from : from+n] {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprint(&b, id)
		}
		return b.String()
	}
	before := snapshotWork(tb, db.DB)
	start := time.Now()
	for off := 0; off < jobs+batch; off += batch {
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			tb.Fatal(err)
		}
		if off > 0 {
			if _, err := tx.ExecContext(ctx, `UPDATE jobs SET status = 'succeeded', version = version + 1,
				finished_at = UTC_TIMESTAMP(6), lease_until = NULL WHERE id IN (`+ids(off-batch, min(batch, jobs-(off-batch)))+")"); err != nil {
				tb.Fatal(err)
			}
		}
		if off < jobs {
			// As a claim does since migration 0025, in one round trip: the trigger leaves the
			// jobs stamped with @sluice_claim_stamp to the one UPDATE of their tenants' counts.
			in := ids(off, min(batch, jobs-off))
			if _, err := tx.ExecContext(ctx, `SET @sluice_claim_stamp = UTC_TIMESTAMP(6);
				UPDATE jobs SET status = 'dispatched', version = version + 1,
				attempt = attempt + 1, claimed_at = @sluice_claim_stamp, dispatched_at = @sluice_claim_stamp,
				lease_until = @sluice_claim_stamp + INTERVAL 5 MINUTE, drainer_id = 'raw'
				WHERE id IN (`+in+`) AND status = 'queued';
				UPDATE tenants t JOIN (SELECT tenant, COUNT(*) AS n FROM jobs FORCE INDEX (PRIMARY)
				WHERE id IN (`+in+`) AND claimed_at = @sluice_claim_stamp GROUP BY tenant) c ON c.tenant = t.tenant
				SET t.head_id = IF(t.queued = c.n, NULL, t.head_id), t.head_at = IF(t.queued = c.n, NULL, t.head_at),
				t.queued = t.queued - c.n`); err != nil {
				tb.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			tb.Fatal(err)
		}
	}
	el := time.Since(start)
	w := snapshotWork(tb, db.DB).perJob(before, jobs)
	var left int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE status <> 'succeeded'").Scan(&left); err != nil {
		tb.Fatal(err)
	}
	if left != 0 {
		tb.Fatalf("the raw drain left %d of %d jobs unfinished", left, jobs)
	}
	return float64(jobs) / el.Seconds(), w
}

// claimLatency measures RunOnce passes that each claim one freshly queued job of tenant "b".
func claimLatency(b *testing.B, db *testdb.DB, n int) []time.Duration {
	ctx := context.Background()
	recorded := make(chan int64, 1)
	d, err := drainer.New(drainer.Config{DB: db.DB, Executor: &drainertest.Executor{}, ID: "bench",
		Observer: drainer.ObserverFuncs{OnRecorded: func(id int64) { recorded <- id }}})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Stop(ctx)
	if _, err := db.ExecContext(ctx, "INSERT IGNORE INTO tenants (tenant, created_at) VALUES ('a', UTC_TIMESTAMP(6)), ('b', UTC_TIMESTAMP(6))"); err != nil {
		b.Fatal(err)
	}
	out := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		if _, err := db.ExecContext(ctx, "INSERT INTO jobs (tenant, status, queued_at) VALUES ('b', 'queued', UTC_TIMESTAMP(6))"); err != nil {
			b.Fatal(err)
		}
		db.RecountQueues(b, "b")
		start := time.Now()
		p, err := d.RunOnce(ctx)
		el := time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		if p.Claimed != 1 {
			b.Fatalf("pass claimed %d jobs, want 1", p.Claimed)
		}
		out = append(out, el)
		<-recorded
	}
	return out
}

// BenchmarkClaimBacklog compares the cost of a drain pass that claims one job of tenant b with an
// empty queue and with 1,000,000 queued jobs of tenant a, which is at its cap (SPEC §14: within
// 2x).
func BenchmarkClaimBacklog(b *testing.B) {
	ctx := context.Background()
	db := testdb.New(b)
	const samples = 300
	raw := rawTx(b, db, samples)
	empty := claimLatency(b, db, samples)

	// Tenant a: 2 jobs running (its cap) under a lease that will not expire during the run, and
	// a million queued behind them.
	if _, err := db.ExecContext(ctx, `INSERT INTO jobs (tenant, status, queued_at, dispatched_at, lease_until, drainer_id)
		SELECT 'a', 'running', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 DAY, 'elsewhere' FROM seq_1_to_2`); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	for off := 0; off < 1_000_000; off += 100_000 {
		if _, err := db.ExecContext(ctx, `INSERT INTO jobs (tenant, status, queued_at)
			SELECT 'a', 'queued', UTC_TIMESTAMP(6) - INTERVAL seq MICROSECOND FROM seq_1_to_100000`); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("inserted 1,000,000 queued jobs in %s", time.Since(start))
	db.RecountQueues(b, "a")
	backlog := claimLatency(b, db, samples)
	e := harness.Percentiles(empty, 50, 99)
	f := harness.Percentiles(backlog, 50, 99)
	r := harness.Percentiles(raw, 50, 99)
	harness.Emit("claim_latency", map[string]any{
		"samples": samples, "empty_p50_ms": e[0], "empty_p99_ms": e[1],
		"backlog_1m_p50_ms": f[0], "backlog_1m_p99_ms": f[1],
		"ratio_p50": round2(f[0] / e[0]), "ratio_p99": round2(f[1] / e[1]),
		"raw_two_statement_tx_p50_ms": r[0], "pass_over_raw_tx_p50": round2(e[0] / r[0]),
	})
}

func round2(x float64) float64 { return float64(int(x*100+0.5)) / 100 }

// BenchmarkDrainThroughput drains 20,000 queued jobs over 64 tenants (SLUICE_BENCH_DRAIN_TENANTS
// for another number: drainTenants) with caps raised to 64 and
// an executor that finishes every job at once, checking the caps still held in the database. It
// drains twice, each time into a fresh database: with Go code on one thread, as a drainer-only
// process runs it (`sluice serve --drainer`, see oneProcForDrainer in cmd/sluice), and with
// every P this process has, as a drainer sharing a process with the API runs. Each drain is
// followed by the same drain with the audit trail off (drainer.Config.AuditOff): audit_ratio is
// the rate with the audit over the rate without (issue 19: at least 0.85). drain_work_per_job
// gives what the server and this process did per job in the one-P drains, with the audit and
// without (work: comparable across builds on a private server, see BENCHMARKS.md), and the raw
// drain's (raw_drain_work: the schema's floor).
func BenchmarkDrainThroughput(b *testing.B) {
	for range b.N {
		tenants := drainTenants()
		all := runtime.GOMAXPROCS(1)
		one, raw := drainThroughput(b, tenants, drainJobs, 0, false)
		rawRate, rawWork := rawDrain(b, tenants, drainJobs)
		oneOff, _ := drainThroughput(b, tenants, drainJobs, 0, true)
		runtime.GOMAXPROCS(all)
		many, _ := drainThroughput(b, tenants, drainJobs, 0, false)
		manyOff, _ := drainThroughput(b, tenants, drainJobs, 0, true)
		r := harness.Percentiles(raw, 50)
		rate := func(d drained) float64 { return float64(drainJobs) / d.el.Seconds() }
		fields := map[string]any{
			"jobs": drainJobs, "tenants": tenants, "caps": 64, "gomaxprocs": 1, "seconds": round2(one.el.Seconds()),
			"jobs_per_s": int(rate(one)), "peak_in_flight": one.peak,
			"all_procs": all, "all_procs_jobs_per_s": int(rate(many)),
			"all_procs_peak_in_flight":    many.peak,
			"raw_two_statement_tx_p50_ms": r[0], "raw_tx_per_s_one_client": int(1000 / r[0]),
			"audit_off_jobs_per_s": int(rate(oneOff)), "audit_ratio": benchRound3(rate(one) / rate(oneOff)),
			"all_procs_audit_off_jobs_per_s": int(rate(manyOff)), "all_procs_audit_ratio": benchRound3(rate(many) / rate(manyOff)),
			"audit_target_ratio":   0.85,
			"raw_drain_jobs_per_s": int(rawRate), "ratio_to_raw_drain": benchRound3(rate(one) / rawRate),
		}
		harness.Emit("drain_throughput", fields)
		harness.Emit("drain_work_per_job", map[string]any{"jobs": drainJobs, "gomaxprocs": 1, "work": one.work,
			"audit_off_work": oneOff.work, "all_procs": all, "all_procs_work": many.work, "raw_drain_work": rawWork})
	}
}

const drainJobs = 20000

type drained struct {
	el   time.Duration
	peak int64          // the most jobs in flight at once (drainertest.PeakInFlight)
	work map[string]any // per job, during the drain
}

// drainThroughput drains jobs jobs, spread evenly over tenants tenants, into a fresh database
// with caps 64, beside slots live slots of another tenant held all along, with the audit trail
// off if auditOff, and returns how long it took, the most jobs it had in flight at once (-1 with
// the audit off: there is no trail to replay, and a sampler would slow only that drain; the
// claims are the same code either way), the work per job, and the raw transaction times
// measured on the same database before the drain.
func drainThroughput(b *testing.B, tenants, jobs, slots int, auditOff bool) (drained, []time.Duration) {
	ctx := context.Background()
	db := testdb.New(b)
	testdb.SetLimits(b, db.DB, func(c *config.Config) { c.GlobalInFlight, c.TenantInFlight = 64, 64 })
	drainertest.QueueJobs(b, db, tenants, jobs)
	for range slots {
		if _, err := db.ExecContext(ctx, `INSERT INTO slots (tenant, caller, lease_seconds, expires_at, created_at)
			VALUES ('holder', 'bench', 900, NOW(6) + INTERVAL 1 HOUR, NOW(6))`); err != nil {
			b.Fatal(err)
		}
	}
	raw := rawTx(b, db, 300)
	s := &drainertest.Executor{}
	d, err := drainer.New(drainer.Config{DB: db.DB, Executor: s, ID: "bench", AuditOff: auditOff})
	if err != nil {
		b.Fatal(err)
	}
	before := snapshotWork(b, db.DB)
	start := time.Now()
	stop := drainertest.Run(b, d)
	// Wait on the executor's own count (in memory) so that the wait itself does not load the
	// database, then for the last outcomes to commit.
	harness.WaitFor(b, 10*time.Minute, "every job to be dispatched", func() (bool, error) {
		return s.Answered() >= int64(jobs), nil
	})
	harness.WaitFor(b, time.Minute, "the last outcomes to commit", func() (bool, error) {
		var left int
		err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE status IN ('queued','claimed','dispatched','running')").Scan(&left)
		return left == 0, err
	})
	el := time.Since(start)
	w := snapshotWork(b, db.DB).perJob(before, jobs)
	stop()
	d.Stop(ctx)
	peak := int64(-1)
	if !auditOff {
		if peak = drainertest.PeakInFlight(b, db); peak > int64(64-slots) {
			b.Errorf("the database held %d jobs in flight at once beside %d slots; cap 64", peak, slots)
		}
	}
	return drained{el: el, peak: peak, work: w}, raw
}

// drainTenants is the tenants BenchmarkDrainThroughput spreads its jobs over: 64, or
// SLUICE_BENCH_DRAIN_TENANTS. With 64 each claim of 64 takes one job a tenant; with fewer, several,
// which is where a claim counts its tenants itself (store.ClaimJobs, migration 0025).
func drainTenants() int {
	if v, err := strconv.Atoi(os.Getenv("SLUICE_BENCH_DRAIN_TENANTS")); err == nil && v > 0 {
		return v
	}
	return 64
}
