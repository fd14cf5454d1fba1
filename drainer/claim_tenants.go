package drainer

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/store"
)

// tenantPage is what one read of the tenants index gave a pass: the next tenants with queued
// work in the pass's ordering, whether the read was full (more tenants with work may follow), and
// where the next read starts.
type tenantPage struct {
	tenants []string
	full    bool
	after   tenantKey
	// interactive are the tenants read that have interactive queued jobs (they go first), and
	// prioritized those with jobs of another priority than the default.
	interactive, prioritized map[string]bool
	// only are the tenants read whose one queued job the read gave (store.TenantHead.Only).
	only map[string]*store.QueuedJob
	// running is how long each tenant's jobs in flight have run, under fair_time, as the pass's
	// first read found them (store.TenantPage.Running).
	running map[string]float64
}

// tenantKey is a position in the tenants index of an ordering: (head_at, head_id) for fair and
// fifo, the name for round_robin. wrapped marks a round_robin read that went past the last name
// and started again at the first.
type tenantKey struct {
	headAt  time.Time
	headID  int64
	name    string
	wrapped bool
}

// maxTenantPages bounds the tenant reads of one pass. A pass reads further pages only while the
// tenants it read give fewer eligible jobs than it has free slots (their heads gated, not before
// a 503's retry, or their tenants at a cap), so tenants stuck behind gates cost at most this many
// reads a pass. A pass that ran out of pages so leaves its position (claimer.resume), and the
// next one goes on from there after its first page, until a pass reads to the last tenant.
const maxTenantPages = 4

// tenantsPerPage is how many tenants with work a page holds: the jobs a pass may claim, plus
// gateSlack so a few gated or capped tenants do not force a second read.
func (cl *claimer) tenantsPerPage(cfg config.Config) int {
	return max(min(cfg.GlobalInFlight, cl.cfg.ClaimBatch), 1) + gateSlack
}

// passState reads, in one round trip, what is in flight and the first page of tenants with
// queued work in cfg's ordering (store.ReadTenantPage). Neither grows with the number of tenants
// that have work or ever had it, nor with any tenant's backlog.
func (cl *claimer) passState(ctx context.Context, cfg config.Config) (us config.Usage, page tenantPage, err error) {
	p := cl.tenantsParams(cfg, tenantKey{}, true)
	p.WithInFlight, p.Config = true, cfg
	read, err := store.ReadTenantPage(ctx, cl.cfg.DB, p)
	if err != nil {
		return us, page, err
	}
	page = cl.pageOf(cfg, tenantKey{}, read.Tenants)
	page.running = read.Running
	return read.Usage, page, nil
}

// nextTenants reads the page of tenants with work that follows prev.
func (cl *claimer) nextTenants(ctx context.Context, cfg config.Config, prev tenantPage) (tenantPage, error) {
	read, err := store.ReadTenantPage(ctx, cl.cfg.DB, cl.tenantsParams(cfg, prev.after, false))
	if err != nil {
		return tenantPage{}, err
	}
	return cl.pageOf(cfg, prev.after, read.Tenants), nil
}

// tenantsParams ask for the page of tenants with work due by now after from (from the start
// when first), in cfg's ordering: fair and fifo walk the head index (every tenant's oldest
// queued job, oldest first); round_robin walks the names from the tenant served last to the end,
// then from the first name up to it.
func (cl *claimer) tenantsParams(cfg config.Config, from tenantKey, first bool) store.TenantPageParams {
	n := cl.tenantsPerPage(cfg)
	if cfg.Ordering == config.RoundRobin {
		if first {
			from.name = cl.rrLast
		}
		return store.TenantPageParams{ByName: true, After: from.name, Wrapped: from.wrapped, UpTo: cl.rrLast, Limit: n, DueOnly: true}
	}
	return store.TenantPageParams{FromStart: first, HeadAt: from.headAt, HeadID: from.headID, Limit: n, DueOnly: true}
}

// pageOf turns the rows of a tenants page read from from into a page.
func (cl *claimer) pageOf(cfg config.Config, from tenantKey, rows []store.TenantHead) tenantPage {
	p := tenantPage{full: len(rows) >= cl.tenantsPerPage(cfg), after: from, interactive: map[string]bool{}, prioritized: map[string]bool{}, only: map[string]*store.QueuedJob{}}
	for _, r := range rows {
		p.tenants = append(p.tenants, r.Tenant)
		if r.Interactive {
			p.interactive[r.Tenant] = true
		}
		if r.Prioritized {
			p.prioritized[r.Tenant] = true
			cl.sawPrioritized = true
		}
		if r.Only != nil {
			p.only[r.Tenant] = r.Only
		}
	}
	if len(rows) > 0 {
		last := rows[len(rows)-1]
		p.after = tenantKey{headAt: last.HeadAt.Time, headID: last.HeadID.Int64, name: last.Tenant, wrapped: from.wrapped}
	}
	if cfg.Ordering == config.RoundRobin && !p.full && !from.wrapped && cl.rrLast != "" {
		// The names after the tenant served last are done; those up to it are the next page.
		p.full, p.after = true, tenantKey{wrapped: true}
	}
	return p
}
