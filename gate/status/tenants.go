package status

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/sluicehq/sluice/gate/store"
)

// Tenant orders of ReadTenants (GET /v1/tenants?order=).
const (
	// ByName lists tenants by name, ascending (bytewise). The default.
	ByName = "name"
	// ByDepth lists tenants deepest first, ties by name.
	ByDepth = "depth"
)

// TenantKey is a tenant's place in a listing: the key a page continues after. Depth is used
// only by ByDepth.
type TenantKey struct {
	Depth  int64
	Tenant string
}

// TenantsQuery asks for one page of tenants with work.
type TenantsQuery struct {
	// Order is ByName or ByDepth. Empty: ByName.
	Order string
	// After, if set, is the key of the last tenant of the previous page: the page starts after
	// it, so rows that change meanwhile never shift a page by an offset.
	After *TenantKey
	// Limit is the page size, 1 or more. Required.
	Limit int
	// Tenant, if set, asks for that one tenant's row, with or without queued work (a page of
	// none if it has never had a job); Order and After are then ignored.
	Tenant string
}

// TenantRow is one tenant of a listing (SPEC §6 GET /v1/tenants).
type TenantRow struct {
	Tenant           string  `json:"tenant"`
	Depth            int     `json:"depth"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	InFlight         int     `json:"in_flight"`
	Cap              int     `json:"cap"`
	// Slots are the tenant's live slots that count (SPEC §5a; not those granted past a limit).
	Slots int `json:"slots"`
	// Tier is the tenant's tier (runtime config tenant_tiers; config.DefaultTier if not named).
	Tier string `json:"tier"`
	// Weight is the tenant's weight under fair ordering (tenant_weights, tier_weights; 1).
	Weight float64 `json:"weight"`
	// GatedKeys are the gated rate keys (SHA-256 hex, sorted) among the tenant's first
	// HeadsPerTenant queued jobs: the gates holding its queue back now. Empty without a gate
	// store.
	GatedKeys []string `json:"gated_keys"`
}

// TenantPage is one page of tenants; Next is nil on the last page.
type TenantPage struct {
	Tenants []TenantRow
	Next    *TenantKey
	// Lanes are the configured lanes with their limits and in flight, as in Status.
	Lanes map[string]LaneUse
}

// ErrOrder is returned by ReadTenants for an order other than ByName and ByDepth.
var ErrOrder = errors.New("status: unknown tenant order")

// ReadTenants returns one page of the tenants with queued work, in q.Order. It reads at most
// q.Limit+1 rows of the tenants table from an index (work_tenant for ByName, depth for ByDepth)
// plus the in-flight counts (bounded by the global cap), whatever the number of tenants. Safe
// for concurrent use.
func (r *Reader) ReadTenants(ctx context.Context, q TenantsQuery) (TenantPage, error) {
	var page TenantPage
	if q.Limit < 1 {
		return page, fmt.Errorf("status: tenants: limit %d, want 1 or more", q.Limit)
	}
	now, err := r.cfg.Clock.Now(ctx)
	if err != nil {
		return page, err
	}
	var st Status
	lc, err := r.config(ctx, &st)
	if err != nil {
		return page, err
	}
	var rows []Tenant
	switch {
	case q.Tenant != "":
		rows, err = r.tenantRows(ctx, now, lc, store.TenantQueuesParams{By: store.One, After: q.Tenant, Limit: 1})
	case q.Order == ByName || q.Order == "":
		after := ""
		if q.After != nil {
			after = q.After.Tenant
		}
		// work_tenant is the name while the tenant has queued work, else NULL: the range skips
		// idle tenants without reading them.
		rows, err = r.tenantRows(ctx, now, lc, store.TenantQueuesParams{By: store.ByName, After: after, Limit: q.Limit + 1})
	case q.Order == ByDepth:
		rows, err = r.deepest(ctx, now, lc, q.After, q.Limit+1)
	default:
		return page, fmt.Errorf("%w: %q", ErrOrder, q.Order)
	}
	if err != nil {
		return page, err
	}
	if len(rows) > q.Limit {
		rows = rows[:q.Limit]
		last := rows[len(rows)-1]
		page.Next = &TenantKey{Depth: int64(last.Depth), Tenant: last.Tenant}
	}
	// One read of the jobs in flight gives each tenant's and each lane's.
	jobs, err := store.ReadInFlightUsage(ctx, r.cfg.DB, lc)
	if err != nil {
		return page, fmt.Errorf("status: %w", err)
	}
	busy := jobs.Tenant
	live, slots, err := r.slots(ctx, lc)
	if err != nil {
		return page, err
	}
	if page.Lanes, err = r.lanes(ctx, lc, &jobs, live.ByLane); err != nil {
		return page, err
	}
	gated, err := r.headGates(ctx, now, rows)
	if err != nil {
		return page, err
	}
	page.Tenants = make([]TenantRow, 0, len(rows))
	for _, t := range rows {
		keys := gated[t.Tenant]
		if keys == nil {
			keys = []string{}
		}
		page.Tenants = append(page.Tenants, TenantRow{Tenant: t.Tenant, Depth: t.Depth,
			OldestAgeSeconds: t.OldestAgeSeconds, InFlight: busy[t.Tenant], Cap: t.Cap, Tier: t.Tier, Weight: t.Weight,
			Slots: slots[t.Tenant], GatedKeys: keys})
	}
	return page, nil
}

// headGates returns, per tenant of rows with queued work, the gated rate keys among its first
// HeadsPerTenant queued jobs, sorted. It reads those heads as eligible does (store.HeadsRead),
// MaxTenants tenants a statement, so a page costs its size in index rows
// whatever the number of tenants or the depth of their queues, then asks the gate store once
// about the keys it found (failing open: a key it cannot read is not gated).
func (r *Reader) headGates(ctx context.Context, now time.Time, rows []Tenant) (map[string][]string, error) {
	if r.cfg.RateGates == nil {
		return nil, nil
	}
	var names []string
	for _, t := range rows {
		if t.Depth > 0 {
			names = append(names, t.Tenant)
		}
	}
	keysOf := map[string]map[string]bool{}
	var keys []string
	seen := map[string]bool{}
	for len(names) > 0 {
		chunk := names[:min(len(names), r.cfg.MaxTenants)]
		names = names[len(chunk):]
		heads, err := r.heads.Read(ctx, r.cfg.DB, chunk, r.cfg.HeadsPerTenant)
		if err != nil {
			return nil, fmt.Errorf("status: tenants' queue heads: %w", err)
		}
		for _, h := range heads {
			if h.RateKeySHA256 == nil {
				continue
			}
			key := *h.RateKeySHA256
			if keysOf[h.Tenant] == nil {
				keysOf[h.Tenant] = map[string]bool{}
			}
			keysOf[h.Tenant][key] = true
			if !seen[key] {
				seen[key] = true
				keys = append(keys, key)
			}
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	nb, _ := r.cfg.RateGates.NotBefore(ctx, keys) // fails open, like the drainer
	out := map[string][]string{}
	for t, ks := range keysOf {
		for k := range ks {
			if at, ok := nb[k]; ok && at.After(now) {
				out[t] = append(out[t], k)
			}
		}
		sort.Strings(out[t])
	}
	return out, nil
}
