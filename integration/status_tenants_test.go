package integration_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/gate/opsmetrics"
	"github.com/sluicehq/sluice/gate/status"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/apitest"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/testdb"
)

// addTenants inserts n tenants named prefix + a 6-digit number from first on, each with one
// queued job, in multi-row INSERTs of 1,000 rows: the tenants rows first, then the jobs, whose
// triggers keep each tenant's queued count and head (migration 0010). Job i is queued i µs
// before now, so the tenant numbered first is the youngest.
func addTenants(tb testing.TB, db *sql.DB, prefix string, first, n int) {
	tb.Helper()
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)
	for lo := first; lo < first+n; lo += 1000 {
		hi := min(lo+1000, first+n)
		tenants := make([]any, 0, 2*(hi-lo))
		jobs := make([]any, 0, 2*(hi-lo))
		for i := lo; i < hi; i++ {
			name := fmt.Sprintf("%s%06d", prefix, i)
			tenants = append(tenants, name, now)
			jobs = append(jobs, name, now.Add(-time.Duration(i)*time.Microsecond))
		}
		rows := strings.TrimSuffix(strings.Repeat("(?, ?),", hi-lo), ",")
		if _, err := db.ExecContext(ctx, "INSERT INTO tenants (tenant, created_at) VALUES "+rows, tenants...); err != nil {
			tb.Fatalf("insert tenants: %v", err)
		}
		jrows := strings.TrimSuffix(strings.Repeat("(?, 'queued', ?),", hi-lo), ",")
		if _, err := db.ExecContext(ctx, "INSERT INTO jobs (tenant, status, queued_at) VALUES "+jrows, jobs...); err != nil {
			tb.Fatalf("insert jobs: %v", err)
		}
	}
	if err := store.RecountQueues(ctx, db); err != nil {
		tb.Fatal(err)
	}
}

// gatherStatus scrapes a fresh collector over r and returns each gauge's value by its name and
// labels, e.g. `sluice_tenant_queue_depth{tenant="other"}`.
func gatherStatus(tb testing.TB, r opsmetrics.Reader) map[string]float64 {
	tb.Helper()
	c, err := opsmetrics.New(opsmetrics.Config{Status: r, Timeout: 30 * time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			out[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = m.GetGauge().GetValue()
		}
	}
	return out
}

// TestStatusManyTenants: with 3,000 tenants with work, GET /v1/status lists the 100 deepest
// and counts all of them, GET /v1/tenants pages through every one in either order, and a
// /metrics scrape's per-tenant series (20 and "other") add up to the queue depth.
func TestStatusManyTenants(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	ctx := context.Background()
	addTenants(t, f.DB.DB, "m", 0, 3000)
	f.FillQueued(t, "deep-a", 5, "queued")
	f.FillQueued(t, "deep-b", 3, "queued")
	f.FillQueued(t, "m000007", 1, "running")
	const depth, withWork = 3008, 3002

	st, err := f.Admin.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Queue.Depth != depth || st.TenantsWithWork != withWork || st.InFlight != 1 || st.Queue.OldestAgeSeconds <= 0 {
		t.Errorf("queue %+v, %d tenants with work, %d in flight; want depth %d, %d, 1, an oldest age", st.Queue, st.TenantsWithWork, st.InFlight, depth, withWork)
	}
	if len(st.Tenants) != 100 {
		t.Fatalf("%d tenants listed, want the 100 deepest", len(st.Tenants))
	}
	want := []string{"deep-a", "deep-b", "m000007", "m000000", "m000001"} // depth, then in flight, then name
	for i, name := range want {
		if st.Tenants[i].Tenant != name {
			t.Errorf("tenant %d is %+v, want %s", i, st.Tenants[i], name)
		}
	}
	if last := st.Tenants[99]; last.Tenant != "m000097" || last.Depth != 1 {
		t.Errorf("100th tenant %+v, want m000097 with depth 1", last)
	}

	for _, o := range []client.TenantsOptions{{Order: "depth", Limit: 1000}, {Order: "name", Limit: 700}, {}} {
		seen := map[string]bool{}
		sum, pages := 0, 0
		var first string
		for {
			p, err := f.Admin.Tenants(ctx, o)
			if err != nil {
				t.Fatalf("%+v: %v", o, err)
			}
			pages++
			for _, row := range p.Tenants {
				if seen[row.Tenant] {
					t.Fatalf("%+v: tenant %s listed twice", o, row.Tenant)
				}
				if first == "" {
					first = row.Tenant
				}
				seen[row.Tenant] = true
				sum += row.Depth
				if row.Tenant == "m000007" && row.InFlight != 1 {
					t.Errorf("m000007 in flight %d, want 1", row.InFlight)
				}
			}
			if o.Cursor = p.NextCursor; o.Cursor == "" {
				break
			}
		}
		const wantFirst = "deep-a" // the deepest, and "deep-" sorts before "m"
		if len(seen) != withWork || sum != depth || first != wantFirst {
			t.Errorf("order %q: %d tenants over %d pages, depth %d, first %s; want %d, %d, %s", o.Order, len(seen), pages, sum, first, withWork, depth, wantFirst)
		}
	}

	r, err := status.New(status.Config{DB: f.DB.DB})
	if err != nil {
		t.Fatal(err)
	}
	m := gatherStatus(t, r)
	total, series := 0.0, 0
	for k, v := range m {
		if strings.HasPrefix(k, "sluice_tenant_queue_depth{") {
			total += v
			series++
		}
	}
	if m["sluice_queue_depth{}"] != depth || total != depth || series != 21 || m[`sluice_tenant_queue_depth{tenant="other"}`] != depth-5-3-1-17 {
		t.Errorf("scrape: queue depth %g, tenant series %d summing to %g, other %g; want %d, 21 (20 + other), %d, %d",
			m["sluice_queue_depth{}"], series, total, m[`sluice_tenant_queue_depth{tenant="other"}`], depth, depth, depth-5-3-1-17)
	}
}

// TestStatusStatementSize: no statement the status read, a scrape or a full page of
// GET /v1/tenants sends exceeds 64 KiB, and the longest statement text is the same with 50
// tenants with work as with 5,000: nothing is built per tenant.
func TestStatusStatementSize(t *testing.T) {
	t.Parallel()
	tdb := testdb.New(t)
	ctx := context.Background()
	db, log := drainertest.CountedPool(t, tdb)
	log.OnlyLongest = true
	r, err := status.New(status.Config{DB: db})
	if err != nil {
		t.Fatal(err)
	}
	reads := func(tenants int) (maxText int) {
		t.Helper()
		log.Sizes()
		s, err := r.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if s.TenantsWithWork != tenants || s.Queue.Depth != tenants {
			t.Fatalf("status counts %d tenants, depth %d; want %d", s.TenantsWithWork, s.Queue.Depth, tenants)
		}
		gatherStatus(t, r)
		for _, order := range []string{status.ByDepth, status.ByName} {
			if _, err := r.ReadTenants(ctx, status.TenantsQuery{Order: order, Limit: 1000}); err != nil {
				t.Fatal(err)
			}
		}
		n, maxText, maxSent := log.Sizes()
		if n < 8 || maxText == 0 {
			t.Fatalf("%d statements logged (longest %d bytes): the log does not see the reads", n, maxText)
		}
		if maxSent > 64<<10 {
			t.Errorf("with %d tenants a statement of about %d bytes was sent, over 64 KiB", tenants, maxSent)
		}
		t.Logf("%d tenants: %d statements, longest text %d bytes, longest sent about %d bytes", tenants, n, maxText, maxSent)
		return maxText
	}
	addTenants(t, tdb.DB, "s", 0, 50)
	few := reads(50)
	addTenants(t, tdb.DB, "s", 50, 4950)
	if many := reads(5000); many != few {
		t.Errorf("longest statement text %d bytes with 5,000 tenants, %d with 50: it grows with the tenants", many, few)
	}
}
