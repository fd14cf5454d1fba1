package gate

import (
	"context"

	"github.com/sluicehq/sluice/gate/store"
)

// insert writes, in one round trip, the rows of the items to insert (queued and rejected) and
// the enqueue pokes of the queued ones (store.AdmissionTx.InsertJobs). With commit, it commits
// in the same round trip (see commitWithInsert).
//
// A request's jobs share pokes when perTenant is set (a batch): one poke per tenant, on its last
// queued job. A poke only says "look at this tenant's queue now" (SPEC §2, §7), and the drainer
// coalesces the pokes of one tenant into one pass anyway, so a thousand pokes for one batch
// would be a thousand outbox rows and publishes that wake nothing more. A combiner group is
// several requests: each of its admissions keeps its own poke.
func (a *Admitter) insert(ctx context.Context, tx txConn, items []*item, st *state, perTenant, commit bool) error {
	p, ins := a.newJobs(items, st, perTenant)
	if len(ins) == 0 {
		if commit {
			return tx.Commit()
		}
		return nil
	}
	got, err := tx.InsertJobs(ctx, p, commit)
	if err != nil {
		return err
	}
	for i, it := range ins {
		it.id, it.outboxID = got.IDs[i], got.PokeIDs[i]
	}
	return nil
}

// newJobs returns the rows of the items to insert, and those items in the same order.
func (a *Admitter) newJobs(items []*item, st *state, perTenant bool) (store.NewJobs, []*item) {
	var ins []*item
	lastOf := map[string]int{} // tenant → index in ins of its last queued job, when perTenant
	for _, it := range items {
		if it.insert {
			if perTenant && it.scope == "" {
				lastOf[it.req.Tenant] = len(ins)
			}
			ins = append(ins, it)
		}
	}
	p := store.NewJobs{Now: st.now, NoHeadAfterNow: st.noHeadAfterNow, Prefix: a.cfg.Prefix, Jobs: make([]store.NewJob, len(ins))}
	for i, it := range ins {
		j := store.NewJob{Tenant: it.req.Tenant, RateKeySHA256: it.hash, Caller: it.caller, RetryOf: it.retryOf,
			Lanes: it.req.Lanes, Interactive: it.req.interactive(),
			Payload: []byte(it.req.Payload), IdempotencyKey: it.req.IdempotencyKey, RequestSHA256: it.fp,
			Poke: it.scope == "" && (!perTenant || lastOf[it.req.Tenant] == i), Due: it.req.due(st.now), StartBy: it.req.startBy(),
			ReplaceKey: it.req.ReplaceKey, Priority: it.req.Priority}
		if it.scope != "" {
			j.Rejected = "queue full (" + it.scope + " depth cap)"
		}
		p.Jobs[i] = j
	}
	if !a.cfg.AuditOff {
		p.Audit = auditEvents(ins)
	}
	return p, ins
}
