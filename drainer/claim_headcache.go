package drainer

import (
	"slices"
	"sync"
)

// headsPerRead is how many queue heads a read takes for a tenant whose backlog is deeper than
// its share of one pass. Reading a tenant's heads costs a subquery of its own, whatever its
// LIMIT, so with many busy tenants reading one head per tenant on every pass would be much of
// the pass; kept in a headCache, one read serves several passes. Reading 32 costs about as much
// as reading 8 and serves four times as many passes.
const headsPerRead = 32

// headCache keeps, per tenant, the queue heads a pass read but did not claim, so that the next
// passes need not read them again. It only ever stands in for a read that would return the
// same jobs first:
//
//   - every job admitted later queues behind the cached ones (by queued_at), whether the read
//     took a tenant's first headsPerRead jobs or found its whole queue; a pass uses cached
//     heads only while they outnumber the tenant's share of it (firstHeads), so it never runs
//     past them, and the tenant is read again once they are claimed. The whole queue is kept
//     too: otherwise a tenant with a short queue would be read again on every pass until it
//     emptied, every job it had left read once a pass. A tenant with interactive or
//     prioritized jobs queued, which may go before older ones, is read on every pass;
//   - a job this drainer puts back in the queue keeps its place (queued_at), so its tenant's
//     entry is dropped (invalidate); jobs requeued by other drainers or by lease recovery are
//     seen at the latest when the whole cache is dropped, once per poll interval (reset);
//   - a cached head that was claimed or canceled elsewhere meanwhile is skipped by the claim's
//     fence, and its tenant's entry is dropped;
//   - gates are looked up for cached heads on every pass, as for read ones.
//
// Safe for concurrent use: outcome recording invalidates tenants while passes run.
type headCache struct {
	mu sync.Mutex
	m  map[string][]candidate
}

// take returns tenant's cached heads, or nil if it has none. The slice is the cache's own, which
// the cache never writes into (keep and claimed make new ones): its reader must not write into
// it either, and its capacity ends at its length, so an append copies. A copy of every tenant's
// heads on every pass would be the drain's largest allocation.
func (h *headCache) take(tenant string) []candidate {
	h.mu.Lock()
	defer h.mu.Unlock()
	cs := h.m[tenant]
	return cs[:len(cs):len(cs)]
}

// keep caches the heads of a full read of tenant.
func (h *headCache) keep(tenant string, cs []candidate) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[string][]candidate{}
	}
	if len(cs) == 0 {
		delete(h.m, tenant)
		return
	}
	h.m[tenant] = append([]candidate(nil), cs...)
}

// claimed removes the jobs of ids that the claim attempted from the cache; the tenants of those
// it did not get (taken or canceled elsewhere) lose their whole entry. It visits only the tenants
// of chosen, not every tenant cached.
func (h *headCache) claimed(chosen []candidate, got map[int64]bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	gone := map[int64]bool{}
	stale := map[string]bool{}
	for _, c := range chosen {
		gone[c.id] = true
		stale[c.tenant] = stale[c.tenant] || !got[c.id]
	}
	isGone := func(c candidate) bool { return gone[c.id] }
	for t, lost := range stale {
		cs, ok := h.m[t]
		if !ok {
			continue
		}
		if lost {
			delete(h.m, t)
			continue
		}
		// Claims take heads from the front: the rest is a subslice, and only jobs gone from
		// further in cost a new slice (passes may still hold the old one: see take).
		k := 0
		for k < len(cs) && gone[cs[k].id] {
			k++
		}
		kept := cs[k:]
		if slices.ContainsFunc(kept, isGone) {
			kept = slices.DeleteFunc(slices.Clone(kept), isGone)
		}
		if len(kept) == 0 {
			delete(h.m, t)
		} else {
			h.m[t] = kept
		}
	}
}

// invalidate drops tenant's entry: one of its jobs went back to the queue.
func (h *headCache) invalidate(tenant string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.m, tenant)
}

// reset drops every entry.
func (h *headCache) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.m = nil
}
