package integration_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/gate/opsmetrics"
	"github.com/sluicehq/sluice/gate/status"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/testdb"
)

// timeRuns runs f n times and returns each run's duration.
func timeRuns(tb testing.TB, n int, f func() error) []time.Duration {
	tb.Helper()
	ds := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if err := f(); err != nil {
			tb.Fatal(err)
		}
		ds = append(ds, time.Since(start))
	}
	return ds
}

// queueDepthReads times the two ways of reading the global queue depth: SUM(queued) over the
// tenants with work on the depth index (what status reads), and COUNT(*) of queued jobs on the
// claim index. Best of 5, in ms.
func queueDepthReads(tb testing.TB, db *sql.DB, depth int) (sumMS, countMS float64) {
	tb.Helper()
	ctx := context.Background()
	best := func(q string) float64 {
		var min time.Duration
		for _, d := range timeRuns(tb, 5, func() error {
			var n int
			if err := db.QueryRowContext(ctx, q).Scan(&n); err != nil {
				return err
			}
			if n != depth {
				return fmt.Errorf("%s: %d, want %d", q, n, depth)
			}
			return nil
		}) {
			if min == 0 || d < min {
				min = d
			}
		}
		return float64(min.Microseconds()) / 1000
	}
	return best(`SELECT COALESCE(SUM(queued), 0) FROM tenants FORCE INDEX (depth) WHERE queued > 0`),
		best(`SELECT COUNT(*) FROM jobs FORCE INDEX (claim) WHERE status = 'queued'`)
}

// BenchmarkStatusTenants measures GET /v1/status's read, an uncached /metrics scrape (the
// same read plus the collector) and a 1,000-tenant page of GET /v1/tenants?order=depth with
// 100,000 tenants with one queued job each (SPEC §14: status and a scrape within 50 ms).
func BenchmarkStatusTenants(b *testing.B) {
	const tenants, runs = 100000, 50
	db := testdb.New(b)
	ctx := context.Background()
	start := time.Now()
	addTenants(b, db.DB, "b", 0, tenants)
	fill := time.Since(start)
	r, err := status.New(status.Config{DB: db.DB})
	if err != nil {
		b.Fatal(err)
	}
	c, err := opsmetrics.New(opsmetrics.Config{Status: r, CacheFor: time.Nanosecond}) // every scrape reads
	if err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	s, err := r.Read(ctx) // warm
	if err != nil {
		b.Fatal(err)
	}
	if s.TenantsWithWork != tenants || s.Queue.Depth != tenants {
		b.Fatalf("status counts %d tenants, depth %d; want %d", s.TenantsWithWork, s.Queue.Depth, tenants)
	}
	b.ResetTimer()
	var reads, scrapes, pages []time.Duration
	for range b.N {
		reads = timeRuns(b, runs, func() error { _, err := r.Read(ctx); return err })
		scrapes = timeRuns(b, runs, func() error { _, err := reg.Gather(); return err })
		pages = timeRuns(b, runs, func() error {
			_, err := r.ReadTenants(ctx, status.TenantsQuery{Order: status.ByDepth, Limit: 1000})
			return err
		})
	}
	b.StopTimer()
	sumMS, countMS := queueDepthReads(b, db.DB, tenants)
	rp, sp, pp := harness.Percentiles(reads, 50, 99), harness.Percentiles(scrapes, 50, 99), harness.Percentiles(pages, 50, 99)
	harness.Emit("status_tenants", map[string]any{"tenants": tenants, "queued": tenants, "runs": runs,
		"read_p50_ms": rp[0], "read_p99_ms": rp[1], "scrape_p50_ms": sp[0], "scrape_p99_ms": sp[1],
		"tenants_page_1000_p50_ms": pp[0], "tenants_page_1000_p99_ms": pp[1],
		"depth_sum_ms": sumMS, "depth_count_ms": countMS, "fill_s": fill.Seconds()})
}

// BenchmarkStatusDeepTenants is the other shape of the depth comparison: 64 tenants with
// 100,000 queued jobs each (SLUICE_BENCH_DEEP_JOBS sets another number: the fill runs the jobs
// triggers once per job, minutes on a loaded machine), where COUNT(*) over the claim index reads
// every queued job and SUM(queued) over the depth index 64 entries. It also times the status
// read there.
func BenchmarkStatusDeepTenants(b *testing.B) {
	const tenants = 64
	each := 100000
	if v := os.Getenv("SLUICE_BENCH_DEEP_JOBS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("SLUICE_BENCH_DEEP_JOBS=%q: want a positive number", v)
		}
		each = n
	}
	db := testdb.New(b)
	ctx := context.Background()
	// The fill's own pool, without the 30 s read timeout of testdb's: a 10,000-row INSERT with
	// its triggers outlasts it when the machine is busy.
	cfg, err := mysql.ParseDSN(db.DSN)
	if err != nil {
		b.Fatal(err)
	}
	cfg.ReadTimeout = 30 * time.Minute
	fillDB, err := store.Open(ctx, cfg.FormatDSN())
	if err != nil {
		b.Fatal(err)
	}
	defer fillDB.Close()
	start := time.Now()
	if _, err := fillDB.ExecContext(ctx, `INSERT INTO tenants (tenant, created_at)
		SELECT CONCAT('d', LPAD(seq, 2, '0')), UTC_TIMESTAMP(6) FROM seq_0_to_63`); err != nil {
		b.Fatal(err)
	}
	const chunk = 10000
	for t := range tenants {
		for lo := 0; lo < each; lo += chunk {
			if _, err := fillDB.ExecContext(ctx, fmt.Sprintf(`INSERT INTO jobs (tenant, status, queued_at)
				SELECT 'd%02d', 'queued', UTC_TIMESTAMP(6) - INTERVAL seq MICROSECOND FROM seq_%d_to_%d`, t, lo+1, min(lo+chunk, each))); err != nil {
				b.Fatal(err)
			}
		}
	}
	fill := time.Since(start)
	if err := store.RecountQueues(ctx, fillDB); err != nil {
		b.Fatal(err)
	}
	r, err := status.New(status.Config{DB: db.DB})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var reads []time.Duration
	for range b.N {
		reads = timeRuns(b, 20, func() error { _, err := r.Read(ctx); return err })
	}
	b.StopTimer()
	sumMS, countMS := queueDepthReads(b, db.DB, tenants*each)
	rp := harness.Percentiles(reads, 50, 99)
	harness.Emit("status_deep_tenants", map[string]any{"tenants": tenants, "queued": tenants * each,
		"read_p50_ms": rp[0], "read_p99_ms": rp[1], "depth_sum_ms": sumMS, "depth_count_ms": countMS, "fill_s": fill.Seconds()})
}
