package gate

import (
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/store"
)

// TestRecentRefusals: a scope's refusals count for 5 s, at most 6 of them are kept, and scopes
// are counted apart.
func TestRecentRefusals(t *testing.T) {
	var r recentRefusals
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for i := range 8 {
		if n := r.note("global", t0.Add(time.Duration(i)*100*time.Millisecond)); n != min(i, refusalCount) {
			t.Errorf("refusal %d: %d before it", i, n)
		}
	}
	if n := r.note("tenant", t0); n != 0 {
		t.Errorf("another scope: %d before it", n)
	}
	if n := r.note("global", t0.Add(5*time.Second+500*time.Millisecond)); n != 2 {
		t.Errorf("5.5 s later: %d within the window, want the 2 of the last 0.5 s", n)
	}
}

// TestJumpsQueue: the fair-order rule over the tenants waiting ahead, each case one change.
func TestJumpsQueue(t *testing.T) {
	cfg := config.Default() // global 4, tenant 2
	usage := func(units map[string]int) config.Usage {
		us := config.NewUsage()
		for tenant, n := range units {
			us.Add(cfg, config.Unit{Tenant: tenant}, n)
		}
		return us
	}
	st := store.SlotState{Config: cfg, Usage: usage(map[string]int{"a": 1, "x": 2}),
		Waiting: []store.Waiting{{Tenant: "b", Due: true}}}
	a := config.Unit{Tenant: "a"}
	if blocked, _ := jumpsQueue(cfg, st, a, nil); !blocked {
		t.Error("a's slot with 1 unit left and b (0 in flight) waiting is not refused")
	}
	st.Waiting[0].Due = false
	if blocked, _ := jumpsQueue(cfg, st, a, nil); blocked {
		t.Error("refused for b whose job is not yet due")
	}
	st.Waiting[0] = store.Waiting{Tenant: "b", Due: true, HeadRateKey: "k"}
	if blocked, keys := jumpsQueue(cfg, st, a, nil); !blocked || !slices.Equal(keys, []string{"k"}) {
		t.Errorf("b's head with a rate key not looked up: %v %v", blocked, keys)
	}
	if blocked, _ := jumpsQueue(cfg, st, a, map[string]bool{"k": true}); blocked {
		t.Error("refused for b whose head is gated")
	}
	if blocked, keys := jumpsQueue(cfg, st, a, map[string]bool{"k": false}); !blocked || len(keys) != 0 {
		t.Errorf("b's head known not gated: %v %v", blocked, keys)
	}
	// Looked up already, a key not among those looked up (a head that came since) is not gated
	// and not asked again.
	if blocked, keys := jumpsQueue(cfg, st, a, map[string]bool{"other": true}); !blocked || len(keys) != 0 {
		t.Errorf("b's head came after the lookup: %v %v", blocked, keys)
	}
	if blocked, _ := jumpsQueue(cfg, st, config.Unit{Tenant: "c"}, nil); blocked {
		t.Error("c, with nothing in flight, refused")
	}
	// Weights: b at 1 in flight is ahead of a at 2 unless a weighs twice as much, and b at 1 is
	// ahead of a at 1 when b weighs more.
	st.Usage = usage(map[string]int{"a": 2, "b": 1})
	st.Waiting[0] = store.Waiting{Tenant: "b", Due: true}
	aa := config.Unit{Tenant: "a"}
	if blocked, _ := jumpsQueue(cfg, st, aa, nil); !blocked {
		t.Error("a (2 in flight) not refused for b (1 in flight), unweighted")
	}
	wcfg := cfg
	wcfg.TenantWeights = map[string]float64{"a": 2}
	if blocked, _ := jumpsQueue(wcfg, st, aa, nil); blocked {
		t.Error("a (weight 2, 2 in flight) refused for b (weight 1, 1 in flight)")
	}
	st.Usage = usage(map[string]int{"a": 1, "b": 1, "x": 1})
	wcfg.TenantWeights = map[string]float64{"b": 2}
	if blocked, _ := jumpsQueue(wcfg, st, a, nil); !blocked {
		t.Error("a (weight 1, 1 in flight) not refused for b (weight 2, 1 in flight)")
	}
	st.Usage = usage(map[string]int{"a": 1, "x": 1})
	if blocked, _ := jumpsQueue(cfg, st, a, nil); blocked {
		t.Error("refused with room for b's job and the slot")
	}
	// The reserve: an interactive slot within it is exempt; a non-interactive one sees only what
	// the reserve leaves.
	cfg.InteractiveReserve = 1
	st.Config = cfg
	if blocked, _ := jumpsQueue(cfg, st, config.Unit{Tenant: "a", Interactive: true}, nil); blocked {
		t.Error("an interactive slot within the reserve refused")
	}
	if blocked, _ := jumpsQueue(cfg, st, a, nil); !blocked {
		t.Error("a non-interactive slot took the unit b needs, the reserve's aside")
	}
}

// TestDecideSlot: the rollout modes over a verdict that refuses and one that fits. A slot counts
// only where enforce would grant it; granted past a limit (shadow, aware, off) it does not, so a
// caller looping grants takes nothing from the queue.
func TestDecideSlot(t *testing.T) {
	cfg := config.Default()
	cfg.TenantInFlight = 1
	us := config.NewUsage()
	us.Add(cfg, config.Unit{Tenant: "a"}, 1)
	full, free := config.Unit{Tenant: "a"}, config.Unit{Tenant: "b"}
	for _, tc := range []struct {
		mode, enforceFor string
		aware            bool
		unit             config.Unit
		want             Decision
		grant, counted   bool
	}{
		{config.ModeEnforce, config.EnforceAll, false, full, Refused, false, false},
		{config.ModeEnforce, config.EnforceAware, false, full, ShadowRefused, true, false},
		{config.ModeEnforce, config.EnforceAware, true, full, Refused, false, false},
		{config.ModeShadow, config.EnforceAll, true, full, ShadowRefused, true, false},
		{config.ModeOff, config.EnforceAll, true, full, "", true, false},
		{config.ModeEnforce, config.EnforceAll, true, free, Admitted, true, true},
		{config.ModeEnforce, config.EnforceAware, false, free, Admitted, true, true},
		{config.ModeShadow, config.EnforceAll, false, free, Admitted, true, true},
		{config.ModeOff, config.EnforceAll, false, free, "", true, true},
	} {
		cfg.AdmissionMode, cfg.EnforceFor = tc.mode, tc.enforceFor
		d := decideSlot(store.SlotState{Config: cfg, Usage: us}, tc.unit, tc.aware, nil)
		if d.decision != tc.want || d.grant != tc.grant || d.counted != tc.counted || len(d.heldBy) != 0 ||
			(tc.unit.Tenant == full.Tenant && d.verdict.Scope != config.ScopeTenant) {
			t.Errorf("%s/%s aware %v %s: %+v", tc.mode, tc.enforceFor, tc.aware, tc.unit.Tenant, d)
		}
	}
}

// TestDecideSlotHeldByGates: a slot the fair-order rule holds back for heads whose rate keys were
// not looked up is granted in no mode (decision says what it would be), and names the keys; once
// they are looked up it is decided: refused or uncounted while a head ahead is not gated, counted
// when every head ahead is gated.
func TestDecideSlotHeldByGates(t *testing.T) {
	cfg := config.Default() // global 4, tenant 2
	us := config.NewUsage()
	us.Add(cfg, config.Unit{Tenant: "a"}, 1)
	us.Add(cfg, config.Unit{Tenant: "x"}, 2)
	st := store.SlotState{Config: cfg, Usage: us, Waiting: []store.Waiting{{Tenant: "b", Due: true, HeadRateKey: "k"}}}
	a := config.Unit{Tenant: "a"}
	for _, tc := range []struct {
		mode, enforceFor string
		gated            map[string]bool
		want             Decision
		grant, counted   bool
		heldBy           []string
	}{
		{config.ModeEnforce, config.EnforceAll, nil, Refused, false, false, []string{"k"}},
		{config.ModeShadow, config.EnforceAll, nil, ShadowRefused, false, false, []string{"k"}},
		{config.ModeOff, config.EnforceAll, nil, "", false, false, []string{"k"}},
		{config.ModeEnforce, config.EnforceAll, map[string]bool{"k": false}, Refused, false, false, nil},
		{config.ModeShadow, config.EnforceAll, map[string]bool{"k": false}, ShadowRefused, true, false, nil},
		{config.ModeShadow, config.EnforceAll, map[string]bool{}, ShadowRefused, true, false, nil},
		{config.ModeOff, config.EnforceAll, map[string]bool{"k": false}, "", true, false, nil},
		{config.ModeShadow, config.EnforceAll, map[string]bool{"k": true}, Admitted, true, true, nil},
		{config.ModeOff, config.EnforceAll, map[string]bool{"k": true}, "", true, true, nil},
	} {
		st.Config.AdmissionMode, st.Config.EnforceFor = tc.mode, tc.enforceFor
		d := decideSlot(st, a, false, tc.gated)
		if d.decision != tc.want || d.grant != tc.grant || d.counted != tc.counted || !slices.Equal(d.heldBy, tc.heldBy) {
			t.Errorf("%s gated %v: %+v", tc.mode, tc.gated, d)
		}
	}
}
