package drainer

import (
	"container/heap"

	"github.com/sluicehq/sluice/gate/config"
)

// picker hands choose the tenants in cfg's ordering, one per job it takes: next returns the
// tenant whose head job goes next. Between two calls choose may take the head of the tenant
// returned last (its cands shrink, its inFlight grows) or skip it; nothing else changes. Under
// fair and fifo it keeps the tenants in a heap, so that a choose of n jobs over t tenants costs
// n log t steps where pick's scan costs n·t (4,096 with 64 tenants and 64 free slots, enough to
// make pick the drain's costliest Go function); round_robin, which turns a name cursor, scans
// with pick.
type picker struct {
	ch   *chooser
	h    *tenantHeap // choose's cands and counts; a heap of the tenants but for round_robin
	last string      // the tenant next returned last, still at the heap's top
}

// picker returns the chooser's picker for one choose, its heap's array reused from the last.
func (ch *chooser) picker(cfg config.Config, cands map[string][]candidate, inFlight map[string]int) *picker {
	h := &ch.heap
	*h = tenantHeap{cfg: cfg, cands: cands, inFlight: inFlight, used: ch.timeUsed, ts: h.ts[:0]}
	p := &ch.picks
	*p = picker{ch: ch, h: h}
	if cfg.Ordering == config.RoundRobin {
		return p
	}
	p.h.ordered = true
	for t := range cands {
		if p.h.open(t, nil) {
			p.h.ts = append(p.h.ts, t)
		}
	}
	heap.Init(p.h)
	return p
}

// next returns the tenant whose head job goes next, or "" if none may, leaving out the tenants
// in skip.
func (p *picker) next(skip map[string]bool) string {
	h := p.h
	if !h.ordered {
		return p.ch.pick(h.cfg, h.cands, h.inFlight, skip)
	}
	if p.last != "" {
		if h.open(p.last, skip) {
			heap.Fix(h, 0)
		} else {
			// heap.Pop, without boxing the string it returns.
			n := len(h.ts) - 1
			h.ts[0], h.ts[n] = h.ts[n], h.ts[0]
			h.ts = h.ts[:n]
			if n > 0 {
				heap.Fix(h, 0)
			}
		}
		p.last = ""
	}
	if h.Len() == 0 {
		return ""
	}
	p.last = h.ts[0]
	return p.last
}

// tenantHeap is the tenants that may go, least first in fair's order (the lowest in flight ÷
// weight, then the oldest head), fair_time's (fairOrder) or fifo's (the oldest head). Every order is total (job ids break the ties).
type tenantHeap struct {
	cfg      config.Config
	cands    map[string][]candidate
	inFlight map[string]int
	ordered  bool // fair, fair_time or fifo: ts is a heap
	ts       []string
	// used is each tenant's executor time used (store.TimeUsed), for fair_time.
	used map[string]float64
}

// open reports whether tenant t may go: it has a candidate, room under its cap, and is not in
// skip.
func (h *tenantHeap) open(t string, skip map[string]bool) bool {
	return len(h.cands[t]) > 0 && !skip[t] && h.inFlight[t] < h.cfg.TenantCap(t)
}

func (h *tenantHeap) Len() int { return len(h.ts) }

func (h *tenantHeap) Less(i, j int) bool {
	a, b := h.ts[i], h.ts[j]
	if before, tie := fairOrder(h.cfg, h.used, a, h.inFlight[a], b, h.inFlight[b]); !tie {
		return before
	}
	return h.cands[a][0].before(h.cands[b][0])
}

func (h *tenantHeap) Swap(i, j int) { h.ts[i], h.ts[j] = h.ts[j], h.ts[i] }

func (h *tenantHeap) Push(x any) { h.ts = append(h.ts, x.(string)) }

func (h *tenantHeap) Pop() any {
	t := h.ts[len(h.ts)-1]
	h.ts = h.ts[:len(h.ts)-1]
	return t
}

// fairOrder compares tenants a and b, with na and nb units in flight, under cfg's ordering:
// before reports whether a goes strictly before b, tie whether neither does (the oldest head
// decides). fair compares in flight ÷ weight (config.Config.FairBefore); fair_time the executor
// time used (used, decayed) plus config.FairTimeHorizon for each unit held, ÷ weight; fifo and
// round_robin always tie.
func fairOrder(cfg config.Config, used map[string]float64, a string, na int, b string, nb int) (before, tie bool) {
	switch cfg.Ordering {
	case config.Fair:
		if cfg.FairBefore(a, na, b, nb) {
			return true, false
		}
		return false, !cfg.FairBefore(b, nb, a, na)
	case config.FairTime:
		h := config.FairTimeHorizon.Seconds()
		sa := (used[a] + float64(na)*h) * cfg.Weight(b)
		sb := (used[b] + float64(nb)*h) * cfg.Weight(a)
		return sa < sb, sa == sb
	}
	return false, true
}

// pick returns the tenant whose head job goes next under cfg.Ordering, or "" if none may: one
// scan over cands that allocates nothing (round_robin's picker; the others' reference). Every
// ordering is a total order (job ids break the ties),
// so the map's iteration order does not matter. The tenants in skip are left out (none of their
// candidates fits the caps now).
func (ch *chooser) pick(cfg config.Config, cands map[string][]candidate, inFlight map[string]int, skip map[string]bool) string {
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
		case config.RoundRobin:
			// The first name after the tenant served last, else the first name of all.
			if first == "" || t < first {
				first = t
			}
			if t > ch.rrLast && (best == "" || t < best) {
				best = t
			}
			continue
		case config.FIFO:
			if best != "" && !cs[0].before(bestHead) {
				continue
			}
		default: // fair and fair_time: the lowest share used ÷ weight, then the oldest head
			if best != "" {
				if before, tie := fairOrder(cfg, ch.timeUsed, t, n, best, bestN); !before && (!tie || !cs[0].before(bestHead)) {
					continue
				}
			}
		}
		best, bestN, bestHead = t, n, cs[0]
	}
	if cfg.Ordering == config.RoundRobin {
		if best == "" {
			best = first
		}
		if best != "" {
			ch.rrLast = best
		}
	}
	return best
}
