package drainer

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// claim picks and claims jobs in one transaction, and commits them as dispatched (claim and
// dispatch are one transaction, so "claimed" is never visible and a job still claimed was never
// sent).
//
// Locking: the transaction runs at READ COMMITTED and first locks the single claim_lock row
// FOR UPDATE, so claims from every drainer are serialised. Inside, each statement reads the
// latest committed data: the caps (the newest runtime config row, read in the same statement as
// the lock) and the in-flight counts, which no concurrent claim can raise while the lock is held
// (completions can only lower them). The chosen jobs are moved by one UPDATE fenced on each id,
// version and the queued state, so a job canceled or taken since the candidate read is skipped.
// Hence no claim ever puts more jobs in flight than the caps as read in its own transaction.
// Candidate reads and the gate lookup happen before the transaction, so it never waits on
// memcached or scans a backlog, and the lock is held for four short statements.
func (d *Drainer) claim(ctx context.Context, now time.Time) ([]claimed, bool, error) {
	// Every answer that frees a slot wakes a pass, and answers come in batches, so without this
	// about every other pass of a full drainer would read the in-flight counts only to find no
	// room (half the passes of BenchmarkDrainThroughput did). A raised cap still starts claims:
	// while jobs are held the upkeep re-reads the config and wakes a pass when it changed.
	if n := d.unanswered.Load(); n > 0 && n >= int64(d.lastConfig().GlobalInFlight) {
		return nil, false, nil
	}
	// The caps the last claim saw are good enough to choose candidates (the claim re-reads them
	// under the lock); the in-flight counts are read fresh, since completions elsewhere (other
	// drainers, asynchronous executors) free capacity this process did not see.
	poked := d.poked.Swap(false)
	if d.probing() {
		out, handled, err := d.claimLone(ctx, now, poked)
		if err != nil || handled {
			return out, false, err
		}
	}
	cfg := d.lastConfig()
	inFlight, total, page, err := d.passState(ctx, cfg)
	if err != nil {
		return nil, false, err
	}
	cands, more, unread, err := d.candidates(ctx, now, cfg, inFlight, total, page)
	if err != nil || len(cands) == 0 {
		return nil, false, err
	}

	// Three round trips: one begins the transaction, takes the claim lock (reading the config)
	// and counts in flight; one claims and commits (store.ConnTx); one reads the payloads.
	tx, err := store.BeginConnTx(ctx, d.cfg.DB)
	if err != nil {
		return nil, false, fmt.Errorf("begin claim: %w", err)
	}
	defer tx.Close()
	if cfg, inFlight, total, err = lockAndCount(ctx, tx); err != nil {
		return nil, false, err
	}
	d.remember(cfg)
	var chosen []candidate
	full := false
	for total < cfg.GlobalInFlight {
		if len(chosen) >= d.cfg.ClaimBatch {
			full = true
			break
		}
		t := d.pick(cfg, cands, inFlight)
		if t == "" {
			break
		}
		if len(cands[t]) == 1 && more[t] {
			// The tenant's last read head: it may have more that should go before other
			// tenants' jobs, so after this one the pass ends and the next reads again.
			full = true
			chosen = append(chosen, cands[t][0])
			break
		}
		chosen = append(chosen, cands[t][0])
		cands[t] = cands[t][1:]
		inFlight[t]++
		total++
	}
	if len(chosen) == 0 {
		return nil, false, nil
	}
	out, err := d.claimAndCommit(ctx, tx, now, cfg, chosen)
	if err != nil {
		d.headCache.reset() // the claimed jobs may be queued again
		// If the COMMIT's outcome is unknown the jobs may be dispatched under our id without
		// being sent: their leases expire and recovery requeues them. Nothing is sent here.
		return nil, false, err
	}
	got := make(map[int64]bool, len(out))
	for _, c := range out {
		got[c.row.ID] = true
	}
	d.headCache.claimed(chosen, got)
	if len(out) == 0 || d.handBackIfStopping(ctx, now, out) {
		return nil, false, nil
	}
	if err := d.loadPayloads(ctx, out); err != nil {
		// Committed but unreadable: nothing was sent, so hand the jobs back at once rather than
		// leave them to lease recovery, which (with unconfirmed starts) would call them lost.
		d.releaseUnsent(ctx, now, out, "the claimed job could not be read back; it was never sent")
		return nil, false, err
	}
	// Probing for a lone job is worth its round trip only when this pass left nothing behind
	// (candidates already turned it off if a tenant waits at a cap).
	if full || len(out) < len(chosen) || !drained(cands, more) {
		d.setProbe(false)
	}
	d.own(ctx, now, out)
	// Tenants left unread with slots still free: the next pass goes on at once. Only after a
	// pass that claimed something, so tenants whose work is all gated never spin the loop.
	return out, full || (unread && total < cfg.GlobalInFlight), nil
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

// own records jobs this drainer committed as dispatched: it holds them (renews their leases)
// until their outcomes are recorded.
func (d *Drainer) own(ctx context.Context, now time.Time, out []claimed) {
	d.mu.Lock()
	for _, c := range out {
		d.held[c.row.ID] = c.row.Version
	}
	d.mu.Unlock()
	for _, c := range out {
		d.store.LogTransition(ctx, store.Row{Job: job.Job{ID: c.row.ID, Tenant: c.row.Tenant, Status: job.Queued, QueuedAt: c.row.QueuedAt}},
			job.Dispatched, c.row.Version, now, "")
		d.store.Metrics.Dispatched(c.row.QueuedAt, *c.row.DispatchedAt)
	}
}
