package status_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/recent"
	"github.com/sluicehq/sluice/gate/status"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/testdb"
)

// fakeGates is the gate store as status reads it: a fixed map of gated keys.
type fakeGates map[string]time.Time

func (g fakeGates) NotBefore(_ context.Context, hashes []string) (map[string]time.Time, error) {
	out := map[string]time.Time{}
	for _, h := range hashes {
		if t, ok := g[h]; ok {
			out[h] = t
		}
	}
	return out, nil
}

type fixture struct {
	t   *testing.T
	db  *testdb.DB
	now time.Time
}

func setup(t *testing.T) *fixture {
	t.Helper()
	return &fixture{t: t, db: testdb.New(t), now: clock.Trunc(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))}
}

func (f *fixture) exec(q string, args ...any) {
	f.t.Helper()
	if _, err := f.db.ExecContext(context.Background(), q, args...); err != nil {
		f.t.Fatalf("%s: %v", q, err)
	}
}

// drainer writes a heartbeat row: last heartbeat hb before now, last claim lc before now (<0:
// never), started an hour ago, poll period 1 s.
func (f *fixture) drainer(id string, hb, lc time.Duration, inFlight int) {
	var last any
	if lc >= 0 {
		last = f.now.Add(-lc)
	}
	f.exec(`INSERT INTO drainers (id, host, pid, version, started_at, heartbeat_at, last_poll_at, last_claim_at, in_flight, poll_interval_ms)
		VALUES (?, 'h', 1, 'test', ?, ?, ?, ?, ?, 1000)`, id, f.now.Add(-time.Hour), f.now.Add(-hb), f.now.Add(-hb), last, inFlight)
}

// job inserts a job of tenant in status, queued age before now.
func (f *fixture) job(tenant, status string, age time.Duration, rateKey any, notBefore any) {
	// Every job's tenant has a row (admission writes it; a later schema enforces it).
	f.exec(`INSERT INTO tenants (tenant, created_at) VALUES (?, ?) ON DUPLICATE KEY UPDATE tenant = tenant`, tenant, f.now)
	f.exec(`INSERT INTO jobs (tenant, rate_key_sha256, status, queued_at, not_before) VALUES (?, ?, ?, ?, ?)`,
		tenant, rateKey, status, f.now.Add(-age), notBefore)
	// A raw insert: admission counts the jobs it inserts into their tenant's queue state.
	if err := store.RecountQueues(context.Background(), f.db, tenant); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) read(gates status.RateGates) status.Status {
	f.t.Helper()
	r, err := status.New(status.Config{DB: f.db.DB, Clock: clock.NewFake(f.now), RateGates: gates,
		BrokerConnected: func() bool { return true }})
	if err != nil {
		f.t.Fatal(err)
	}
	s, err := r.Read(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

func state(t *testing.T, s status.Status, id string) status.Drainer {
	t.Helper()
	for _, d := range s.Drainers {
		if d.ID == id {
			return d
		}
	}
	t.Fatalf("drainer %s not in status %+v", id, s.Drainers)
	return status.Drainer{}
}

const keyA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

// TestDrainerStates derives each SPEC §6 state from database rows alone, at a fixed time.
func TestDrainerStates(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		arrange func(f *fixture)
		gates   status.RateGates
		want    string
		reason  string
	}{
		{name: "idle: no queued work", want: status.Idle,
			arrange: func(f *fixture) { f.drainer("d", 500*time.Millisecond, -1, 0) }},
		{name: "stalled: no heartbeat for 3 poll periods", want: status.Stalled, reason: "no heartbeat",
			arrange: func(f *fixture) { f.drainer("d", 3500*time.Millisecond, -1, 0) }},
		{name: "not stalled at 2.9 poll periods", want: status.Idle,
			arrange: func(f *fixture) { f.drainer("d", 2900*time.Millisecond, -1, 0) }},
		{name: "active: work in flight", want: status.Active,
			arrange: func(f *fixture) {
				f.drainer("d", 200*time.Millisecond, 30*time.Second, 1)
				f.job("acme", "running", time.Minute, nil, nil)
			}},
		{name: "active: claimed within the last poll period", want: status.Active,
			arrange: func(f *fixture) { f.drainer("d", 200*time.Millisecond, 800*time.Millisecond, 0) }},
		{name: "gated: every queued job's key is gated", want: status.Gated, gates: fakeGates{keyA: time.Date(2026, 3, 1, 13, 0, 0, 0, time.UTC)},
			arrange: func(f *fixture) {
				f.drainer("d", 200*time.Millisecond, time.Minute, 0)
				f.job("acme", "queued", time.Minute, keyA, nil)
				f.job("globex", "queued", time.Minute, keyA, nil)
			}},
		{name: "stalled: a gate that expired leaves eligible work unclaimed", want: status.Stalled, reason: "unclaimed",
			gates: fakeGates{keyA: time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC)},
			arrange: func(f *fixture) {
				f.drainer("d", 200*time.Millisecond, time.Minute, 0)
				f.job("acme", "queued", time.Minute, keyA, nil)
			}},
		{name: "gated: held by the job's own not-before", want: status.Gated,
			arrange: func(f *fixture) {
				f.drainer("d", 200*time.Millisecond, time.Minute, 0)
				f.job("acme", "queued", time.Minute, nil, time.Date(2026, 3, 1, 12, 0, 30, 0, time.UTC))
			}},
		{name: "gated: dispatch paused (global_in_flight 0)", want: status.Gated, reason: "paused",
			arrange: func(f *fixture) {
				f.exec(`INSERT INTO config_versions (version, config, changed_by, changed_at) VALUES (1, '{"global_in_flight":0}', 't', ?)`, f.now)
				f.drainer("d", 200*time.Millisecond, time.Minute, 0)
				f.job("acme", "queued", time.Minute, nil, nil)
			}},
		{name: "stalled: eligible work with free capacity unclaimed for 5 s", want: status.Stalled, reason: "unclaimed",
			arrange: func(f *fixture) {
				f.drainer("d", 200*time.Millisecond, 10*time.Second, 0)
				f.job("acme", "queued", 6*time.Second, nil, nil)
			}},
		{name: "not stalled: eligible for only 4 s", want: status.Active,
			arrange: func(f *fixture) {
				f.drainer("d", 200*time.Millisecond, 10*time.Second, 0)
				f.job("acme", "queued", 4*time.Second, nil, nil)
			}},
		{name: "not stalled: a job eligible only since its not-before passed 2 s ago", want: status.Active,
			arrange: func(f *fixture) {
				f.drainer("d", 200*time.Millisecond, 10*time.Second, 0)
				f.job("acme", "queued", time.Minute, nil, time.Date(2026, 3, 1, 11, 59, 58, 0, time.UTC))
			}},
		{name: "active: the queue waits for capacity held by slots", want: status.Active,
			arrange: func(f *fixture) {
				f.drainer("d", 200*time.Millisecond, time.Minute, 0)
				f.exec(`INSERT INTO slots (tenant, caller, lease_seconds, expires_at, created_at) VALUES
					('acme', 'p', 60, NOW(6) + INTERVAL 1 HOUR, NOW(6)), ('acme', 'p', 60, NOW(6) + INTERVAL 1 HOUR, NOW(6))`)
				f.job("acme", "queued", time.Minute, nil, nil)
			}},
		{name: "active: the queue waits for capacity held by another drainer", want: status.Active,
			arrange: func(f *fixture) {
				f.drainer("d", 200*time.Millisecond, time.Minute, 0)
				f.job("acme", "running", time.Minute, nil, nil)
				f.job("acme", "running", time.Minute, nil, nil)
				f.job("acme", "queued", time.Minute, nil, nil)
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			tc.arrange(f)
			d := state(t, f.read(tc.gates), "d")
			if d.State != tc.want || !strings.Contains(d.Reason, tc.reason) {
				t.Errorf("state %s (%s), want %s (reason containing %q)", d.State, d.Reason, tc.want, tc.reason)
			}
		})
	}
}

// TestStatusFigures checks the queue, tenant, gate, outbox and drainer figures of one read.
func TestStatusFigures(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.exec(`INSERT INTO config_versions (version, config, changed_by, changed_at) VALUES (3, '{"tenant_in_flight_overrides":{"globex":5},"tenant_weights":{"globex":2.5}}', 't', ?)`, f.now)
	f.job("acme", "queued", 90*time.Second, keyA, nil)
	f.job("acme", "queued", 10*time.Second, nil, nil)
	f.job("acme", "dispatched", 100*time.Second, nil, nil)
	f.job("globex", "queued", 30*time.Second, nil, nil)
	f.job("initech", "running", time.Second, nil, nil)
	f.job("initech", "succeeded", time.Hour, nil, nil)
	f.exec(`INSERT INTO outbox (subject, payload, created_at) VALUES ('s', 'p', ?), ('s', 'p', ?)`, f.now.Add(-7*time.Second), f.now.Add(-time.Second))
	f.exec(`INSERT INTO outbox (subject, payload, created_at, published_at) VALUES ('s', 'p', ?, ?)`, f.now.Add(-time.Hour), f.now)
	f.drainer("live", 100*time.Millisecond, 100*time.Millisecond, 2)
	f.drainer("gone", time.Hour, -1, 0)
	f.exec(`INSERT INTO drainers (id, host, pid, version, started_at, heartbeat_at, stopped_at) VALUES ('stopped', 'h', 2, 'v', ?, ?, ?)`, f.now, f.now, f.now)
	// Live slots (one naming two lanes), and an expired one that no longer counts.
	f.exec(`INSERT INTO slots (tenant, caller, lanes, interactive, lease_seconds, expires_at, created_at) VALUES
		('acme', 'p', 'gpu,search', 0, 60, NOW(6) + INTERVAL 1 HOUR, NOW(6)),
		('hooli', 'p', '', 1, 60, NOW(6) + INTERVAL 1 HOUR, NOW(6)),
		('hooli', 'p', 'search', 0, 60, NOW(6) - INTERVAL 1 SECOND, NOW(6))`)

	s := f.read(fakeGates{keyA: f.now.Add(time.Minute)})
	if s.Queue.Depth != 3 || s.Queue.OldestAgeSeconds != 90 || s.InFlight != 2 {
		t.Errorf("queue %+v in flight %d, want depth 3, oldest 90 s, 2 in flight", s.Queue, s.InFlight)
	}
	want := []status.Tenant{
		{Tenant: "acme", Depth: 2, OldestAgeSeconds: 90, InFlight: 1, Cap: 2, Slots: 1, Tier: config.DefaultTier, Weight: 1},
		{Tenant: "globex", Depth: 1, OldestAgeSeconds: 30, InFlight: 0, Cap: 5, Tier: config.DefaultTier, Weight: 2.5},
		{Tenant: "initech", Depth: 0, OldestAgeSeconds: 0, InFlight: 1, Cap: 2, Tier: config.DefaultTier, Weight: 1},
		{Tenant: "hooli", Depth: 0, OldestAgeSeconds: 0, InFlight: 0, Cap: 2, Slots: 1, Tier: config.DefaultTier, Weight: 1},
	}
	if s.Slots.Total != 2 || s.Slots.ByTier["default"] != 2 || s.Slots.ByLane["search"] != 1 || s.Slots.ByLane["gpu"] != 1 || len(s.Slots.ByLane) != 2 {
		t.Errorf("slots %+v", s.Slots)
	}
	if len(s.Tenants) != len(want) {
		t.Fatalf("tenants %+v, want %+v", s.Tenants, want)
	}
	for i := range want {
		if s.Tenants[i] != want[i] {
			t.Errorf("tenant %d = %+v, want %+v", i, s.Tenants[i], want[i])
		}
	}
	if len(s.Gates) != 1 || s.Gates[0].RateKeySHA256 != keyA || s.Gates[0].Queued != 1 || !s.Gates[0].NotBefore.Equal(f.now.Add(time.Minute)) {
		t.Errorf("gates %+v, want keyA gated for a minute with 1 queued", s.Gates)
	}
	if s.Outbox.Unpublished != 2 || s.Outbox.OldestUnpublishedAgeSeconds != 7 {
		t.Errorf("outbox %+v, want 2 unpublished, oldest 7 s", s.Outbox)
	}
	if len(s.Drainers) != 1 || s.Drainers[0].ID != "live" || s.Drainers[0].State != status.Active || s.Drainers[0].InFlight != 2 {
		t.Errorf("drainers %+v, want only 'live', active with 2 in flight (gone and stopped ones hidden)", s.Drainers)
	}
	if s.Config.Version != 3 || s.Config.Stale || !s.Broker.Connected || s.Memcached.Reachable {
		t.Errorf("config %+v broker %+v memcached %+v", s.Config, s.Broker, s.Memcached)
	}
}

// TestDeepestTenants: Read lists the ListTenants deepest tenants (ties by name) from the
// tenants rows, counts every tenant with work, and ReadTenants pages through all of them in
// either order, each page continuing after the previous one's last key.
func TestDeepestTenants(t *testing.T) {
	t.Parallel()
	f := setup(t)
	depths := map[string]int{"a": 3, "b": 3, "c": 3, "d": 2, "e": 1, "f": 1}
	for tenant, n := range depths {
		for i := range n {
			f.job(tenant, "queued", time.Duration(10+i)*time.Second, nil, nil)
		}
	}
	f.job("e", "running", time.Minute, nil, nil)
	f.job("idle", "succeeded", time.Minute, nil, nil)
	r, err := status.New(status.Config{DB: f.db.DB, Clock: clock.NewFake(f.now), ListTenants: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := r.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.TenantsWithWork != 6 || s.Queue.Depth != 13 || s.Queue.OldestAgeSeconds != 12 || s.InFlight != 1 {
		t.Errorf("tenants with work %d, queue %+v, in flight %d; want 6, depth 13, oldest 12 s, 1", s.TenantsWithWork, s.Queue, s.InFlight)
	}
	if len(s.Tenants) != 2 || s.Tenants[0].Tenant != "a" || s.Tenants[1].Tenant != "b" || s.Tenants[0].Depth != 3 || s.Tenants[0].OldestAgeSeconds != 12 {
		t.Errorf("tenants %+v, want a then b (depth 3, oldest 12 s)", s.Tenants)
	}
	for _, tc := range []struct {
		order string
		limit int
		want  [][]string
	}{
		{status.ByDepth, 2, [][]string{{"a", "b"}, {"c", "d"}, {"e", "f"}}},
		{status.ByDepth, 4, [][]string{{"a", "b", "c", "d"}, {"e", "f"}}},
		{status.ByDepth, 1, [][]string{{"a"}, {"b"}, {"c"}, {"d"}, {"e"}, {"f"}}},
		{status.ByName, 4, [][]string{{"a", "b", "c", "d"}, {"e", "f"}}},
		{"", 6, [][]string{{"a", "b", "c", "d", "e", "f"}}},
	} {
		var after *status.TenantKey
		var got [][]string
		for range 10 {
			p, err := r.ReadTenants(ctx, status.TenantsQuery{Order: tc.order, After: after, Limit: tc.limit})
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, row := range p.Tenants {
				names = append(names, row.Tenant)
				if row.Depth != depths[row.Tenant] || row.Tier != config.DefaultTier || row.Cap != 2 {
					t.Errorf("%s: row %+v, want depth %d, cap 2, tier default", tc.order, row, depths[row.Tenant])
				}
				if want := 0; row.Tenant == "e" {
					if row.InFlight != 1 {
						t.Errorf("tenant e in flight %d, want 1", row.InFlight)
					}
				} else if row.InFlight != want {
					t.Errorf("tenant %s in flight %d, want 0", row.Tenant, row.InFlight)
				}
			}
			got = append(got, names)
			if after = p.Next; after == nil {
				break
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("order %q limit %d: pages %v, want %v", tc.order, tc.limit, got, tc.want)
		}
	}
	if _, err := r.ReadTenants(ctx, status.TenantsQuery{Order: "size", Limit: 1}); !errors.Is(err, status.ErrOrder) {
		t.Errorf("order size: %v, want ErrOrder", err)
	}
}

// TestCapsAndRecent: the status carries the caps in force (the defaults, then a new version's)
// and the process's recent window as of the database time it was read at.
func TestCapsAndRecent(t *testing.T) {
	t.Parallel()
	f := setup(t)
	w := recent.New(recent.Config{Step: time.Second, Steps: 10})
	w.Finished(f.now.Add(-2 * time.Second))
	w.Dispatched(time.Second, f.now.Add(-2*time.Second))
	read := func() status.Status {
		t.Helper()
		r, err := status.New(status.Config{DB: f.db.DB, Clock: clock.NewFake(f.now), Recent: w})
		if err != nil {
			t.Fatal(err)
		}
		s, err := r.Read(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := read()
	if want := (status.Caps{GlobalInFlight: 4, TenantInFlight: 2, GlobalQueueDepth: 2000, TenantQueueDepth: 500}); s.Caps != want {
		t.Errorf("caps %+v, want the defaults %+v", s.Caps, want)
	}
	if len(s.Recent.Points) != 10 || s.Recent.Points[8].Finished != 1 || s.Recent.Points[8].Dispatched != 1 {
		t.Errorf("recent %+v, want 10 points with one end and one dispatch two steps back", s.Recent)
	}
	f.exec(`INSERT INTO config_versions (version, config, changed_by, changed_at) VALUES (1, '{"global_in_flight":9,"tenant_queue_depth":7}', 't', ?)`, f.now)
	if s := read(); s.Caps.GlobalInFlight != 9 || s.Caps.TenantQueueDepth != 7 {
		t.Errorf("caps %+v after a change, want global_in_flight 9 and tenant_queue_depth 7", s.Caps)
	}
}

// TestTenantGatedKeys: a tenants page names, per tenant, the gated keys among its first queued
// jobs (not a key whose gate has passed, nor a key deeper than HeadsPerTenant), in pages larger
// than one heads statement holds; and a query for one tenant returns its row alone, even
// without queued work.
func TestTenantGatedKeys(t *testing.T) {
	t.Parallel()
	f := setup(t)
	keyB, keyC := strings.Repeat("b", 64), strings.Repeat("c", 64)
	gates := fakeGates{keyA: f.now.Add(time.Hour), keyB: f.now.Add(time.Hour), keyC: f.now.Add(-time.Second)}
	f.job("acme", "queued", 30*time.Second, keyA, nil)
	f.job("acme", "queued", 20*time.Second, keyC, nil)
	f.job("acme", "queued", 10*time.Second, nil, nil)
	f.job("acme", "queued", 5*time.Second, keyB, nil) // fourth: past HeadsPerTenant 3
	f.job("globex", "queued", 10*time.Second, keyB, nil)
	f.job("globex", "queued", 10*time.Second, keyA, nil)
	f.job("initech", "queued", 10*time.Second, nil, nil)
	f.job("idle", "succeeded", time.Minute, keyA, nil)
	r, err := status.New(status.Config{DB: f.db.DB, Clock: clock.NewFake(f.now), RateGates: gates, HeadsPerTenant: 3, MaxTenants: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p, err := r.ReadTenants(ctx, status.TenantsQuery{Order: status.ByName, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, row := range p.Tenants {
		if row.GatedKeys == nil {
			t.Errorf("%s: gated_keys is nil, want a list", row.Tenant)
		}
		got[row.Tenant] = strings.Join(row.GatedKeys, ",")
	}
	want := map[string]string{"acme": keyA, "globex": keyA + "," + keyB, "initech": ""}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("gated keys %v, want %v", got, want)
	}
	for _, c := range []struct {
		tenant string
		depth  int
	}{{"globex", 2}, {"idle", 0}, {"nobody", -1}} {
		p, err := r.ReadTenants(ctx, status.TenantsQuery{Tenant: c.tenant, Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case c.depth < 0 && len(p.Tenants) != 0:
			t.Errorf("%s: %+v, want no row", c.tenant, p.Tenants)
		case c.depth >= 0 && (len(p.Tenants) != 1 || p.Tenants[0].Tenant != c.tenant || p.Tenants[0].Depth != c.depth || p.Next != nil):
			t.Errorf("%s: %+v (next %v), want its row alone with depth %d", c.tenant, p.Tenants, p.Next, c.depth)
		}
	}
}

// TestTiersAndLanes: /v1/status and the tenants pages show each tenant's tier from the runtime
// config and every configured lane with its limit and jobs in flight.
func TestTiersAndLanes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	testdb.SetLimits(t, f.db.DB, func(c *config.Config) {
		c.Lanes = map[string]int{"gpu": 2, "search": 5}
		c.TenantTiers = map[string]string{"g": "gold"}
	})
	f.job("g", "queued", time.Second, nil, nil)
	f.job("g", "running", time.Second, nil, nil)
	f.job("p", "queued", time.Second, nil, nil)
	f.exec("UPDATE jobs SET lanes = 'gpu,search' WHERE tenant = 'g' AND status = 'running'")
	f.job("p", "dispatched", time.Second, nil, nil)
	f.exec("UPDATE jobs SET lanes = 'gpu' WHERE tenant = 'p' AND status = 'dispatched'")
	s := f.read(nil)
	want := map[string]status.LaneUse{"gpu": {Limit: 2, InFlight: 2}, "search": {Limit: 5, InFlight: 1}}
	if fmt.Sprint(s.Lanes) != fmt.Sprint(want) {
		t.Errorf("status lanes %v, want %v", s.Lanes, want)
	}
	tiers := map[string]string{}
	for _, tn := range s.Tenants {
		tiers[tn.Tenant] = tn.Tier
	}
	if tiers["g"] != "gold" || tiers["p"] != config.DefaultTier {
		t.Errorf("status tiers %v, want g gold, p default", tiers)
	}
	r, err := status.New(status.Config{DB: f.db.DB, Clock: clock.NewFake(f.now)})
	if err != nil {
		t.Fatal(err)
	}
	p, err := r.ReadTenants(context.Background(), status.TenantsQuery{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Tenants) != 2 || p.Tenants[0].Tier != "gold" || p.Tenants[1].Tier != config.DefaultTier || fmt.Sprint(p.Lanes) != fmt.Sprint(want) {
		t.Errorf("tenants page %+v lanes %v", p.Tenants, p.Lanes)
	}
}
