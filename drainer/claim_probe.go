package drainer

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/store"
)

// The lone-job probe (probeAndClaim) is the pickup path of an idle queue. A pass normally reads the
// in-flight counts, the tenants with queued work and their heads before its transaction. When the
// previous pass left the queue empty, a job that arrives is most likely the only one queued, and
// then every ordering (fair, fifo, round_robin) picks it whatever the other tenants hold in flight;
// the caps are the only question. So such a pass first reads at most two queued jobs: none means
// there is nothing to do, one eligible job without a rate key is claimed at once under the claim
// lock (the caps read in that transaction, as always), and anything else falls through to the
// normal pass. The read is as early as the normal pass's candidate read, and the claim is fenced
// the same way, so it decides nothing the normal pass would not. After a Poke the read goes in the
// claim transaction's first round trip, with the lock and the counts: two round trips from the poke
// to the dispatch instead of three.

// probedJob is a queued job as the lone-job probe read it (store.ProbeQueue): a candidate, with
// its not-before.
type probedJob struct {
	candidate
	notBefore sql.NullTime
}

// probedJobs are the jobs of a lone-job probe (store.ProbeQueue).
func probedJobs(qs []store.QueuedJob) []probedJob {
	var out []probedJob
	for _, q := range qs {
		out = append(out, probedJob{candidate: candidateOf(q.Head), notBefore: q.NotBefore})
	}
	return out
}

// probeAndClaim reads at most two queued jobs (the lone-job probe) and claims the queue's only
// job if it may start now. handled is false when the normal pass must decide (more than one job
// queued, a deferred job, a rate key to check against the gates, the job taken meanwhile). poked
// says a job was announced (Poke): one is most likely queued, so the probe goes in the claim
// transaction's first round trip, under the claim lock, instead of a round trip of its own
// before it; without a poke (the poll of an idle queue) the probe alone, outside any
// transaction, is the cheaper guess.
func (cl *claimer) probeAndClaim(ctx context.Context, now time.Time, poked bool) (out []claimed, handled bool, err error) {
	// The transaction begins at its first Query, so a probe on its connection before that runs
	// outside any transaction.
	tx, err := store.BeginConnTx(ctx, cl.cfg.TxDB)
	if err != nil {
		return nil, false, fmt.Errorf("begin claim: %w", err)
	}
	defer tx.Close()
	var found []probedJob
	var cfg config.Config
	var us config.Usage
	if poked {
		if cfg, us, found, err = lockCountAndProbe(ctx, tx, true); err != nil {
			return nil, false, err
		}
		cl.config.set(cfg)
	} else {
		probed, err := store.ProbeQueue(ctx, tx.Conn())
		if err != nil {
			return nil, false, err
		}
		found = probedJobs(probed)
	}
	cl.sawQueued = len(found) > 0
	switch {
	case len(found) == 0:
		return nil, true, nil
	case len(found) > 1:
		cl.probe = false
		return nil, false, nil
	}
	j := found[0]
	if (j.notBefore.Valid && j.notBefore.Time.After(now)) || (j.rateKey.Valid && cl.cfg.RateGates != nil) {
		return nil, false, nil
	}
	if !poked {
		// Two round trips more: one begins the transaction, takes the claim lock and counts; the
		// other claims and commits (store.ConnTx).
		if cfg, us, err = lockAndCount(ctx, tx); err != nil {
			return nil, false, err
		}
		cl.config.set(cfg)
	}
	if !cfg.Check(us, j.unit).OK {
		// A cap, a full lane or the reserve: no ordering could start anything now.
		return nil, true, nil
	}
	// If the commit's answer is lost, claimAndCommit hands the job back if the claim took it.
	if out, err = cl.claimAndCommit(ctx, tx, now, cfg, []candidate{j.candidate}, nil); err != nil || len(out) == 0 {
		return nil, false, err // none: taken or canceled meanwhile, let the normal pass look
	}
	if cl.handBackIfStopping(ctx, now, out) {
		return nil, true, nil
	}
	cl.rrLast = j.tenant
	cl.holdDispatched(ctx, now, out)
	return out, true, nil
}
