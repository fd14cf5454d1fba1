package drainer_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/testdb"
)

// gatedKey is a gate store in which one rate key is gated for a day and every other key is not.
type gatedKey struct{ hash string }

func (g gatedKey) NotBefore(_ context.Context, hashes []string) (map[string]time.Time, error) {
	out := map[string]time.Time{}
	for _, h := range hashes {
		if h == g.hash {
			out[h] = time.Now().Add(24 * time.Hour)
		}
	}
	return out, nil
}

func (gatedKey) Extend(context.Context, string, int) (time.Time, error) { return time.Time{}, nil }

// TestClaimReachesTenantsBehindGatedOnes: a tenant whose job is eligible is claimed within a few
// passes even behind more tenants whose every job is gated than one pass reads (SPEC §5: a gated
// key never blocks anyone else). With caps of 4 a page holds 8 tenants and a pass at most 4 pages;
// 100 tenants of one gated key come first in the ordering, and the eligible tenant last. A pass
// that runs out of pages leaves its position, and the next goes on from there.
func TestClaimReachesTenantsBehindGatedOnes(t *testing.T) {
	for _, ordering := range []config.Ordering{config.Fair, config.FIFO, config.RoundRobin} {
		t.Run(string(ordering), func(t *testing.T) {
			ctx := context.Background()
			db := testdb.New(t)
			testdb.SetLimits(t, db.DB, func(c *config.Config) { c.GlobalInFlight, c.TenantInFlight, c.Ordering = 4, 2, ordering })
			key := strings.Repeat("ab", 32)
			tenants, jobs := "INSERT INTO tenants (tenant, created_at) VALUES ('z-late', UTC_TIMESTAMP(6))", "INSERT INTO jobs (tenant, rate_key_sha256, status, queued_at) VALUES "
			var targs, jargs []any
			for i := range 100 {
				tenants += ", (?, UTC_TIMESTAMP(6))"
				name := fmt.Sprintf("g%03d", i)
				targs = append(targs, name)
				if i > 0 {
					jobs += ", "
				}
				jobs += "(?, ?, 'queued', UTC_TIMESTAMP(6) - INTERVAL ? SECOND)"
				jargs = append(jargs, name, key, 1000-i)
			}
			if _, err := db.ExecContext(ctx, tenants, targs...); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, jobs, jargs...); err != nil {
				t.Fatal(err)
			}
			res, err := db.ExecContext(ctx, "INSERT INTO jobs (tenant, status, queued_at) VALUES ('z-late', 'queued', UTC_TIMESTAMP(6))")
			if err != nil {
				t.Fatal(err)
			}
			late, _ := res.LastInsertId()
			db.RecountQueues(t)

			d := drainertest.NewDrainer(t, drainer.Config{DB: db.DB, Executor: &drainertest.Executor{}, ID: "behind", RateGates: gatedKey{hash: key},
				Clock: clock.NewFake(time.Now())}, 10*time.Second)
			for pass := 1; ; pass++ {
				if _, err := d.RunOnce(ctx); err != nil {
					t.Fatal(err)
				}
				if status := drainertest.JobStatus(t, db, late); status != "queued" {
					t.Logf("the eligible job left the queue (%s) in pass %d", status, pass)
					break
				}
				if pass == 8 {
					t.Fatalf("the eligible job behind 100 gated tenants is still queued after %d passes", pass)
				}
			}
			var gated int
			if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE rate_key_sha256 = ? AND status = 'queued'", key).Scan(&gated); err != nil {
				t.Fatal(err)
			}
			if gated != 100 {
				t.Fatalf("%d of the gated key's 100 jobs are still queued", gated)
			}
		})
	}
}
