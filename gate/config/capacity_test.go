package config

import "testing"

func TestCheck(t *testing.T) {
	cfg := Default()
	cfg.GlobalInFlight = 10
	cfg.TenantInFlight = 3
	cfg.Lanes = map[string]int{"search": 2, "gpu": 0}
	cfg.TenantTiers = map[string]string{"big": "gold"}
	cfg.TierInFlight = map[string]int{"gold": 4}
	cfg.TierTenantInFlight = map[string]int{"gold": 5}
	cfg.InteractiveReserve = 2

	use := func(units ...Unit) Usage {
		us := NewUsage()
		for _, u := range units {
			us.Add(cfg, u, 1)
		}
		return us
	}
	many := func(n int, u Unit) []Unit {
		out := make([]Unit, n)
		for i := range out {
			out[i] = u
		}
		return out
	}
	cases := []struct {
		name      string
		us        Usage
		u         Unit
		ok        bool
		scope     string
		paused    bool
		suggested int
	}{
		{"empty box", use(), Unit{Tenant: "a"}, true, ScopeTenant, false, 3},
		{"tenant full", use(many(3, Unit{Tenant: "a"})...), Unit{Tenant: "a"}, false, ScopeTenant, false, 1},
		{"tier tenant cap", use(many(3, Unit{Tenant: "big"})...), Unit{Tenant: "big"}, true, ScopeTier, false, 2},
		{"tier ceiling", use(many(4, Unit{Tenant: "big"})...), Unit{Tenant: "big"}, false, ScopeTier, false, 1},
		{"reserve kept from plain work", use(many(8, Unit{Tenant: "x"})...), Unit{Tenant: "a"}, false, ScopeReserve, false, 2},
		{"reserve open to interactive", use(many(8, Unit{Tenant: "x"})...), Unit{Tenant: "a", Interactive: true}, true, ScopeGlobal, false, 2},
		{"interactive in flight use the reserve first", use(append(many(7, Unit{Tenant: "x"}), Unit{Tenant: "y", Interactive: true})...), Unit{Tenant: "a"}, true, ScopeReserve, false, 2},
		{"global full for interactive too", use(many(10, Unit{Tenant: "x", Interactive: true})...), Unit{Tenant: "a", Interactive: true}, false, ScopeGlobal, false, 1},
		{"lane full", use(many(2, Unit{Tenant: "x", Lanes: []string{"search"}})...), Unit{Tenant: "a", Lanes: []string{"search"}}, false, "lane:search", false, 3},
		{"paused lane before a full tenant", use(many(3, Unit{Tenant: "a"})...), Unit{Tenant: "a", Lanes: []string{"gpu"}}, false, "lane:gpu", true, 0},
	}
	for _, c := range cases {
		v := cfg.Check(c.us, c.u)
		if v.OK != c.ok || v.Scope != c.scope || v.Paused != c.paused || v.Suggested != c.suggested {
			t.Errorf("%s: got ok=%v scope=%s paused=%v suggested=%d, want ok=%v scope=%s paused=%v suggested=%d",
				c.name, v.OK, v.Scope, v.Paused, v.Suggested, c.ok, c.scope, c.paused, c.suggested)
		}
	}
	v := cfg.Check(use(many(2, Unit{Tenant: "big"})...), Unit{Tenant: "big"})
	if v.Tier != "gold" || v.TierLimit != 4 || v.TierInFlight != 2 {
		t.Errorf("tier figures: got %s %d/%d, want gold 2/4", v.Tier, v.TierInFlight, v.TierLimit)
	}
	if v := cfg.Check(use(), Unit{Tenant: "a"}); v.Tier != DefaultTier || v.TierLimit != cfg.GlobalInFlight {
		t.Errorf("untiered tenant: got tier %s limit %d", v.Tier, v.TierLimit)
	}
	cfg.GlobalInFlight = 0
	if v := cfg.Check(use(), Unit{Tenant: "a"}); v.OK || v.Scope != ScopeGlobal || !v.Paused || v.Suggested != 0 {
		t.Errorf("paused global: %+v", v)
	}
}

// TestWeights: a tenant's own weight wins over its tier's, 1 otherwise, and FairBefore orders
// by in flight ÷ weight, exactly as the counts do when no weight is set.
func TestWeights(t *testing.T) {
	cfg := Default()
	if cfg.Weight("a") != 1 || !cfg.FairBefore("a", 1, "b", 2) || cfg.FairBefore("a", 2, "b", 2) {
		t.Fatal("unweighted fair order is not the counts' order")
	}
	cfg.TenantTiers = map[string]string{"g1": "gold", "g2": "gold"}
	cfg.TierWeights = map[string]float64{"gold": 4}
	cfg.TenantWeights = map[string]float64{"g2": 0.5, "b": 2}
	for tenant, want := range map[string]float64{"a": 1, "b": 2, "g1": 4, "g2": 0.5} {
		if got := cfg.Weight(tenant); got != want {
			t.Errorf("Weight(%s) = %g, want %g", tenant, got, want)
		}
	}
	for _, tc := range []struct {
		a      string
		na     int
		b      string
		nb     int
		before bool
	}{
		{"g1", 7, "a", 2, true},  // 7/4 < 2/1
		{"g1", 8, "a", 2, false}, // 8/4 = 2/1: a tie
		{"a", 2, "g1", 8, false},
		{"b", 3, "a", 2, true}, // 1.5 < 2
		{"g2", 1, "a", 1, false},
		{"a", 1, "g2", 1, true}, // 1 < 2
		{"a", 0, "b", 0, false},
	} {
		if got := cfg.FairBefore(tc.a, tc.na, tc.b, tc.nb); got != tc.before {
			t.Errorf("FairBefore(%s %d, %s %d) = %v, want %v", tc.a, tc.na, tc.b, tc.nb, got, tc.before)
		}
	}
}

func TestValidateCapacityKeys(t *testing.T) {
	for _, bad := range []func(*Config){
		func(c *Config) { c.Lanes = map[string]int{"": 1} },
		func(c *Config) { c.Lanes = map[string]int{"a b": 1} },
		func(c *Config) { c.Lanes = map[string]int{"x": -1} },
		func(c *Config) { c.TierInFlight = map[string]int{"gold": -1} },
		func(c *Config) { c.TierTenantInFlight = map[string]int{"gold\n": 1} },
		func(c *Config) { c.TenantTiers = map[string]string{"acme": ""} },
		func(c *Config) { c.InteractiveReserve = -1 },
		func(c *Config) { c.EnforceFor = "some" },
		func(c *Config) { c.TenantWeights = map[string]float64{"acme": 0} },
		func(c *Config) { c.TierWeights = map[string]float64{"gold": MaxWeight * 2} },
		func(c *Config) { c.TierWeights = map[string]float64{"": 1} },
	} {
		c := Default()
		bad(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("accepted %+v", c)
		}
	}
	if err := Default().Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestDecodeFillsCapacityKeys: a configuration stored before the capacity keys existed, or with
// null maps, decodes to empty maps and enforce_for all, so no reader meets a nil map.
func TestDecodeFillsCapacityKeys(t *testing.T) {
	for _, raw := range []string{`{"global_in_flight": 7}`,
		`{"lanes": null, "tenant_tiers": null, "tier_in_flight": null, "tier_tenant_in_flight": null, "tenant_in_flight_overrides": null, "enforce_for": "", "tenant_weights": null, "tier_weights": null}`} {
		c, err := Decode([]byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		if c.Lanes == nil || c.TenantTiers == nil || c.TierInFlight == nil || c.TierTenantInFlight == nil ||
			c.TenantInFlightOverrides == nil || c.EnforceFor != EnforceAll || c.TenantWeights == nil || c.TierWeights == nil {
			t.Errorf("Decode(%s) = %+v, want empty maps and enforce_for all", raw, c)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("Decode(%s) does not validate: %v", raw, err)
		}
	}
	if _, err := Decode([]byte(`{"lanes": [1]}`)); err == nil {
		t.Error("Decode accepted lanes as an array")
	}
}

// TestCheckAllocatesNothing: the claim calls Check for every job it considers, so a decision
// allocates nothing, lanes or not (stored lanes come sorted), unless its answer names a lane
// (the scope "lane:<name>" is built then).
func TestCheckAllocatesNothing(t *testing.T) {
	cfg := Default()
	cfg.Lanes = map[string]int{"gpu": 4, "search": 9}
	cfg.TierInFlight = map[string]int{DefaultTier: 8}
	cfg.InteractiveReserve = 1
	us := NewUsage()
	us.Add(cfg, Unit{Tenant: "a", Lanes: []string{"search"}}, 1)
	for _, u := range []Unit{{Tenant: "a"}, {Tenant: "b", Lanes: []string{"gpu", "search"}, Interactive: true}} {
		if n := testing.AllocsPerRun(100, func() { _ = cfg.Check(us, u) }); n != 0 {
			t.Errorf("Check(%+v) allocates %.0f times a call, want 0", u, n)
		}
	}
}
