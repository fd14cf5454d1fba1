package drainer

import (
	"sort"

	"github.com/sluicehq/sluice/gate/limits"
)

// pick returns the tenant whose head job goes next under cfg.Ordering, or "" if none may. The
// tenants in skip are left out (none of their candidates fits the caps now).
func (cl *claimer) pick(cfg limits.Config, cands map[string][]candidate, inFlight map[string]int, skip map[string]bool) string {
	var tenants []string
	for t, cs := range cands {
		if len(cs) > 0 && inFlight[t] < cfg.TenantCap(t) && !skip[t] {
			tenants = append(tenants, t)
		}
	}
	if len(tenants) == 0 {
		return ""
	}
	switch cfg.Ordering {
	case limits.RoundRobin:
		sort.Strings(tenants) // the other orderings need no sort: job ids break every tie
		for _, t := range tenants {
			if t > cl.rrLast {
				cl.rrLast = t
				return t
			}
		}
		cl.rrLast = tenants[0]
		return tenants[0]
	case limits.FIFO:
		best := tenants[0]
		for _, t := range tenants[1:] {
			if cands[t][0].before(cands[best][0]) {
				best = t
			}
		}
		return best
	default: // fair
		best := tenants[0]
		for _, t := range tenants[1:] {
			switch {
			case inFlight[t] < inFlight[best]:
				best = t
			case inFlight[t] == inFlight[best] && cands[t][0].before(cands[best][0]):
				best = t
			}
		}
		return best
	}
}
