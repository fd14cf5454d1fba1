package drainer

import (
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/store"
)

// chooser is the claim's choice apart from its reads and writes: given the candidates a pass
// read and what is in flight, which jobs it claims (choose, over picker and pick). It holds the
// state the choice carries from pass to pass.
type chooser struct {
	claimBatch int    // the most jobs one pass claims (Config.ClaimBatch)
	rrLast     string // round_robin: the tenant served last
	// timeUsed is the executor time used of the tenants of this pass's candidates, read before
	// the pass chooses under fair_time (store.TimeUsed), with the time their jobs in flight have
	// run so far; nil otherwise.
	timeUsed map[string]float64
	// The picker of the choose in progress and its heap, kept to reuse their memory.
	picks picker
	heap  tenantHeap
}

// Chooser is the claim's choice for a caller that keeps the queue itself: `sluice simulate`
// replays arrivals through it on a virtual clock, so that what it predicts is chosen by the code
// that chooses in production, step for step. Not safe for concurrent use.
type Chooser struct {
	ch    chooser
	cands map[string][]candidate // reused by every Choose
	flat  []candidate            // their backing array, reused
	out   []store.Head           // Choose's answer, reused
}

// NewChooser returns a Chooser that takes at most claimBatch jobs a pass, as a drainer
// configured with that ClaimBatch does (≤ 0: the default, 64).
func NewChooser(claimBatch int) *Chooser {
	if claimBatch <= 0 {
		claimBatch = 64
	}
	return &Chooser{ch: chooser{claimBatch: claimBatch}}
}

// SetTimeUsed gives the executor time used per tenant (seconds, decayed as store.TimeUsed
// decays it) that fair_time orders by in the next passes.
func (c *Chooser) SetTimeUsed(used map[string]float64) { c.ch.timeUsed = used }

// Choose is one pass's choice: heads holds, per tenant, its first queued jobs in its queue's
// order (store.Head.Before: interactive first, then priority, then age), as store.ReadHeads
// returns them for a drainer's pass, more whether a tenant
// has queued jobs beyond them, and us what is in flight. It returns the jobs claimed, in the order
// chosen (valid until the next Choose), having added them to us, and whether the pass stopped
// with capacity possibly left (as a drainer's pass does, after which the next one reads again).
// heads is left as it was.
func (c *Chooser) Choose(cfg config.Config, heads map[string][]store.Head, more map[string]bool, us *config.Usage) ([]store.Head, bool) {
	if c.cands == nil {
		c.cands = map[string][]candidate{}
	}
	clear(c.cands)
	c.flat = c.flat[:0]
	for t, hs := range heads {
		from := len(c.flat)
		for _, h := range hs {
			c.flat = append(c.flat, candidateOf(h))
		}
		c.cands[t] = c.flat[from:len(c.flat):len(c.flat)]
	}
	chosen, full := c.ch.choose(cfg, c.cands, more, us)
	c.out = c.out[:0]
	for _, ch := range chosen {
		c.out = append(c.out, store.Head{ID: ch.id, Tenant: ch.tenant, QueuedAt: ch.queuedAt, Lanes: ch.unit.Lanes, Interactive: ch.unit.Interactive})
	}
	return c.out, full
}
