package drainer

import (
	"github.com/sluicehq/sluice/gate/limits"
)

// pick returns the tenant whose head job goes next under cfg.Ordering, or "" if none may. It is
// one pass over cands that allocates nothing: choose calls it once per job it takes, so with 64
// tenants and 64 free slots a pass makes 4,096 steps (gathering the eligible tenants into a
// fresh slice first, and sorting it for round_robin, made pick a third of the claim's Go CPU
// time in BenchmarkDrainThroughput). Every ordering is a total order (job ids break the ties),
// so the map's iteration order does not matter. The tenants in skip are left out (none of their
// candidates fits the caps now).
func (cl *claimer) pick(cfg limits.Config, cands map[string][]candidate, inFlight map[string]int, skip map[string]bool) string {
	best, first := "", ""
	var bestN int // inFlight[best]
	var bestHead candidate
	for t, cs := range cands {
		if len(cs) == 0 || skip[t] {
			continue
		}
		n := inFlight[t]
		if n >= cfg.TenantCap(t) {
			continue
		}
		switch cfg.Ordering {
		case limits.RoundRobin:
			// The first name after the tenant served last, else the first name of all.
			if first == "" || t < first {
				first = t
			}
			if t > cl.rrLast && (best == "" || t < best) {
				best = t
			}
			continue
		case limits.FIFO:
			if best != "" && !cs[0].before(bestHead) {
				continue
			}
		default: // fair: fewest in flight, then the oldest head
			if best != "" && (n > bestN || n == bestN && !cs[0].before(bestHead)) {
				continue
			}
		}
		best, bestN, bestHead = t, n, cs[0]
	}
	if cfg.Ordering == limits.RoundRobin {
		if best == "" {
			best = first
		}
		if best != "" {
			cl.rrLast = best
		}
	}
	return best
}
