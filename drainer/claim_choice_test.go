package drainer

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/config"
)

func cand(id int64, tenant string, at int) candidate {
	return candidate{id: id, tenant: tenant, queuedAt: time.Unix(int64(at), 0)}
}

// pickAll runs pick as claim does, until no tenant may go, and returns the ids in order.
func pickAll(d *claimer, cfg config.Config, cands map[string][]candidate, inFlight map[string]int, free int) []int64 {
	var out []int64
	for len(out) < free {
		t := d.pick(cfg, cands, inFlight, nil)
		if t == "" {
			break
		}
		out = append(out, cands[t][0].id)
		cands[t] = cands[t][1:]
		inFlight[t]++
	}
	return out
}

// TestPickOrdering is SPEC §5's ordering: fair makes a newcomer next even behind two older
// backlogs, fifo takes the oldest eligible job, round_robin takes tenants in turn, and no order
// ever passes a tenant's cap.
func TestPickOrdering(t *testing.T) {
	backlog := func() map[string][]candidate {
		return map[string][]candidate{
			"A": {cand(1, "A", 1), cand(2, "A", 2), cand(3, "A", 3)},
			"C": {cand(4, "C", 4), cand(5, "C", 5), cand(6, "C", 6)},
			"B": {cand(9, "B", 9)},
		}
	}
	cfg := config.Default() // tenant cap 2
	cases := []struct {
		ordering config.Ordering
		inFlight map[string]int
		want     []int64
	}{
		// A and C each hold one slot; B has none, so B's fresh job goes first.
		{config.Fair, map[string]int{"A": 1, "C": 1}, []int64{9, 1, 4}},
		{config.FIFO, map[string]int{"A": 1, "C": 1}, []int64{1, 4, 9}},
		// From nothing: fewest in flight, ties by the oldest head.
		{config.Fair, map[string]int{}, []int64{1, 4, 9, 2, 5}},
		{config.RoundRobin, map[string]int{}, []int64{1, 9, 4, 2, 5}},
	}
	for _, c := range cases {
		cfg.Ordering = c.ordering
		d := &claimer{}
		got := pickAll(d, cfg, backlog(), c.inFlight, len(c.want)+5)
		if len(got) != len(c.want) {
			t.Errorf("%s from %v: picked %v, want %v", c.ordering, c.inFlight, got, c.want)
			continue
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("%s from %v: picked %v, want %v", c.ordering, c.inFlight, got, c.want)
				break
			}
		}
	}
}

// TestPickerMatchesPick: choose's picker hands out tenants in the order pick's scan would, under
// every ordering, while the tenant returned last loses its head, gains a job in flight, reaches
// its cap or is skipped, as in choose.
func TestPickerMatchesPick(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 17))
	for round := range 300 {
		cfg := config.Default()
		cfg.TenantInFlight = 1 + rng.IntN(4)
		cfg.Ordering = []config.Ordering{config.Fair, config.FIFO, config.RoundRobin, config.FairTime}[round%4]
		weighted := (round/4)%2 == 0 // every ordering, with and without weights
		used := map[string]float64{}
		cands, inFlight := map[string][]candidate{}, map[string]int{}
		id := int64(0)
		for i := range 1 + rng.IntN(12) {
			tenant := fmt.Sprintf("t%02d", i)
			if weighted && rng.IntN(2) == 0 {
				cfg.TenantWeights[tenant] = []float64{0.5, 2, 3, 4}[rng.IntN(4)]
			}
			if rng.IntN(3) > 0 {
				used[tenant] = float64(rng.IntN(4)) * 0.5 // ties too
			}
			inFlight[tenant] = rng.IntN(3)
			for range rng.IntN(5) {
				id++
				cands[tenant] = append(cands[tenant], cand(id, tenant, rng.IntN(8))) // ties in time, broken by id
			}
			slices.SortFunc(cands[tenant], func(a, b candidate) int {
				if a.before(b) {
					return -1
				}
				return 1
			})
		}
		copyState := func() (map[string][]candidate, map[string]int) {
			c, n := map[string][]candidate{}, map[string]int{}
			for k, v := range cands {
				c[k] = slices.Clone(v)
			}
			for k, v := range inFlight {
				n[k] = v
			}
			return c, n
		}
		skips := rng.Uint64()
		walk := func(next func(c map[string][]candidate, n map[string]int, skip map[string]bool) string, c map[string][]candidate, n map[string]int) []string {
			var order []string
			skip := map[string]bool{}
			for step := 0; step < 64; step++ {
				tn := next(c, n, skip)
				if tn == "" {
					break
				}
				order = append(order, tn)
				if skips>>(step%64)&1 == 1 {
					skip[tn] = true
					continue
				}
				c[tn] = c[tn][1:]
				n[tn]++
			}
			return order
		}
		c1, n1 := copyState()
		scan := &claimer{chooser: chooser{timeUsed: used}}
		want := walk(func(c map[string][]candidate, n map[string]int, skip map[string]bool) string {
			return scan.pick(cfg, c, n, skip)
		}, c1, n1)
		c2, n2 := copyState()
		p := (&claimer{chooser: chooser{timeUsed: used}}).picker(cfg, c2, n2)
		got := walk(func(_ map[string][]candidate, _ map[string]int, skip map[string]bool) string { return p.next(skip) }, c2, n2)
		if !slices.Equal(got, want) {
			t.Fatalf("round %d (%s, cap %d): picker %v, pick %v", round, cfg.Ordering, cfg.TenantInFlight, got, want)
		}
	}
}

// TestPickWeighted: under fair, tenants of weights 1, 2 and 4 with long backlogs fill the box in
// the ratio of their weights, from nothing and after units are released, and a tenant's cap
// still bounds it whatever its weight.
func TestPickWeighted(t *testing.T) {
	cfg := config.Default()
	cfg.GlobalInFlight, cfg.TenantInFlight = 14, 100
	cfg.TenantWeights = map[string]float64{"B": 2, "C": 4}
	backlog := func() map[string][]candidate {
		out := map[string][]candidate{}
		id := int64(0)
		for _, tenant := range []string{"A", "B", "C"} {
			for i := range 20 {
				id++
				out[tenant] = append(out[tenant], cand(id, tenant, i))
			}
		}
		return out
	}
	cands, inFlight := backlog(), map[string]int{}
	pickAll(&claimer{}, cfg, cands, inFlight, 14)
	if inFlight["A"] != 2 || inFlight["B"] != 4 || inFlight["C"] != 8 {
		t.Fatalf("from nothing: in flight %v, want A 2, B 4, C 8", inFlight)
	}
	// C's jobs end, four of them: C takes them back, not A or B.
	inFlight["C"] -= 4
	pickAll(&claimer{}, cfg, cands, inFlight, 4)
	if inFlight["A"] != 2 || inFlight["B"] != 4 || inFlight["C"] != 8 {
		t.Errorf("after four of C's end: in flight %v, want A 2, B 4, C 8", inFlight)
	}
	cfg.TenantInFlightOverrides = map[string]int{"C": 3}
	cands, inFlight = backlog(), map[string]int{}
	pickAll(&claimer{}, cfg, cands, inFlight, 14)
	if inFlight["C"] != 3 || inFlight["A"]+inFlight["B"] != 11 {
		t.Errorf("C capped at 3: in flight %v, want C 3 and the rest to A and B", inFlight)
	}
}

// TestChooseKeepsCapsWithWeights is a property: whatever the weights, caps, tiers, lanes and
// reserve, a pass never chooses past a limit as Check counts it, and leaves no capacity unused
// that a candidate could take.
func TestChooseKeepsCapsWithWeights(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 37))
	for round := range 500 {
		cfg := config.Default()
		cfg.GlobalInFlight = rng.IntN(12)
		cfg.TenantInFlight = rng.IntN(5)
		cfg.Lanes = map[string]int{"gpu": rng.IntN(3)}
		cfg.TierInFlight = map[string]int{"gold": rng.IntN(4)}
		cfg.InteractiveReserve = rng.IntN(2)
		us, id := config.NewUsage(), int64(0)
		cands := map[string][]candidate{}
		for i := range 1 + rng.IntN(8) {
			tenant := fmt.Sprintf("t%d", i)
			if rng.IntN(3) == 0 {
				cfg.TenantTiers[tenant] = "gold"
			}
			if rng.IntN(2) == 0 {
				cfg.TenantWeights[tenant] = 0.25 + rng.Float64()*8
			}
			if rng.IntN(4) == 0 {
				cfg.TenantInFlightOverrides[tenant] = rng.IntN(4)
			}
			for range rng.IntN(6) {
				id++
				c := cand(id, tenant, int(id))
				c.unit = config.Unit{Tenant: tenant, Interactive: rng.IntN(4) == 0}
				if rng.IntN(3) == 0 {
					c.unit.Lanes = []string{"gpu"}
				}
				cands[tenant] = append(cands[tenant], c)
			}
		}
		// What is in flight already fits the limits (a configuration change may leave more, which
		// the claim preempts nothing of; it only adds nothing).
		for tenant := range cands {
			for range rng.IntN(3) {
				u := config.Unit{Tenant: tenant}
				if cfg.Check(us, u).OK {
					us.Add(cfg, u, 1)
				}
			}
		}
		cl := &claimer{chooser: chooser{claimBatch: 64}}
		after := us
		after.Tenant, after.Tier, after.Lane = maps.Clone(us.Tenant), maps.Clone(us.Tier), maps.Clone(us.Lane)
		cl.choose(cfg, cands, map[string]bool{}, &after)
		// Each limit, counted apart from Check: what was in flight plus what was chosen.
		over := func(what string, n, limit int) {
			if n > limit {
				t.Fatalf("round %d: %s at %d, past its limit %d (%+v)", round, what, n, limit, cfg)
			}
		}
		if after.Total > us.Total {
			over("global", after.Total, cfg.GlobalInFlight)
			if cfg.InteractiveReserve > 0 {
				over("non-interactive", after.Total-after.Interactive, max(cfg.GlobalInFlight-cfg.InteractiveReserve, us.Total-us.Interactive))
			}
		}
		for tenant, n := range after.Tenant {
			if n > us.Tenant[tenant] {
				over("tenant "+tenant, n, cfg.TenantCap(tenant))
			}
		}
		if after.Lane["gpu"] > us.Lane["gpu"] {
			over("lane gpu", after.Lane["gpu"], cfg.Lanes["gpu"])
		}
		if after.Tier["gold"] > us.Tier["gold"] {
			over("tier gold", after.Tier["gold"], cfg.TierInFlight["gold"])
		}
		for tenant, cs := range cands {
			if i := fits(cfg, after, cs); i >= 0 {
				t.Fatalf("round %d: %s's job %d fits after the pass and was left", round, tenant, cs[i].id)
			}
		}
	}
}

// TestPickFairTime: under fair_time the tenant with the least executor time used (plus a second
// for each unit it holds), divided by its weight, goes first; a tenant never charged counts as
// none used; ties go to the oldest head.
func TestPickFairTime(t *testing.T) {
	cfg := config.Default()
	cfg.Ordering = config.FairTime
	cfg.GlobalInFlight, cfg.TenantInFlight = 8, 8
	cands := func() map[string][]candidate {
		out := map[string][]candidate{}
		id := int64(0)
		for i, tenant := range []string{"long", "short", "new"} {
			for j := range 4 {
				id++
				out[tenant] = append(out[tenant], cand(id, tenant, i*10+j))
			}
		}
		return out
	}
	// long used 30 s, short 4 s, new 3.6 s: each unit taken adds 250 ms ahead, so new and short
	// take turns once new's count passes short's 4 s, and long waits.
	cl := &claimer{chooser: chooser{timeUsed: map[string]float64{"long": 30, "short": 4, "new": 3.6}}}
	got := pickAll(cl, cfg, cands(), map[string]int{}, 8)
	if want := []int64{9, 10, 5, 11, 6, 12, 7, 8}; !slices.Equal(got, want) {
		t.Errorf("picked %v, want %v: new (3.6 s) twice, then new and short in turn (250 ms a unit), long (30 s) last", got, want)
	}
	// Weights: long at weight 10 counts 3 s, below short's 4 s.
	cfg.TenantWeights = map[string]float64{"long": 10}
	cl = &claimer{chooser: chooser{timeUsed: map[string]float64{"long": 30, "short": 4, "new": 100}}}
	if got := pickAll(cl, cfg, cands(), map[string]int{}, 1); !slices.Equal(got, []int64{1}) {
		t.Errorf("weighted: picked %v, want long's first job", got)
	}
	// Ties (none used, nothing in flight): the oldest head.
	cl = &claimer{}
	if got := pickAll(cl, cfg, cands(), map[string]int{}, 1); !slices.Equal(got, []int64{1}) {
		t.Errorf("ties: picked %v, want the oldest head (long's 1)", got)
	}
}

func TestPickHonoursOverrides(t *testing.T) {
	cfg := config.Default()
	cfg.TenantInFlightOverrides = map[string]int{"A": 0}
	d := &claimer{}
	got := pickAll(d, cfg, map[string][]candidate{"A": {cand(1, "A", 1)}, "B": {cand(2, "B", 2)}}, map[string]int{}, 4)
	if len(got) != 1 || got[0] != 2 {
		t.Errorf("picked %v; a tenant overridden to cap 0 must get nothing", got)
	}
}

// TestGatedSeen: a key found gated is remembered until its gate ends or the memory runs out,
// whichever is first, and one not gated at the time is not remembered at all.
func TestGatedSeen(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	var g gatedSeen
	g.learn(map[string]time.Time{"long": t0.Add(time.Hour), "short": t0.Add(200 * time.Millisecond), "over": t0}, t0, time.Second)
	if got := g.at(t0.Add(100 * time.Millisecond)); len(got) != 2 || got["long"] != t0.Add(time.Hour) {
		t.Errorf("at +100ms: %v, want long and short", got)
	}
	if got := g.at(t0.Add(500 * time.Millisecond)); len(got) != 1 || got["long"].IsZero() {
		t.Errorf("at +500ms: %v, want long only (short's gate ended)", got)
	}
	if got := g.at(t0.Add(time.Second)); len(got) != 0 || len(g) != 0 {
		t.Errorf("at +1s: %v (held %v), want nothing: a poll period of memory at most", got, g)
	}
}

// TestChooseCapacity: choose decides each job with Config.Check against what is in flight plus
// the jobs chosen before it: a job of a full lane is passed over and its tenant's next job goes;
// a tenant whose tier is full gives way to others; plain jobs leave the interactive reserve to an
// interactive job; the tenant's last read head ends the pass.
func TestChooseCapacity(t *testing.T) {
	cfg := config.Default()
	cfg.GlobalInFlight, cfg.TenantInFlight = 5, 3
	cfg.Lanes = map[string]int{"gpu": 1}
	cfg.TenantTiers = map[string]string{"G": "gold"}
	cfg.TierInFlight = map[string]int{"gold": 1}
	cfg.InteractiveReserve = 1
	with := func(c candidate, lanes []string, interactive bool) candidate {
		c.unit = config.Unit{Tenant: c.tenant, Lanes: lanes, Interactive: interactive}
		return c
	}
	cands := map[string][]candidate{
		"A": {with(cand(1, "A", 1), []string{"gpu"}, false), with(cand(2, "A", 2), []string{"gpu"}, false), with(cand(3, "A", 3), nil, false)},
		"G": {with(cand(4, "G", 4), nil, false), with(cand(5, "G", 5), nil, false)},
		"P": {with(cand(6, "P", 6), nil, false), with(cand(7, "P", 7), nil, false)},
		"I": {with(cand(8, "I", 8), nil, true)},
	}
	d := &claimer{chooser: chooser{claimBatch: 64}}
	us := config.NewUsage()
	chosen, full := d.choose(cfg, cands, map[string]bool{}, &us)
	var ids []int64
	for _, c := range chosen {
		ids = append(ids, c.id)
	}
	// fair: A's 1 (the gpu lane's one unit), G's 4 (the gold tier's one), P's 6, I's 8; then
	// A's 2 is passed over (gpu full) for its 3, the fourth plain unit, and the box is full.
	want := []int64{1, 4, 6, 8, 3}
	if !slices.Equal(ids, want) || full {
		t.Errorf("chose %v (full %v), want %v", ids, full, want)
	}
	if us.Total != 5 || us.Lane["gpu"] != 1 || us.Tier["gold"] != 1 || us.Interactive != 1 {
		t.Errorf("usage after the pass %+v", us)
	}

	// The reserve: with one unit left of five and it reserved, plain jobs are passed over and
	// the interactive one takes it.
	us = config.NewUsage()
	us.Add(cfg, config.Unit{Tenant: "Z"}, 4)
	cands = map[string][]candidate{
		"P": {with(cand(1, "P", 1), nil, false)},
		"I": {with(cand(2, "I", 2), nil, true)},
	}
	if chosen, _ := d.choose(cfg, cands, map[string]bool{}, &us); len(chosen) != 1 || chosen[0].id != 2 {
		t.Errorf("with only the reserve left: chose %+v, want the interactive job 2", chosen)
	}

	// A tenant's last read head, when it may have more, ends the pass.
	us = config.NewUsage()
	cands = map[string][]candidate{"A": {with(cand(1, "A", 1), []string{"gpu"}, false), with(cand(2, "A", 2), nil, false)}}
	cands["A"][0].unit.Lanes = nil
	chosen, full = d.choose(cfg, cands, map[string]bool{"A": true}, &us)
	if len(chosen) != 2 || !full {
		t.Errorf("at the last read head: chose %d (full %v), want 2 and full", len(chosen), full)
	}
	// ... and counts it in flight like every job it takes: the usage a claim carries to the
	// next pass (claimer.nextRead) is what it claimed.
	if us.Total != 2 || us.Tenant["A"] != 2 {
		t.Errorf("usage after a pass ended at the last read head: %d in flight (A %d), want 2 (A 2)", us.Total, us.Tenant["A"])
	}
}
