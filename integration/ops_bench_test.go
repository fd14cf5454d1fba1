package integration_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/status"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/testdb"
)

// BenchmarkOpsStatusRead measures one GET /v1/status read (the same read every /metrics scrape
// does) against a backlog: 1,000,000 queued jobs of one tenant plus 1,000 tenants with 10 each,
// beside the same read of an empty queue, so the cost of a scrape under a large backlog is known.
func BenchmarkOpsStatusRead(b *testing.B) {
	db := testdb.New(b)
	ctx := context.Background()
	r, err := status.New(status.Config{DB: db.DB})
	if err != nil {
		b.Fatal(err)
	}
	measure := func(n int) time.Duration {
		var best time.Duration
		for i := 0; i < n; i++ {
			start := time.Now()
			if _, err := r.Read(ctx); err != nil {
				b.Fatal(err)
			}
			if d := time.Since(start); best == 0 || d < best {
				best = d
			}
		}
		return best
	}
	empty := measure(5)
	// In 100,000-row statements: one statement of a million rows outlasts the read timeout.
	qs := []string{`INSERT INTO tenants (tenant, created_at) SELECT CONCAT('t', seq), UTC_TIMESTAMP(6) FROM seq_0_to_999`,
		`INSERT INTO tenants (tenant, created_at) VALUES ('whale', UTC_TIMESTAMP(6))`,
		`INSERT INTO jobs (tenant, status, queued_at) SELECT CONCAT('t', seq DIV 10), 'queued', UTC_TIMESTAMP(6) FROM seq_0_to_9999`}
	for i := 0; i < 10; i++ {
		qs = append(qs, fmt.Sprintf(`INSERT INTO jobs (tenant, status, queued_at)
			SELECT 'whale', 'queued', UTC_TIMESTAMP(6) - INTERVAL (seq + %d) MICROSECOND FROM seq_1_to_100000`, i*100000))
	}
	for _, q := range qs {
		if _, err := db.ExecContext(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	if err := store.RecountQueues(ctx, db); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var full time.Duration
	for i := 0; i < b.N; i++ {
		full = measure(3)
	}
	b.StopTimer()
	harness.Emit("status_read", map[string]any{"queued": 1010000, "tenants": 1001, "read_ms": full.Milliseconds(),
		"empty_read_ms": float64(empty.Microseconds()) / 1000})
}
