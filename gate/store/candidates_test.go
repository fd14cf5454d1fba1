package store_test

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/testdb"
)

// TestReadTenantPage: a claim pass's pages of tenants with work, by oldest head (from the start
// or after a position) or by name (after a name, or wrapped up to one), at most a page's limit,
// with the jobs in flight per tenant when asked; nothing is locked.
func TestReadTenantPage(t *testing.T) {
	k := newFixture(t)
	var jobs []int64
	for i, tenant := range []string{"c", "a", "d", "b"} {
		jobs = append(jobs, k.insert(jobSpec{tenant: tenant, queuedAt: k.now.Add(time.Duration(i) * time.Second)}))
	}
	jobs = append(jobs, k.insert(jobSpec{tenant: "a", status: job.Running}), k.insert(jobSpec{tenant: "e", status: job.Dispatched}),
		k.insert(jobSpec{tenant: "e", status: job.Running}))
	later := k.now.Add(time.Hour)
	deferred := k.insert(jobSpec{tenant: "f", queuedAt: k.now.Add(10 * time.Second), notBefore: &later, rateKey: "k", lanes: "gpu"})
	jobs = append(jobs, deferred, k.insert(jobSpec{tenant: "g", queuedAt: k.now.Add(11 * time.Second)}),
		k.insert(jobSpec{tenant: "g", queuedAt: k.now.Add(12 * time.Second)}))
	tx := k.begin()
	read := func(p store.TenantPageParams) store.TenantPage {
		t.Helper()
		page, err := store.ReadTenantPage(k.ctx, tx, p)
		if err != nil {
			t.Fatal(err)
		}
		return page
	}
	names := func(p store.TenantPage) []string {
		var out []string
		for _, h := range p.Tenants {
			out = append(out, h.Tenant)
		}
		return out
	}
	first := read(store.TenantPageParams{FromStart: true, Limit: 2, WithInFlight: true})
	if !slices.Equal(names(first), []string{"c", "a"}) || first.Usage.Total != 3 || first.Usage.Tenant["a"] != 1 || first.Usage.Tenant["e"] != 2 {
		t.Errorf("first page by head: %v, in flight %v (%d)", names(first), first.Usage.Tenant, first.Usage.Total)
	}
	last := first.Tenants[1]
	next := read(store.TenantPageParams{HeadAt: last.HeadAt.Time, HeadID: last.HeadID.Int64, Limit: 2})
	if !slices.Equal(names(next), []string{"d", "b"}) || len(next.Usage.Tenant) != 0 || next.Usage.Total != 0 {
		t.Errorf("the page after a: %v, in flight %v", names(next), next.Usage.Tenant)
	}
	// A tenant with one queued job comes with it (its head is that job); one with two does not.
	all := read(store.TenantPageParams{FromStart: true, Limit: 10, WithInFlight: true})
	only := map[string]*store.QueuedJob{}
	for _, h := range all.Tenants {
		only[h.Tenant] = h.Only
	}
	if c, f := only["c"], only["f"]; len(all.Tenants) != 6 || c == nil || c.ID != jobs[0] || c.NotBefore.Valid || only["g"] != nil ||
		f == nil || f.ID != deferred || !f.NotBefore.Time.Equal(later) || f.RateKey.String != "k" || !slices.Equal(f.Lanes, []string{"gpu"}) {
		t.Errorf("the tenants' only jobs: %v; c %+v, f %+v", names(all), c, f)
	}
	if got := names(read(store.TenantPageParams{ByName: true, After: "b", Limit: 5})); !slices.Equal(got, []string{"c", "d", "f", "g"}) {
		t.Errorf("by name after b: %v", got)
	}
	if got := names(read(store.TenantPageParams{ByName: true, Wrapped: true, After: "", UpTo: "b", Limit: 5})); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("by name, wrapped up to b: %v", got)
	}
	k.wantLocked("after the reads", jobs)
	k.wantTenantsLocked("after the reads", []string{"a", "b", "c", "d", "e", "f", "g"})
}

// TestReadHeads: each tenant's oldest eligible queued jobs in queue order, at most as many as
// asked, without the jobs of the excluded rate keys or those whose not-before has not come;
// reads of many tenants are split into statements of at most 48 KiB and still return every
// tenant's heads; nothing is locked.
func TestReadHeads(t *testing.T) {
	k := newFixture(t)
	later := k.now.Add(time.Hour)
	a1 := k.insert(jobSpec{tenant: "a", queuedAt: k.now.Add(-2 * time.Second)})
	k.insert(jobSpec{tenant: "a", queuedAt: k.now.Add(-3 * time.Second), notBefore: &later})
	a2 := k.insert(jobSpec{tenant: "a", queuedAt: k.now.Add(-time.Second), rateKey: "gated"})
	a3 := k.insert(jobSpec{tenant: "a", rateKey: "open"})
	a4 := k.insert(jobSpec{tenant: "a"})
	b1 := k.insert(jobSpec{tenant: "b"})
	k.insert(jobSpec{tenant: "b", status: job.Running})
	tx := k.begin()
	read := func(p store.HeadsParams) map[string][]int64 {
		t.Helper()
		got, err := store.ReadHeads(k.ctx, tx, p)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][]int64{}
		for tenant, hs := range got {
			for _, h := range hs {
				out[tenant] = append(out[tenant], h.ID)
			}
		}
		return out
	}
	got := read(store.HeadsParams{Now: k.now, Tenants: []store.HeadsWant{{Tenant: "a", N: 3}, {Tenant: "b", N: 3}, {Tenant: "none", N: 1}}})
	if !slices.Equal(got["a"], []int64{a1, a2, a3}) || !slices.Equal(got["b"], []int64{b1}) || len(got) != 2 {
		t.Errorf("heads %v, want a: %v, b: %v", got, []int64{a1, a2, a3}, []int64{b1})
	}
	got = read(store.HeadsParams{Now: k.now, Tenants: []store.HeadsWant{{Tenant: "a", N: 3}}, Excluded: []string{"gated", "x"}})
	if !slices.Equal(got["a"], []int64{a1, a3, a4}) {
		t.Errorf("heads without the gated key: %v, want %v", got["a"], []int64{a1, a3, a4})
	}
	// 400 tenants read with 40 excluded keys: over 100 KiB of statement text, so several statements.
	var many []store.HeadsWant
	for i := range 400 {
		many = append(many, store.HeadsWant{Tenant: fmt.Sprintf("t%03d", i), N: 1})
	}
	many = append(many, store.HeadsWant{Tenant: "a", N: 1}, store.HeadsWant{Tenant: "b", N: 1})
	var keys []string
	for i := range 40 {
		keys = append(keys, fmt.Sprintf("%064d", i))
	}
	got = read(store.HeadsParams{Now: k.now, Tenants: many, Excluded: keys})
	if !slices.Equal(got["a"], []int64{a1}) || !slices.Equal(got["b"], []int64{b1}) || len(got) != 2 {
		t.Errorf("heads of 402 tenants: %v", got)
	}
	k.wantLocked("after the reads", []int64{a1, a2, a3, a4, b1})
}

// TestInteractiveHeads: a tenant page flags the tenants with interactive queued jobs (not those
// whose interactive jobs are in flight or not queued), counts the jobs in flight by lane and
// interactive, and a tenant read with Interactive gets its interactive jobs first, in queue
// order, each job once, even those beyond its oldest N; its heads number at least N exactly
// when more may exist.
func TestInteractiveHeads(t *testing.T) {
	k := newFixture(t)
	testdb.SetLimits(t, k.db.DB, func(c *config.Config) { c.Lanes = map[string]int{"gpu": 2} })
	at := func(s int) time.Time { return k.now.Add(time.Duration(s) * time.Second) }
	p1 := k.insert(jobSpec{tenant: "a", queuedAt: at(-5)})
	i1 := k.insert(jobSpec{tenant: "a", queuedAt: at(-4), interactive: true, lanes: "gpu"})
	p2 := k.insert(jobSpec{tenant: "a", queuedAt: at(-3)})
	p3 := k.insert(jobSpec{tenant: "a", queuedAt: at(-2)})
	i2 := k.insert(jobSpec{tenant: "a", queuedAt: at(-1), interactive: true})
	b1 := k.insert(jobSpec{tenant: "b", queuedAt: at(-6)})
	k.insert(jobSpec{tenant: "b", status: job.Running, interactive: true, lanes: "gpu"})
	k.insert(jobSpec{tenant: "c", status: job.Canceled, interactive: true})
	k.insert(jobSpec{tenant: "c", queuedAt: at(-7)})
	tx := k.begin()
	cfg := config.Default()
	cfg.Lanes = map[string]int{"gpu": 2}
	page, err := store.ReadTenantPage(k.ctx, tx, store.TenantPageParams{FromStart: true, Limit: 5, WithInFlight: true, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	flags := map[string]bool{}
	for _, h := range page.Tenants {
		flags[h.Tenant] = h.Interactive
	}
	if !reflect.DeepEqual(flags, map[string]bool{"a": true, "b": false, "c": false}) {
		t.Errorf("interactive flags %v", flags)
	}
	if page.Usage.Total != 1 || page.Usage.Interactive != 1 || page.Usage.Lane["gpu"] != 1 || page.Usage.Tenant["b"] != 1 {
		t.Errorf("usage %+v", page.Usage)
	}
	read := func(w ...store.HeadsWant) map[string][]store.Head {
		t.Helper()
		got, err := store.ReadHeads(k.ctx, tx, store.HeadsParams{Now: k.now, Tenants: w})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	ids := func(hs []store.Head) []int64 {
		var out []int64
		for _, h := range hs {
			out = append(out, h.ID)
		}
		return out
	}
	got := read(store.HeadsWant{Tenant: "a", N: 2, Interactive: true}, store.HeadsWant{Tenant: "b", N: 2, Interactive: true})
	if want := []int64{i1, i2, p1}; !slices.Equal(ids(got["a"]), want) {
		t.Errorf("a's heads %v, want %v (interactive first)", ids(got["a"]), want)
	}
	if h := got["a"][0]; !h.Interactive || !slices.Equal(h.Lanes, []string{"gpu"}) || got["a"][2].Interactive || got["a"][2].Lanes != nil {
		t.Errorf("heads' lanes and flags: %+v", got["a"])
	}
	if u := got["a"][0].Unit(); u.Tenant != "a" || !u.Interactive || !slices.Equal(u.Lanes, []string{"gpu"}) {
		t.Errorf("a head's unit %+v", u)
	}
	if !slices.Equal(ids(got["b"]), []int64{b1}) {
		t.Errorf("b's heads %v", ids(got["b"]))
	}
	if got := read(store.HeadsWant{Tenant: "a", N: 9, Interactive: true}); !slices.Equal(ids(got["a"]), []int64{i1, i2, p1, p2, p3}) {
		t.Errorf("a's whole queue: %v", ids(got["a"]))
	}
	if got := read(store.HeadsWant{Tenant: "a", N: 2}); !slices.Equal(ids(got["a"]), []int64{i1, p1}) {
		t.Errorf("a read without Interactive: %v, want its oldest two, interactive first", ids(got["a"]))
	}
	us, err := store.ReadInFlightUsage(k.ctx, tx, cfg)
	if err != nil || us.Total != 1 || us.Lane["gpu"] != 1 || us.Tier["default"] != 1 {
		t.Errorf("ReadInFlightUsage: %+v (%v)", us, err)
	}
}

// TestReadHeadsPriorities: a prioritized tenant's heads go interactive first, then by priority,
// highest first, then by age; a job queued before AgedBefore goes as if at the top; the tenants
// page flags the tenant; and when the age-ordered read is full, jobs below the default priority
// are cut (more default jobs may lie beyond it) unless they are all that is left.
func TestReadHeadsPriorities(t *testing.T) {
	k := newFixture(t)
	p := func(n int) *int { return &n }
	at := func(s int) time.Time { return k.now.Add(time.Duration(s-100) * time.Second) }
	low := k.insert(jobSpec{tenant: "a", queuedAt: at(1), priority: p(2)})
	old := k.insert(jobSpec{tenant: "a", queuedAt: at(0), priority: p(0)}) // aged below
	def1 := k.insert(jobSpec{tenant: "a", queuedAt: at(2)})
	high := k.insert(jobSpec{tenant: "a", queuedAt: at(3), priority: p(8)})
	top := k.insert(jobSpec{tenant: "a", queuedAt: at(4), priority: p(9)})
	inter := k.insert(jobSpec{tenant: "a", queuedAt: at(5), interactive: true})
	def2 := k.insert(jobSpec{tenant: "a", queuedAt: at(6)})
	k.insert(jobSpec{tenant: "a", queuedAt: at(-1), priority: p(9), status: job.Succeeded}) // ended: passed over
	plain := k.insert(jobSpec{tenant: "b"})

	page, err := store.ReadTenantPage(k.ctx, k.db, store.TenantPageParams{FromStart: true, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	flags := map[string]bool{}
	for _, h := range page.Tenants {
		flags[h.Tenant] = h.Prioritized
	}
	if !flags["a"] || flags["b"] {
		t.Errorf("prioritized flags %v, want a only", flags)
	}
	read := func(n int, aged time.Time) ([]int64, bool) {
		t.Helper()
		cut := map[string]bool{}
		got, err := store.ReadHeads(k.ctx, k.db, store.HeadsParams{Now: k.now, AgedBefore: aged, Cut: cut,
			Tenants: []store.HeadsWant{{Tenant: "a", N: n, Interactive: true, Prioritized: true}, {Tenant: "b", N: n}}})
		if err != nil {
			t.Fatal(err)
		}
		if len(got["b"]) != 1 || got["b"][0].ID != plain || cut["b"] {
			t.Errorf("b's heads %v (cut %v), want its one job", got["b"], cut["b"])
		}
		var ids []int64
		for _, h := range got["a"] {
			ids = append(ids, h.ID)
		}
		return ids, cut["a"]
	}
	// All read: interactive, 9, 8, the default ones by age, then 2, then 0; the ended job of
	// priority 9 is passed over.
	if got, cut := read(10, time.Time{}); !slices.Equal(got, []int64{inter, top, high, def1, def2, low, old}) || cut {
		t.Errorf("heads %v (cut %v), want %v", got, cut, []int64{inter, top, high, def1, def2, low, old})
	}
	// Aged (queued before at(0.5)): the priority-0 job goes as if at the top, before 9 (older).
	if got, _ := read(10, at(0).Add(500*time.Millisecond)); !slices.Equal(got, []int64{inter, old, top, high, def1, def2, low}) {
		t.Errorf("with the oldest aged: %v, want %v", got, []int64{inter, old, top, high, def1, def2, low})
	}
	// N = 3: the age-ordered read (old, low, def1) is full, so def2 may lie beyond it: low and
	// old, below the default, are cut, and the tenant is marked.
	if got, cut := read(3, time.Time{}); !slices.Equal(got, []int64{inter, top, high, def1}) || !cut {
		t.Errorf("N 3: heads %v (cut %v), want %v and cut", got, cut, []int64{inter, top, high, def1})
	}
	// Only jobs below the default are left: they go, whatever the read's size.
	k.exec("UPDATE jobs SET status = 'canceled', finished_at = ? WHERE id IN (?, ?, ?, ?, ?)", k.now, def1, high, top, inter, def2)
	if got, cut := read(1, time.Time{}); !slices.Equal(got, []int64{low, old}) || cut {
		t.Errorf("only low ones left, N 1: heads %v (cut %v), want %v", got, cut, []int64{low, old})
	}

	// The upkeep's delete: the rows of ended jobs go, those of queued jobs stay.
	if left, err := store.DeleteEndedPriorities(k.ctx, k.db, 100); err != nil || !left {
		t.Fatalf("delete: left %v, %v; want the queued jobs' rows left", left, err)
	}
	if n := k.count("SELECT COUNT(*) FROM job_priorities"); n != 2 {
		t.Errorf("%d job_priorities rows after the delete, want 2 (low, old)", n)
	}
	if n := k.count("SELECT COUNT(*) FROM job_priorities WHERE job_id IN (?, ?)", low, old); n != 2 {
		t.Errorf("the queued jobs' rows: %d of 2 left", n)
	}
	k.exec("UPDATE jobs SET status = 'succeeded', finished_at = ? WHERE id IN (?, ?)", k.now, low, old)
	if left, err := store.DeleteEndedPriorities(k.ctx, k.db, 100); err != nil || left {
		t.Errorf("delete after the last ended: left %v, %v; want none", left, err)
	}
}
