package config

import (
	"slices"
	"sort"
)

// Capacity is decided in one place for everything that takes a unit of the box (SPEC §5a): a
// job the claim is about to start, a slot about to be granted, a queue=false admission. Jobs in
// flight and live slots are counted together in Usage, so every limit holds for their sum.

// Scopes a capacity refusal names (SPEC §5a); a lane's scope is LanePrefix + its name.
const (
	ScopeGlobal  = "global"
	ScopeTenant  = "tenant"
	ScopeTier    = "tier"
	ScopeReserve = "reserve"
	LanePrefix   = "lane:"
)

// Unit is what asks for capacity: a job or a slot.
type Unit struct {
	Tenant      string
	Lanes       []string
	Interactive bool
}

// Usage is what is in flight, jobs and live slots together.
type Usage struct {
	Total int
	// Interactive is how many of Total are interactive (they use the reserve first).
	Interactive int
	Tenant      map[string]int
	Tier        map[string]int
	Lane        map[string]int
}

// NewUsage returns an empty Usage.
func NewUsage() Usage {
	return Usage{Tenant: map[string]int{}, Tier: map[string]int{}, Lane: map[string]int{}}
}

// Add counts n more units like u (n may be negative, to take units away).
func (us *Usage) Add(c Config, u Unit, n int) {
	us.Total += n
	if u.Interactive {
		us.Interactive += n
	}
	us.Tenant[u.Tenant] += n
	us.Tier[c.Tier(u.Tenant)] += n
	for _, l := range u.Lanes {
		us.Lane[l] += n
	}
}

// Verdict is the answer for one unit.
type Verdict struct {
	// OK: every limit that applies has room for the unit.
	OK bool
	// Scope is the limit that refuses (when !OK), else the fullest limit that applies (the one
	// with the least room, global first on a tie). Limit and InFlight are that scope's.
	Scope    string
	Paused   bool // the refusing limit is 0
	Limit    int
	InFlight int
	// Tier is the unit's tier; TierLimit is its ceiling (the global cap for a tier without one)
	// and TierInFlight its use.
	Tier         string
	TierLimit    int
	TierInFlight int
	// Suggested is how many more units the tenant may start at once: 0 while a limit that
	// applies is paused, else at least 1 (its room under the tenant cap, at most the room
	// globally).
	Suggested int
}

type scope struct {
	name            string // a lane's name when lane
	lane            bool
	limit, inFlight int
}

func (s scope) room() int { return s.limit - s.inFlight }

// Check decides whether one more unit like u fits under every limit, as counted in us. A paused
// limit (0) is reported before a full one; among full limits the order is global, reserve,
// tier, tenant, then the lanes by name. The claim calls it for every job it considers, so it
// allocates nothing (TestCheckAllocatesNothing): the scopes live in an array, stored lanes come
// sorted (JoinLanes), and a lane's scope name is built only when the answer names it.
func (c Config) Check(us Usage, u Unit) Verdict {
	tier := c.Tier(u.Tenant)
	var buf [12]scope
	scopes := append(buf[:0], scope{name: ScopeGlobal, limit: c.GlobalInFlight, inFlight: us.Total})
	if c.InteractiveReserve > 0 && !u.Interactive {
		// Interactive units in flight use the reserve first; the rest of the box is what
		// non-interactive units may fill.
		scopes = append(scopes, scope{name: ScopeReserve, limit: max(c.GlobalInFlight-c.InteractiveReserve, 0), inFlight: us.Total - us.Interactive})
	}
	v := Verdict{Tier: tier, TierLimit: c.GlobalInFlight, TierInFlight: us.Tier[tier]}
	if n, ok := c.TierInFlight[tier]; ok {
		scopes = append(scopes, scope{name: ScopeTier, limit: n, inFlight: us.Tier[tier]})
		v.TierLimit = n
	}
	scopes = append(scopes, scope{name: ScopeTenant, limit: c.TenantCap(u.Tenant), inFlight: us.Tenant[u.Tenant]})
	tenant := len(scopes) - 1
	lanes := u.Lanes
	if !sort.StringsAreSorted(lanes) {
		lanes = slices.Sorted(slices.Values(lanes))
	}
	for _, l := range lanes {
		scopes = append(scopes, scope{name: l, lane: true, limit: c.Lanes[l], inFlight: us.Lane[l]})
	}
	refuse := -1
	for i, s := range scopes {
		if s.limit == 0 && s.name != ScopeReserve {
			refuse, v.Paused = i, true
			break
		}
	}
	if refuse < 0 {
		for i, s := range scopes {
			if s.room() <= 0 {
				refuse = i
				break
			}
		}
	}
	fullest := 0
	for i, s := range scopes {
		if s.room() < scopes[fullest].room() {
			fullest = i
		}
	}
	pick := fullest
	if refuse >= 0 {
		pick = refuse
	}
	v.OK = refuse < 0
	v.Scope, v.Limit, v.InFlight = scopes[pick].name, scopes[pick].limit, scopes[pick].inFlight
	if scopes[pick].lane {
		v.Scope = LanePrefix + v.Scope
	}
	if !v.Paused {
		v.Suggested = max(min(scopes[tenant].room(), scopes[0].room()), 1)
	}
	return v
}

// Known reports whether every lane named is configured, or the first that is not: an unknown lane is refused at
// admission (400) and by a slot request.
func (c Config) Known(lanes []string) (unknown string, ok bool) {
	for _, l := range lanes {
		if _, ok := c.Lanes[l]; !ok {
			return l, false
		}
	}
	return "", true
}
