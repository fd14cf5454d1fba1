package gate

import (
	"context"
	"sort"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/store"
)

// read begins the transaction, locks the items' tenants and reads the state the decisions need
// (readParams), in one round trip (store.AdmissionTx.ReadAdmission).
func (a *Admitter) read(ctx context.Context, tx txConn, items []*item, cfg config.Config, shared bool, started time.Time) (*state, error) {
	p := a.readParams(items, cfg, shared, started)
	got, err := tx.ReadAdmission(ctx, p)
	if err != nil {
		return nil, err
	}
	if p.GlobalCountUpTo > 0 {
		a.depth.counted(started, got.GlobalDepth)
	}
	st := newState()
	st.now, st.globalDepth, st.noHeadAfterNow = got.Now, got.GlobalDepth, got.NoHeadAfterNow
	st.tenantDepth, st.tenantInteractive, st.tenantInFlight, st.usage = got.TenantDepth, got.TenantInteractive, got.TenantInFlight, got.Usage
	for _, r := range got.Keyed {
		st.keyed[keyOf(r.Tenant, *r.IdempotencyKey)] = &r
	}
	for _, r := range got.Redriven {
		st.redriven[*r.RetryOf] = &r
	}
	// The queued jobs the items' replace keys name, locked now that their tenants are (see
	// store.LockReplaceable); a replay does not replace, but its key is looked up all the same.
	var keys []store.TenantKey
	for _, it := range items {
		if it.req.ReplaceKey != nil {
			keys = append(keys, store.TenantKey{Tenant: it.req.Tenant, Key: *it.req.ReplaceKey})
		}
	}
	if len(keys) > 0 {
		old, err := store.LockReplaceable(ctx, tx.DB(), keys)
		if err != nil {
			return nil, err
		}
		for _, r := range old {
			st.replaceable[keyOf(r.Tenant, *r.ReplaceKey)] = replaceable{row: &r}
		}
	}
	return st, nil
}

// readParams is what read asks for: the items' tenants, locked without waiting for a combiner
// group (shared: see errGroupLocked), the global depth counted or estimated, what is in flight
// (for queue=false and every admission's capacity headers, unless the rollout mode is off), and
// the idempotency keys and redrives of the items. started dates a global depth count (see
// depthEstimate).
func (a *Admitter) readParams(items []*item, cfg config.Config, shared bool, started time.Time) store.AdmissionRead {
	seen := map[string]bool{}
	p := store.AdmissionRead{NoWait: shared}
	for _, it := range items {
		if !seen[it.req.Tenant] {
			seen[it.req.Tenant] = true
			p.Tenants = append(p.Tenants, it.req.Tenant)
		}
	}
	sort.Strings(p.Tenants)
	// The global depth is counted exactly near the cap and for queue=false (whose Retry-After
	// depends on it, as on the global in-flight count); far below the cap a recent count plus
	// this process's admissions since stands in for it, because counting up to 2,000 index
	// entries is most of an admission's cost (see depthEstimate).
	immediate := false
	for _, it := range items {
		immediate = immediate || (it.req.Queue != nil && !*it.req.Queue)
	}
	est, fresh := a.depth.estimate(started, a.cfg.GlobalDepthRefresh)
	if immediate || !fresh || est+len(items)+depthMargin(cfg.GlobalQueueDepth) >= cfg.GlobalQueueDepth {
		p.GlobalCountUpTo = int64(cfg.GlobalQueueDepth + 1)
	} else {
		p.GlobalEstimate = int64(est)
	}
	p.CountInFlight, p.Config = cfg.AdmissionMode != config.ModeOff, cfg
	p.CountInteractive = immediate
	for _, it := range items {
		if it.req.IdempotencyKey != nil {
			p.IdempotencyKeys = append(p.IdempotencyKeys, *it.req.IdempotencyKey)
		}
		if it.retryOf != nil {
			p.Redrives = append(p.Redrives, *it.retryOf)
		}
	}
	return p
}
