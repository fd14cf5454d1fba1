package store_test

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// TestTenantReads: the reads of the tenants' queue state for status and GET /v1/tenants return
// what the jobs say, in each order's sequence, and lock nothing.
func TestTenantReads(t *testing.T) {
	k := newFixture(t)
	old := k.now.Add(-time.Minute)
	var jobs []int64
	add := func(tenant string, n int, at time.Time) {
		for range n {
			jobs = append(jobs, k.insert(jobSpec{tenant: tenant, queuedAt: at}))
		}
	}
	add("a", 3, k.now)
	add("b", 1, old)
	add("c", 3, k.now)
	add("d", 2, k.now)
	jobs = append(jobs, k.insert(jobSpec{tenant: "a", status: job.Running}), k.insert(jobSpec{tenant: "e", status: job.Dispatched}),
		k.insert(jobSpec{tenant: "e", status: job.Claimed}), k.insert(jobSpec{tenant: "f", status: job.Succeeded}))
	tx := k.begin()
	names := func(ts []store.TenantQueue) []string {
		var out []string
		for _, t := range ts {
			out = append(out, t.Tenant)
		}
		return out
	}
	for _, c := range []struct {
		name string
		p    store.TenantQueuesParams
		want []string
	}{
		{"by name", store.TenantQueuesParams{By: store.ByName, Limit: 10}, []string{"a", "b", "c", "d"}},
		{"by name, after b", store.TenantQueuesParams{By: store.ByName, After: "b", Limit: 2}, []string{"c", "d"}},
		{"below depth 3", store.TenantQueuesParams{By: store.BelowDepth, Depth: 3, Limit: 10}, []string{"d", "b"}},
		{"below depth 4, two", store.TenantQueuesParams{By: store.BelowDepth, Depth: 4, Limit: 2}, []string{"c", "a"}},
		{"at depth 3", store.TenantQueuesParams{By: store.AtDepth, Depth: 3, Limit: 1}, []string{"a"}},
		{"at depth 3 after a", store.TenantQueuesParams{By: store.AtDepthAfter, Depth: 3, After: "a", Limit: 5}, []string{"c"}},
		{"one tenant with work", store.TenantQueuesParams{By: store.One, After: "d", Limit: 1}, []string{"d"}},
		{"one tenant without", store.TenantQueuesParams{By: store.One, After: "f", Limit: 1}, []string{"f"}},
		{"one tenant never seen", store.TenantQueuesParams{By: store.One, After: "zz", Limit: 1}, nil},
	} {
		got, err := store.ReadTenantQueues(k.ctx, tx, c.p)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(names(got), c.want) {
			t.Errorf("%s: %v, want %v", c.name, names(got), c.want)
		}
	}
	if _, err := store.ReadTenantQueues(k.ctx, tx, store.TenantQueuesParams{By: -1}); err == nil {
		t.Error("an unknown order: no error")
	}
	got, _ := store.ReadTenantQueues(k.ctx, tx, store.TenantQueuesParams{By: store.ByName, After: "a", Limit: 1})
	if len(got) != 1 || got[0].Queued != 1 || got[0].HeadAt == nil || !got[0].HeadAt.Equal(old) {
		t.Errorf("tenant b: %+v, want 1 queued since %v", got, old)
	}

	inFlight, err := store.ReadInFlight(k.ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	byTenant := map[string]store.TenantInFlight{}
	for _, t := range inFlight {
		byTenant[t.Tenant] = t
	}
	if a, e := byTenant["a"], byTenant["e"]; len(byTenant) != 2 || a.InFlight != 1 || a.Queued != 3 || a.HeadAt == nil ||
		e.InFlight != 2 || e.Queued != 0 || e.HeadAt != nil {
		t.Errorf("in flight: %+v", inFlight)
	}

	totals, err := store.ReadQueueTotals(k.ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	if totals.TenantsWithWork != 4 || totals.Queued != 9 || totals.OldestHead == nil || !totals.OldestHead.Equal(old) {
		t.Errorf("totals %+v, want 4 tenants, 9 queued, oldest %v", totals, old)
	}

	byHead, err := store.TenantsByHead(k.ctx, tx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(byHead, []string{"b", "a"}) {
		t.Errorf("by oldest head: %v, want [b a]", byHead)
	}
	k.wantLocked("after the reads", jobs)
	k.wantTenantsLocked("after the reads", []string{"a", "b", "c", "d", "e", "f"})
}

// TestHeadsRead: the first jobs of each tenant named, in queue order, from a statement of as
// many slots as it was made with; empty slots read nothing.
func TestHeadsRead(t *testing.T) {
	k := newFixture(t)
	nb := k.now.Add(time.Hour)
	first := k.insert(jobSpec{tenant: "a", queuedAt: k.now.Add(-time.Second), rateKey: "k1", notBefore: &nb})
	k.insert(jobSpec{tenant: "a"})
	k.insert(jobSpec{tenant: "a"})
	k.insert(jobSpec{tenant: "b"})
	k.insert(jobSpec{tenant: "c"})
	got, err := store.NewHeadsRead(3).Read(k.ctx, k.db, []string{"a", "b"}, 2)
	if err != nil {
		t.Fatal(err)
	}
	var tenants []string
	for _, h := range got {
		tenants = append(tenants, h.Tenant)
	}
	if !slices.Equal(tenants, []string{"a", "a", "b"}) {
		t.Fatalf("heads of %v, want [a a b]", tenants)
	}
	if h := got[0]; h.RateKeySHA256 == nil || *h.RateKeySHA256 != "k1" || h.NotBefore == nil || !h.NotBefore.Equal(nb) ||
		!h.QueuedAt.Equal(k.row(first).QueuedAt) {
		t.Errorf("a's first head: %+v", h)
	}
	if got[1].RateKeySHA256 != nil || got[1].NotBefore != nil {
		t.Errorf("a's second head: %+v", got[1])
	}
}

// TestQueuedRateKeys: each rate key of queued jobs with its queued count, all or a bounded
// number; jobs that are not queued do not count.
func TestQueuedRateKeys(t *testing.T) {
	k := newFixture(t)
	k.insert(jobSpec{rateKey: "k1"})
	k.insert(jobSpec{rateKey: "k1"})
	k.insert(jobSpec{rateKey: "k2"})
	k.insert(jobSpec{})
	k.insert(jobSpec{rateKey: "k3", status: job.Running})
	got, err := store.QueuedRateKeys(k.ctx, k.db, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int64{"k1": 2, "k2": 1}; !maps.Equal(got, want) {
		t.Errorf("queued rate keys %v, want %v", got, want)
	}
	if got, err := store.QueuedRateKeys(k.ctx, k.db, 1); err != nil || len(got) != 1 {
		t.Errorf("at most one key: %v (%v)", got, err)
	}
}

// TestReadDrainers: the heartbeat rows of the drainers that beat since the time given and did
// not stop, by id.
func TestReadDrainers(t *testing.T) {
	k := newFixture(t)
	for _, hb := range []store.Heartbeat{
		{DrainerID: "d2", Host: "h2", PID: 2, Version: "v", Now: k.now, LastClaim: k.now, InFlight: 3, PollInterval: time.Second},
		{DrainerID: "d1", Host: "h1", PID: 1, Version: "v", Now: k.now},
		{DrainerID: "old", Host: "h", PID: 3, Version: "v", Now: k.now.Add(-time.Hour)},
		{DrainerID: "stopped", Host: "h", PID: 4, Version: "v", Now: k.now},
	} {
		if err := store.WriteHeartbeat(k.ctx, k.db, hb); err != nil {
			t.Fatal(err)
		}
	}
	if err := store.MarkStopped(k.ctx, k.db, "stopped", 0); err != nil {
		t.Fatal(err)
	}
	got, err := store.ReadDrainers(k.ctx, k.db, k.now.Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != "d1" || got[1].ID != "d2" {
		t.Fatalf("drainers %+v, want d1 and d2", got)
	}
	if d := got[0]; d.Host != "h1" || d.PID != 1 || d.LastClaim != nil || d.PollInterval != 0 || !d.StartedAt.Equal(k.now) {
		t.Errorf("d1: %+v", d)
	}
	if d := got[1]; d.LastClaim == nil || !d.LastClaim.Equal(k.now) || d.InFlight != 3 || d.PollInterval != time.Second || !d.HeartbeatAt.Equal(k.now) {
		t.Errorf("d2: %+v", d)
	}
}
