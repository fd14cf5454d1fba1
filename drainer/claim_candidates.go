package drainer

import (
	"context"
	"math"
	"slices"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/store"
)

// want is how many queue heads a pass reads for one tenant.
type want struct {
	tenant string
	n      int // heads to read: room plus gateSlack, plus deeper while a lane is full
	room   int // jobs the tenant could start now
	// interactive: the tenant has interactive queued jobs, read first; prioritized: it has jobs
	// of another priority than the default, read by priority (store.HeadsWant).
	interactive, prioritized bool
	// deeper: a lane is full, so the tenant's heads may be jobs the claim skips (SPEC §5a).
	deeper bool
	// only is the tenant's one queued job, read with the page (tenantPage.only), or nil.
	only *store.QueuedJob
}

// wants returns the tenants of page below their cap, with how many heads to read for each,
// and whether a tenant with work was left out at a cap. A tenant at its cap is skipped without
// reading its backlog. While a lane is full (as us counts it), the claim skips the jobs that
// name it without blocking their tenants' other jobs, so each tenant is read deeper, by as many
// heads as the pass has free slots: how far a pass looks past a tenant's head is bounded by its
// free slots, never by the tenant's backlog.
func (cl *claimer) wants(cfg config.Config, us config.Usage, page tenantPage) (ws []want, capped bool) {
	free := cfg.GlobalInFlight - us.Total
	if free <= 0 {
		return nil, len(page.tenants) > 0
	}
	for _, t := range page.tenants {
		room := cfg.TenantCap(t) - us.Tenant[t]
		if room <= 0 {
			capped = true
			continue
		}
		ws = append(ws, want{tenant: t, room: min(room, free, cl.cfg.ClaimBatch), interactive: page.interactive[t],
			prioritized: page.prioritized[t], only: page.only[t]})
	}
	deeper := 0
	if laneFull(cfg, us) {
		deeper = min(free, cl.cfg.ClaimBatch)
	}
	// A pass reads each tenant's fair share of the free slots, in proportion to its weight, not
	// each tenant's full room: with 64 tenants and 64 free slots that is 1 head each instead of
	// 64. A tenant whose share runs out while it may have more stops the pass early (see
	// choose), and the next pass goes on.
	slots, total := float64(min(free, cl.cfg.ClaimBatch)), 0.0
	for _, w := range ws {
		total += cfg.Weight(w.tenant)
	}
	for i := range ws {
		share := int(math.Ceil(slots * cfg.Weight(ws[i].tenant) / total))
		ws[i].room = min(ws[i].room, max(share, 1))
		ws[i].n = ws[i].room + gateSlack + deeper
		ws[i].deeper = deeper > 0
	}
	return ws, capped
}

// laneFull reports whether some configured lane has no room left in us.
func laneFull(cfg config.Config, us config.Usage) bool {
	for l, n := range cfg.Lanes {
		if us.Lane[l] >= n {
			return true
		}
	}
	return false
}

// heads returns, for each tenant of ws, its first eligible queued jobs in claim order (at most
// w.n), leaving out the jobs of the rate keys in excluded (keys found gated earlier in the pass):
// store.ReadHeads, with the jobs queued for longer than cfg's priority_aging_seconds aged. cut
// are the tenants whose heads the read cut short: more exist, however few it returned.
func (cl *claimer) heads(ctx context.Context, now time.Time, cfg config.Config, ws []want, excluded []string) (map[string][]candidate, map[string]bool, error) {
	p := store.HeadsParams{Now: now, AgedBefore: now.Add(-cfg.PriorityAging()), Excluded: excluded,
		Tenants: make([]store.HeadsWant, len(ws)), Cut: map[string]bool{}}
	for i, w := range ws {
		p.Tenants[i] = store.HeadsWant{Tenant: w.tenant, N: w.n, Interactive: w.interactive, Prioritized: w.prioritized}
	}
	read, err := store.ReadHeads(ctx, cl.cfg.DB, p)
	if err != nil {
		return nil, nil, err
	}
	out := make(map[string][]candidate, len(read))
	for t, hs := range read {
		cs := make([]candidate, len(hs))
		for i, h := range hs {
			cs[i] = candidateOf(h)
		}
		out[t] = cs
	}
	return out, p.Cut, nil
}

// gateSlack is how many extra heads per tenant a pass reads so that a gated key at the head of
// a tenant's queue usually costs no second read.
const gateSlack = 4

// gateRounds bounds the gate lookups of one pass. A tenant whose heads are all of gated keys is
// read again without those keys, and the keys of the new heads are looked up in turn; each round
// excludes every key found gated so far, so only a tenant with more than about
// gateRounds × (room + gateSlack) distinct gated keys at its head can still wait a pass. The
// keys found gated are remembered for a poll period (gatedSeen), so the next pass starts by
// excluding them and goes deeper: a tenant's ungated job behind many gated keys waits a few
// passes, not until the gates end.
const gateRounds = 4

// gatedSeen remembers the rate keys recent passes found gated, each until its gate ends or a
// poll period has passed, whichever is first: a gate cleared by an operator is noticed within a
// poll period.
type gatedSeen map[string]gatedUntil

type gatedUntil struct{ notBefore, forget time.Time }

// at returns the keys known to be gated at now, with their not-before instants, and forgets
// the rest.
func (g *gatedSeen) at(now time.Time) map[string]time.Time {
	out := map[string]time.Time{}
	for k, u := range *g {
		if !now.Before(u.forget) || !u.notBefore.After(now) {
			delete(*g, k)
			continue
		}
		out[k] = u.notBefore
	}
	return out
}

// learn remembers the keys of nb gated at now, for at most memory.
func (g *gatedSeen) learn(nb map[string]time.Time, now time.Time, memory time.Duration) {
	if *g == nil {
		*g = gatedSeen{}
	}
	for k, t := range nb {
		if t.After(now) {
			(*g)[k] = gatedUntil{notBefore: t, forget: now.Add(memory)}
		}
	}
}

// candidates returns, per tenant below its cap, the tenant's oldest eligible queued jobs whose
// rate key is not gated at now, whether each may have more, and whether tenants with work may
// remain beyond the pages read. The tenants come from page and, while they give fewer eligible
// jobs than there are free slots, from the pages after it (at most maxTenantPages in all). The
// heads come from the headCache or a read of at least room + gateSlack heads per tenant, and one
// GetMulti looks up their keys; only a tenant left with fewer candidates than its room, whose
// read was full (so more may exist), is read again with the gated keys excluded, so a gated key
// never hides the tenant's other keys. A failing gate store fails open: whatever is not known to
// be gated is a candidate. No transaction is open while memcached is asked.
func (cl *claimer) candidates(ctx context.Context, now time.Time, cfg config.Config, us config.Usage, page tenantPage) (map[string][]candidate, map[string]bool, bool, error) {
	cands, more := map[string][]candidate{}, map[string]bool{}
	free := min(cfg.GlobalInFlight-us.Total, cl.cfg.ClaimBatch)
	inFlight := us.Tenant
	capped := false
	for pages := 1; ; pages++ {
		ws, c := cl.wants(cfg, us, page)
		capped = capped || c
		if len(ws) > 0 {
			pc, pm, err := cl.gatedCandidates(ctx, now, cfg, us, ws)
			if err != nil {
				return nil, nil, false, err
			}
			for _, w := range ws {
				cands[w.tenant], more[w.tenant] = pc[w.tenant], pm[w.tenant]
			}
		}
		if !page.full || pages == maxTenantPages || free <= 0 || enough(cfg, cands, inFlight, free) {
			break
		}
		from := page
		if pages == 1 && cl.resume != nil && after(cfg, *cl.resume, page.after) {
			// The last pass read this far without finding enough: go on from there, so tenants
			// behind more than maxTenantPages pages of gated or capped ones are reached in a
			// few passes rather than when the gates end.
			from.after = *cl.resume
		}
		next, err := cl.nextTenants(ctx, cfg, from)
		if err != nil {
			return nil, nil, false, err
		}
		page = next
	}
	switch {
	case !page.full:
		cl.resume = nil // read to the last tenant with work
	case !enough(cfg, cands, inFlight, free):
		cl.resume = &page.after
	}
	// A tenant left waiting at a cap, or tenants not read, mean more than one job is queued: no
	// lone-job probe.
	cl.probe = !capped && !page.full
	return cands, more, page.full, nil
}

// after reports whether position a comes after b in cfg's ordering of the tenants index.
func after(cfg config.Config, a, b tenantKey) bool {
	if cfg.Ordering == config.RoundRobin {
		if a.wrapped != b.wrapped {
			return a.wrapped
		}
		return a.name > b.name
	}
	if !a.headAt.Equal(b.headAt) {
		return a.headAt.After(b.headAt)
	}
	return a.headID > b.headID
}

// enough reports whether cands fill free slots with jobs that no unread tenant could go before:
// under fair, only tenants with nothing in flight count (an unread tenant with nothing in flight
// goes before a read one with jobs in flight), and so under fair_time, as an approximation (an
// unread tenant's time used is not known); under fifo and round_robin, every candidate does
// (pages come in the ordering's own order).
func enough(cfg config.Config, cands map[string][]candidate, inFlight map[string]int, free int) bool {
	n := 0
	for t, cs := range cands {
		if (cfg.Ordering == config.Fair || cfg.Ordering == config.FairTime) && inFlight[t] > 0 {
			continue
		}
		n += min(len(cs), max(cfg.TenantCap(t)-inFlight[t], 0))
	}
	return n >= free
}

// firstHeads returns the heads of ws: a tenant's one queued job when the page gave it, its cached
// ones when it has more than its share of this pass (see headCache), else read, headsPerRead at
// least, and the reads that outnumber the tenant's share cached. full reports, per tenant,
// whether more queued jobs exist beyond the heads returned. A tenant with interactive queued jobs
// is always read (an interactive job admitted after its heads were cached goes before them), and
// while a lane is full a tenant's cached heads are used only if one of them fits (us), else it is
// read deeper.
func (cl *claimer) firstHeads(ctx context.Context, now time.Time, cfg config.Config, us config.Usage, ws []want) (map[string][]candidate, map[string]bool, error) {
	cands := map[string][]candidate{}
	full := map[string]bool{}
	var miss []want
	for _, w := range ws {
		if w.only != nil {
			// The page gave the tenant's one queued job: all a read would find.
			var cs []candidate
			if nb := w.only.NotBefore; !nb.Valid || !nb.Time.After(now) {
				cs = []candidate{candidateOf(w.only.Head)}
			}
			cands[w.tenant], full[w.tenant] = cs, false
			cl.headCache.invalidate(w.tenant)
			continue
		}
		// More cached heads than the tenant's share: the pass ends at a tenant's last known
		// head (see choose), and that should not happen on a cached one.
		if cs := cl.headCache.take(w.tenant); len(cs) > w.room && !w.interactive && !w.prioritized && (!w.deeper || fits(cfg, us, cs) >= 0) {
			cands[w.tenant], full[w.tenant] = cs, true
			continue
		}
		w.n = max(w.n, headsPerRead)
		miss = append(miss, w)
	}
	read, cut, err := cl.heads(ctx, now, cfg, miss, nil)
	if err != nil {
		return nil, nil, err
	}
	for _, w := range miss {
		cs := read[w.tenant]
		cands[w.tenant], full[w.tenant] = cs, len(cs) >= w.n || cut[w.tenant]
		if len(cs) > w.room {
			cl.headCache.keep(w.tenant, cs)
		} else {
			// No more than its share: a later pass would seldom take them from the cache (see above),
			// and with many tenants of a job or two such entries would only fill the map.
			cl.headCache.invalidate(w.tenant)
		}
	}
	return cands, full, nil
}

// gatedCandidates returns the heads of ws without those of gated rate keys, re-reading tenants
// whose heads were all gated, and whether each tenant may have more eligible jobs than returned.
func (cl *claimer) gatedCandidates(ctx context.Context, now time.Time, cfg config.Config, us config.Usage, ws []want) (map[string][]candidate, map[string]bool, error) {
	cands, full, err := cl.firstHeads(ctx, now, cfg, us, ws)
	if err != nil || cl.cfg.RateGates == nil {
		return cands, full, err
	}
	looked := map[string]bool{}
	var gated []string
	known := cl.gatedSeen.at(now)
	for k := range known {
		looked[k] = true
		gated = append(gated, k)
	}
	dropGated(cands, known, now)
	for round := 1; ; round++ {
		var keys []string
		for _, cs := range cands {
			for _, c := range cs {
				if c.rateKey.Valid && !looked[c.rateKey.String] {
					looked[c.rateKey.String] = true
					keys = append(keys, c.rateKey.String)
				}
			}
		}
		if len(keys) > 0 {
			nb, err := cl.cfg.RateGates.NotBefore(ctx, keys)
			if err != nil && cl.cfg.Metrics != nil {
				cl.cfg.Metrics.GateUnavailable.Inc()
			}
			for _, k := range keys {
				if t, ok := nb[k]; ok && t.After(now) {
					gated = append(gated, k)
				}
			}
			cl.gatedSeen.learn(nb, now, cl.cfg.PollInterval)
			dropGated(cands, nb, now)
			if err != nil {
				return cands, full, nil // fail open: no second read on an unreliable answer
			}
		}
		if round == gateRounds || len(gated) == 0 {
			return cands, full, nil
		}
		var again []want
		for _, w := range ws {
			if len(cands[w.tenant]) < w.room && full[w.tenant] {
				again = append(again, w)
			}
		}
		if len(again) == 0 {
			return cands, full, nil
		}
		more, cut, err := cl.heads(ctx, now, cfg, again, gated)
		if err != nil {
			return nil, nil, err
		}
		for _, w := range again {
			cands[w.tenant] = more[w.tenant]
			full[w.tenant] = len(more[w.tenant]) >= w.n || cut[w.tenant]
		}
	}
}

// dropGated removes from cands the jobs whose rate key is gated at now according to gates. A
// tenant's slice may be the headCache's (take), so one that loses a job is replaced, never
// written into.
func dropGated(cands map[string][]candidate, gates map[string]time.Time, now time.Time) {
	gated := func(c candidate) bool {
		nb, ok := gates[c.rateKey.String]
		return c.rateKey.Valid && ok && nb.After(now)
	}
	for t, cs := range cands {
		if slices.ContainsFunc(cs, gated) {
			cands[t] = slices.DeleteFunc(slices.Clone(cs), gated)
		}
	}
}
