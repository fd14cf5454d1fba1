package drainer

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// claimer chooses and claims queued jobs: the tenant pages and candidate reads
// (claim_tenants.go, claim_candidates.go), the gate lookups, the choice (claim_choice.go,
// claim_pick.go), the claim transaction (claim_tx.go) and the lone-job probe (claim_probe.go).
// RunOnce is one claim; the Drainer's pass calls it, and nothing else does, so the state it owns
// needs no lock: the round_robin position, the lone-job probe flag and the gated keys seen
// lately. poked is the exception: Poke sets it from any goroutine. The shortcuts it takes are
// tabled in the package doc.
//
// It reads the Drainer's Config and never writes it; it writes the runtime config each claim
// transaction reads to config, hands the jobs it claims to leases (which renews them until their
// outcomes are recorded), and keeps the queue heads it read but did not claim in heads.
type claimer struct {
	cfg        *Config
	store      *store.Store
	config     *configView
	headCache  *headCache
	leases     *leaseKeeper
	writer     *outcomeWriter // writes the outcomes a pass brings (outcomeHandoff)
	unanswered func() int64   // dispatches sent and not yet answered (dispatcher)

	poked atomic.Bool // a Poke since the last claim
	probe bool        // the last pass left the queue empty: the next one probes for a lone job
	// sawQueued: the last pass saw queued jobs (the lone-job probe found some, or the tenants
	// page held a tenant with work), eligible or not; the upkeep then looks for start deadlines
	// passed (a job past its deadline is no candidate, so the pass that skips it may find the
	// queue empty of candidates and set probe).
	sawQueued bool
	// sawPrioritized: a page named a tenant with rows in job_priorities, or the upkeep found rows
	// left there, and the table has not been found empty since; some rows may belong to jobs that
	// have ended (the upkeep deletes those).
	sawPrioritized bool
	// chooser decides which candidates a pass claims; its state (the round_robin position, the
	// executor time used under fair_time) is the claimer's.
	chooser
	gatedSeen gatedSeen // rate keys found gated by recent passes
	// resume is where the last pass's tenant pages ran out while they still gave too few
	// eligible jobs (see candidates); nil once a pass has read to the last tenant with work.
	resume *tenantKey
	// headsToAdvance are the tenants whose heads this drainer's claims left behind since
	// lastAdvance (store.Claimed.Behind), for advanceHeads to set forward.
	headsToAdvance map[string]bool
	lastAdvance    time.Time
	// firstPageFull: the last pass's first page of tenants was full (more tenants have work than
	// a page holds), so advanceHeads runs every HeadAdvance rather than every PollInterval.
	firstPageFull bool
	// nextRead is what the last claim leaves the next pass in place of passState's read (reuse).
	nextRead *passRead
}

// passRead is what a pass chooses by: the usage and the tenants page passState read, when, and
// under which ordering and page size. After its COMMIT a claim may leave it to the next pass
// (claimer.nextRead) as what passState would read next: the usage it counted under the claim
// lock plus what it claimed, and the tenants page it chose from, which held every tenant with
// work (not full) when it was read, at read.
type passRead struct {
	us       config.Usage
	page     tenantPage
	read     time.Time
	ordering config.Ordering
	perPage  int
}

// pageReuse bounds how long a tenants page read by passState serves the passes after it
// (reuse): a tenant whose first job arrives unannounced (no poke: the broker down) waits at
// most this long beyond the pass that would have read it.
const pageReuse = 100 * time.Millisecond

// reuse returns the read the last claim left (nextRead) for a pass that brings outs, the outcomes
// of that claim's jobs, when nothing it did not see may have happened since: no poke (a job
// admitted, a job requeued elsewhere), the page no older than pageReuse, the ordering and the page
// size as they were. Such a pass is the next step of a drain in which this drainer's claims and
// their answers are all that changes, and passState's read (the in-flight counts, the tenants page)
// would find what the claim counted under the lock, less the outcomes it brings, and that read is a
// noticeable part of a drain's cycle when the executor answers at once. Counts changed elsewhere
// meanwhile (another drainer's claims or outcomes, a slot) only shape the candidates: the claim
// counts again under the lock.
func (cl *claimer) reuse(now time.Time, cfg config.Config, outs *outcomeBatch, poked bool) *passRead {
	c := cl.nextRead
	cl.nextRead = nil
	if c == nil || outs == nil || poked || now.Sub(c.read) >= pageReuse || now.Before(c.read) ||
		c.ordering != cfg.Ordering || c.perPage != cl.tenantsPerPage(cfg) {
		return nil
	}
	return c
}

// advanceLater notes tenants whose heads a claim left behind, or that an advance skipped, for
// the next advanceHeads to set forward.
func (cl *claimer) advanceLater(tenants []string) {
	if len(tenants) == 0 {
		return
	}
	if cl.headsToAdvance == nil {
		cl.headsToAdvance = map[string]bool{}
	}
	for _, t := range tenants {
		cl.headsToAdvance[t] = true
	}
}

// advanceHeads sets forward the heads this drainer's claims left behind (store.AdvanceHeads),
// once HeadAdvance has passed since the last advance while tenants with work fill more than a
// page, else once PollInterval has. It never waits for a tenant locked elsewhere: such a tenant,
// and every tenant after a failure (logged), is kept for the next try. A head left behind only
// orders its tenant early, so the claims go on.
func (cl *claimer) advanceHeads(ctx context.Context, now time.Time) {
	every := cl.cfg.PollInterval
	if cl.firstPageFull {
		every = cl.cfg.HeadAdvance
	}
	if len(cl.headsToAdvance) == 0 || (now.Sub(cl.lastAdvance) < every && !now.Before(cl.lastAdvance)) {
		return
	}
	ts := make([]string, 0, len(cl.headsToAdvance))
	for t := range cl.headsToAdvance {
		ts = append(ts, t)
	}
	cl.lastAdvance = now
	skipped, err := store.AdvanceHeads(ctx, cl.cfg.TxDB, ts)
	cl.headsToAdvance = nil
	cl.advanceLater(skipped)
	if err != nil {
		cl.cfg.Log.Warn("could not set queue heads forward; will retry", "tenants", len(ts), "error", err)
	}
}

// RunOnce picks and claims jobs in one transaction, and commits them as dispatched (claim and
// dispatch are one transaction, so "claimed" is never visible and a job still claimed was never
// sent). outs, if not nil, are outcomes the pass brings (outcomeHandoff): a claim writes them in a
// transaction beside its own, which commits first, and answers them; outcomes left unanswered (no
// claim ran) are the caller's to write.
//
// Locking: the transaction runs at READ COMMITTED and first locks the single claim_lock row
// FOR UPDATE, so claims from every drainer are serialised. Inside, each statement reads the
// latest committed data: the caps (the newest runtime config row, read in the same statement as
// the lock) and the in-flight counts, which no concurrent claim can raise while the lock is held
// (completions can only lower them). The jobs of outs are locked beside that count, and what
// their outcomes take out of flight is subtracted from it: nothing else can move them until their
// COMMIT, which comes before the claim's (claimCandidates). The chosen jobs are moved by one
// UPDATE fenced on each id, version and the queued state, so a job canceled or taken since the
// candidate read is skipped. Hence no claim ever puts more jobs in flight than the caps as read
// in its own transaction. Candidate reads and the gate lookup happen before the transaction, so
// it never waits on memcached or scans a backlog, and the lock is held for two round trips (three
// when outcomes are written beside it).
func (cl *claimer) RunOnce(ctx context.Context, now time.Time, outs *outcomeBatch) ([]claimed, bool, error) {
	// Every answer that frees a slot wakes a pass, and answers come in batches, so without this
	// many passes of a full drainer would read the in-flight counts only to find no room. A
	// raised cap still starts claims: while jobs are held the upkeep re-reads the config and
	// wakes a pass when it changed.
	if n := cl.unanswered() - int64(outs.size()); n > 0 && n >= int64(cl.config.get().GlobalInFlight) {
		return nil, false, nil
	}
	// The caps the last claim saw are good enough to choose candidates (the claim re-reads them
	// under the lock); the in-flight counts are read fresh, since completions elsewhere (other
	// drainers, asynchronous executors) free capacity this process did not see.
	poked := cl.poked.Swap(false)
	if cl.probe {
		out, handled, err := cl.probeAndClaim(ctx, now, poked)
		if err != nil || handled {
			return out, false, err
		}
	}
	cfg := cl.config.get()
	state := cl.reuse(now, cfg, outs, poked)
	if state == nil {
		us, page, err := cl.passState(ctx, cfg)
		if err != nil {
			return nil, false, err
		}
		state = &passRead{us: us, page: page, read: now, ordering: cfg.Ordering, perPage: cl.tenantsPerPage(cfg)}
	}
	us, page := state.us, state.page
	cl.sawQueued = len(page.tenants) > 0
	if outs != nil {
		for _, r := range outs.reqs {
			us.Add(cfg, r.c.row.Unit(), -1) // out of flight once the claim commits their outcomes
		}
	}
	cl.firstPageFull = page.full && cfg.Ordering != config.RoundRobin // round_robin reads by name, not by head
	cands, more, unread, err := cl.candidates(ctx, now, cfg, us, page)
	if err != nil || len(cands) == 0 {
		return nil, false, err
	}
	cl.timeUsed = nil
	if cfg.Ordering == config.FairTime {
		tenants := make([]string, 0, len(cands))
		for t := range cands {
			tenants = append(tenants, t)
		}
		if cl.timeUsed, err = store.TimeUsed(ctx, cl.cfg.DB, tenants); err != nil {
			return nil, false, err
		}
		for t, s := range page.running {
			cl.timeUsed[t] += s // charged at their outcomes; counted meanwhile
		}
	}
	return cl.claimCandidates(ctx, now, cands, more, unread, outs, state)
}

// claimCandidates runs the claim transaction over cands, with the outcomes of outs written beside
// it (see RunOnce), and reports the jobs it claimed and whether the next pass should follow at
// once. more and unread are candidates' answers: per tenant, whether it may have more jobs than
// read, and whether tenants were left unread. state is what the pass chose by; a claim that got
// every job it chose from a page that held every tenant with work leaves it, with its own counts,
// to the next pass (reuse).
//
// The outcomes go in a transaction of their own, on a second connection (outcomesBeside), so that
// the server writes them and the claim at once: one round trip locks their jobs while the claim's
// first takes the claim lock and counts what is in flight; what the outcomes free is taken out of
// that count; their write and COMMIT then run beside the claim's UPDATE, and the claim commits only
// once they have. Their jobs are locked from before the count to their COMMIT, so nothing else can
// move them: a job that was in flight for the count is out of flight before the claim's COMMIT
// makes its jobs visible, and the caps hold at every commit. If the outcomes fail, the claim rolls
// back.
func (cl *claimer) claimCandidates(ctx context.Context, now time.Time, cands map[string][]candidate, more map[string]bool, unread bool,
	outs *outcomeBatch, state *passRead) ([]claimed, bool, error) {
	tx, err := store.BeginConnTx(ctx, cl.cfg.TxDB)
	if err != nil {
		return nil, false, fmt.Errorf("begin claim: %w", err)
	}
	defer tx.Close()
	var beside *outcomesBeside
	if outs != nil {
		beside = cl.lockOutcomes(ctx, outs)
		defer beside.close()
	}
	l, err := store.LockClaims(ctx, tx, false)
	var locked []store.Row
	if beside != nil {
		var lerr error
		locked, lerr = beside.locked()
		err = errors.Join(err, lerr)
	}
	if err != nil {
		return nil, false, err
	}
	cfg, us := l.Config, l.Usage
	cl.config.set(cfg)
	var items []store.Finishing
	if outs != nil {
		if items = cl.writer.settle(now, outs.reqs, locked); len(items) == 0 {
			outs.answer(nil, false)
		}
		for _, it := range items {
			us.Add(cfg, it.Row.Unit(), -1)
		}
	}
	var written func() error
	if len(items) > 0 {
		requeues := store.Requeues(items) // before the write, which cleans the items' errors
		beside.write(ctx, cl.writer, now, items)
		written = beside.wait
		if requeues {
			// A requeue locks its tenant's row, which the claim may hold while it waits for the
			// outcomes' COMMIT: they are written first, on their own, and the pass that follows at
			// once claims what they freed.
			err = written()
			outs.answer(err, err == nil)
			return nil, err == nil, err
		}
	}
	chosen, full := cl.choose(cfg, cands, more, &us)
	if len(chosen) == 0 {
		if written != nil {
			// Nothing fits even in what they free: no pass need follow for it.
			err = written()
			outs.answer(err, err == nil)
		}
		return nil, false, err
	}
	out, err := cl.claimAndCommit(ctx, tx, now, cfg, chosen, written)
	if written != nil {
		werr := written()
		outs.answer(werr, werr == nil && err == nil)
	}
	if err != nil {
		cl.headCache.reset() // the claimed jobs may be queued again
		// A COMMIT whose answer was lost: claimAndCommit handed back what it took. Nothing is sent.
		return nil, false, err
	}
	got := make(map[int64]bool, len(out))
	for _, c := range out {
		got[c.row.ID] = true
	}
	cl.headCache.claimed(chosen, got)
	if len(out) == 0 || cl.handBackIfStopping(ctx, now, out) {
		return nil, false, nil
	}
	if len(out) == len(chosen) && !state.page.full {
		state.us = us
		cl.nextRead = state
	}
	// Probing for a lone job is worth its round trip only when this pass left nothing behind
	// (candidates already turned it off if a tenant waits at a cap).
	if full || len(out) < len(chosen) || !drained(cands, more) {
		cl.probe = false
	}
	cl.holdDispatched(ctx, now, out)
	// Tenants left unread with slots still free: the next pass goes on at once. Only after a
	// pass that claimed something, so tenants whose work is all gated never spin the loop.
	return out, full || (unread && us.Total < cfg.GlobalInFlight), nil
}

// choose takes candidates from cands in cfg's ordering while the caps allow, up to ClaimBatch:
// each is decided by cfg.Check against us (what is in flight, as read under the claim lock) plus
// the jobs chosen before it; choose adds each job it takes to us. Within a tenant the first candidate that
// fits goes: a job whose lane is full, or a non-interactive one when only the interactive
// reserve is left, is passed over and the tenant's later jobs may go (SPEC §5a); a tenant none
// of whose candidates fits (its tier full, say) is left for this pass. It returns the jobs
// chosen and whether the pass stopped with capacity possibly left (full). cands loses the jobs
// chosen, but for a tenant's last read head taken when it has more (the pass ends there).
func (ch *chooser) choose(cfg config.Config, cands map[string][]candidate, more map[string]bool, us *config.Usage) ([]candidate, bool) {
	var chosen []candidate
	full := false
	var skip map[string]bool // made at the first tenant skipped: most passes skip none
	next := ch.picker(cfg, cands, us.Tenant)
	for us.Total < cfg.GlobalInFlight {
		if len(chosen) >= ch.claimBatch {
			full = true
			break
		}
		t := next.next(skip)
		if t == "" {
			break
		}
		i := fits(cfg, *us, cands[t])
		if i < 0 {
			if skip == nil {
				skip = map[string]bool{}
			}
			skip[t] = true
			continue
		}
		c := cands[t][i]
		chosen = append(chosen, c)
		us.Add(cfg, c.unit, 1)
		if i == len(cands[t])-1 && more[t] {
			// The tenant's last read head: it may have more that should go before other
			// tenants' jobs, so after this one the pass ends and the next reads again.
			full = true
			break
		}
		if i == 0 {
			cands[t] = cands[t][1:] // the usual case: the head went, nothing to copy
		} else {
			// A job passed over stays; a fresh slice keeps the backing array others read intact.
			cands[t] = append(cands[t][:i:i], cands[t][i+1:]...)
		}
	}
	return chosen, full
}

// fits returns the index of the first of cs that cfg's caps admit with us in flight, or -1.
func fits(cfg config.Config, us config.Usage, cs []candidate) int {
	for i, c := range cs {
		if cfg.Check(us, c.unit).OK {
			return i
		}
	}
	return -1
}

// drained reports whether a pass took every candidate it read and no tenant may have more.
func drained(cands map[string][]candidate, more map[string]bool) bool {
	for t, cs := range cands {
		if len(cs) > 0 || more[t] {
			return false
		}
	}
	return true
}

// holdDispatched records jobs this drainer committed as dispatched: it holds them (renews their
// leases) until their outcomes are recorded, and logs and counts their dispatch.
func (cl *claimer) holdDispatched(ctx context.Context, now time.Time, out []claimed) {
	cl.leases.hold(out)
	for _, c := range out {
		cl.store.LogTransition(ctx, store.Row{Job: job.Job{ID: c.row.ID, Tenant: c.row.Tenant, Status: job.Queued, QueuedAt: c.row.QueuedAt}},
			job.Dispatched, c.row.Version, now, "")
		cl.store.Metrics.Dispatched(c.row.QueuedAt, *c.row.DispatchedAt)
	}
}
