package drainer

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/gate/limits"
)

// tenantPage is what one read of the tenants index gave a pass: the next tenants with queued
// work in the pass's ordering, whether the read was full (more tenants with work may follow), and
// where the next read starts.
type tenantPage struct {
	tenants []string
	full    bool
	after   tenantKey
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
func (cl *claimer) tenantsPerPage(cfg limits.Config) int {
	return max(min(cfg.GlobalInFlight, cl.cfg.ClaimBatch), 1) + gateSlack
}

// passState reads, in one round trip, the jobs in flight per tenant and the first page of
// tenants with queued work in cfg's ordering. The in-flight count reads the claim index over the
// in-flight states only, so it is bounded by the global cap; the page reads one index of tenants
// (migrations/0010) for a number of rows bounded by the claim batch. Neither grows with the number
// of tenants that have work or ever had it, nor with any tenant's backlog.
func (cl *claimer) passState(ctx context.Context, cfg limits.Config) (inFlight map[string]int, total int, page tenantPage, err error) {
	q, args := cl.tenantsSQL(cfg, tenantKey{}, true)
	inFlight, total, work, err := cl.readTenants(ctx, q+` UNION ALL SELECT tenant, COUNT(*), NULL, NULL FROM jobs
		WHERE status IN ('claimed','dispatched','running') GROUP BY tenant`, args)
	if err != nil {
		return nil, 0, page, fmt.Errorf("read in-flight counts and tenants with queued jobs: %w", err)
	}
	return inFlight, total, cl.pageOf(cfg, tenantKey{}, work), nil
}

// nextTenants reads the page of tenants with work that follows prev.
func (cl *claimer) nextTenants(ctx context.Context, cfg limits.Config, prev tenantPage) (tenantPage, error) {
	q, args := cl.tenantsSQL(cfg, prev.after, false)
	_, _, work, err := cl.readTenants(ctx, q, args)
	if err != nil {
		return tenantPage{}, fmt.Errorf("read tenants with queued jobs: %w", err)
	}
	return cl.pageOf(cfg, prev.after, work), nil
}

// readTenants runs q, whose rows are tenants with work (tenant, NULL, head_at, head_id) and,
// from passState, in-flight counts (tenant, count, NULL, NULL).
func (cl *claimer) readTenants(ctx context.Context, q string, args []any) (inFlight map[string]int, total int, work []tenantRow, err error) {
	rows, err := cl.cfg.DB.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, 0, nil, err
	}
	defer rows.Close()
	inFlight = map[string]int{}
	for rows.Next() {
		var r tenantRow
		var n sql.NullInt64
		if err := rows.Scan(&r.name, &n, &r.headAt, &r.headID); err != nil {
			return nil, 0, nil, err
		}
		if !n.Valid {
			work = append(work, r)
			continue
		}
		inFlight[r.name] = int(n.Int64)
		total += int(n.Int64)
	}
	return inFlight, total, work, rows.Err()
}

// tenantRow is a row of tenantsSQL.
type tenantRow struct {
	name   string
	headAt sql.NullTime
	headID sql.NullInt64
}

// tenantsSQL is the read of the page of tenants with work after from (from the start when
// first), in cfg's ordering, with the columns of inFlightPerTenant's rows (tenant, NULL) plus the
// tenant's index position (passState adds the in-flight counts as rows (tenant, count, NULL,
// NULL)). fair and fifo walk the head index (every tenant's oldest queued job,
// oldest first); round_robin walks work_tenant by name from the tenant served last to the end,
// then from the first name up to it.
func (cl *claimer) tenantsSQL(cfg limits.Config, from tenantKey, first bool) (string, []any) {
	n := cl.tenantsPerPage(cfg)
	const cols = "SELECT tenant, NULL, head_at, head_id FROM tenants"
	if cfg.Ordering == limits.RoundRobin {
		if first {
			from.name = cl.rrLast
		}
		if from.wrapped {
			return "(" + cols + " FORCE INDEX (work_tenant) WHERE work_tenant > ? AND work_tenant <= ? ORDER BY work_tenant LIMIT ?)",
				[]any{from.name, cl.rrLast, n}
		}
		return "(" + cols + " FORCE INDEX (work_tenant) WHERE work_tenant > ? ORDER BY work_tenant LIMIT ?)", []any{from.name, n}
	}
	if first {
		return "(" + cols + " FORCE INDEX (head) WHERE head_at IS NOT NULL ORDER BY head_at, head_id LIMIT ?)", []any{n}
	}
	// A row constructor comparison is not a range MariaDB seeks to, so the keyset is spelt out.
	return "(" + cols + ` FORCE INDEX (head) WHERE head_at IS NOT NULL AND (head_at > ? OR (head_at = ? AND head_id > ?))
		ORDER BY head_at, head_id LIMIT ?)`, []any{from.headAt, from.headAt, from.headID, n}
}

// pageOf turns the rows of tenantsSQL read from from into a page.
func (cl *claimer) pageOf(cfg limits.Config, from tenantKey, rows []tenantRow) tenantPage {
	p := tenantPage{full: len(rows) >= cl.tenantsPerPage(cfg), after: from}
	for _, r := range rows {
		p.tenants = append(p.tenants, r.name)
	}
	if len(rows) > 0 {
		last := rows[len(rows)-1]
		p.after = tenantKey{headAt: last.headAt.Time, headID: last.headID.Int64, name: last.name, wrapped: from.wrapped}
	}
	if cfg.Ordering == limits.RoundRobin && !p.full && !from.wrapped && cl.rrLast != "" {
		// The names after the tenant served last are done; those up to it are the next page.
		p.full, p.after = true, tenantKey{wrapped: true}
	}
	return p
}
