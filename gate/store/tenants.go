package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gate/sqldb"
)

// The reads of the tenants' queue state (migration 0010: each tenant's queued count and oldest
// queued job, kept by admission and the triggers on jobs) for status and GET /v1/tenants. Each
// reads one index range of the tenants table that stops after the rows it returns, or the claim
// index over the in-flight states, which the global cap bounds: none grows with the number of
// tenants that have work or ever had it, nor with any tenant's backlog. None locks anything.
// A head may lag behind its tenant's oldest queued job by the claims of the last advance
// (migration 0018: at most a drainer's PollInterval, HeadAdvance while tenants with work fill more
// than a page), so the oldest queued job's time read here may be that much older than the truth;
// counts are exact.

// TenantQueue is a tenant's queue state.
type TenantQueue struct {
	Tenant string
	Queued int
	HeadAt *time.Time // when its oldest queued job was queued; nil when it has none
}

// TenantIndex is an order of ReadTenantQueues, with the index that serves it.
type TenantIndex int

// The orders of ReadTenantQueues.
const (
	// ByName: the tenants with work named after TenantQueuesParams.After, by name (work_tenant:
	// the name while the tenant has queued work, else NULL, so the range skips idle tenants).
	ByName TenantIndex = iota
	// BelowDepth: the tenants with 0 < queued < Depth, deepest first, ties by name descending
	// (the order the depth index serves read backwards).
	BelowDepth
	// AtDepth: the tenants with exactly Depth queued, by name (the depth index, forwards).
	AtDepth
	// AtDepthAfter: AtDepth from the name after After.
	AtDepthAfter
	// One: the tenant named After, with or without queued work (none if it never had a job).
	One
)

// TenantQueuesParams select a page of tenants' queue states.
type TenantQueuesParams struct {
	By    TenantIndex
	After string // ByName, AtDepthAfter, One
	Depth int64  // BelowDepth (exclusive bound), AtDepth, AtDepthAfter
	Limit int
}

// ReadTenantQueues returns at most p.Limit tenants' queue states in p.By's order.
func ReadTenantQueues(ctx context.Context, db sqldb.DB, p TenantQueuesParams) ([]TenantQueue, error) {
	var q string
	var args []any
	switch p.By {
	case ByName:
		q, args = `SELECT tenant, queued, head_at FROM tenants FORCE INDEX (work_tenant)
			WHERE work_tenant > ? ORDER BY work_tenant LIMIT ?`, []any{p.After, p.Limit}
	case BelowDepth:
		q, args = `SELECT tenant, queued, head_at FROM tenants FORCE INDEX (depth)
		WHERE queued > 0 AND queued < ? ORDER BY queued DESC, tenant DESC LIMIT ?`, []any{p.Depth, p.Limit}
	case AtDepth:
		q, args = `SELECT tenant, queued, head_at FROM tenants FORCE INDEX (depth)
			WHERE queued = ? ORDER BY tenant LIMIT ?`, []any{p.Depth, p.Limit}
	case AtDepthAfter:
		q, args = `SELECT tenant, queued, head_at FROM tenants FORCE INDEX (depth)
			WHERE queued = ? AND tenant > ? ORDER BY tenant LIMIT ?`, []any{p.Depth, p.After, p.Limit}
	case One:
		q, args = `SELECT tenant, queued, head_at FROM tenants WHERE tenant = ? LIMIT ?`, []any{p.After, p.Limit}
	default:
		return nil, fmt.Errorf("tenants: unknown order %d", p.By)
	}
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("tenants: %w", err)
	}
	defer rows.Close()
	var out []TenantQueue
	for rows.Next() {
		var t TenantQueue
		var head sql.NullTime
		if err := rows.Scan(&t.Tenant, &t.Queued, &head); err != nil {
			return nil, fmt.Errorf("tenants: %w", err)
		}
		t.HeadAt = timePtr(head)
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tenants: %w", err)
	}
	return out, nil
}

// TenantInFlight is a tenant with jobs in flight, and its queue state.
type TenantInFlight struct {
	TenantQueue
	InFlight int
}

// ReadInFlight returns each tenant with jobs in flight, with its queue state from its tenants
// row. The claim index range over the three in-flight states reads as many rows as jobs are in
// flight, which the global cap bounds.
func ReadInFlight(ctx context.Context, db sqldb.DB) ([]TenantInFlight, error) {
	rows, err := db.QueryContext(ctx, `SELECT j.tenant, COUNT(*), MAX(t.queued), MAX(t.head_at)
		FROM jobs j FORCE INDEX (claim) JOIN tenants t ON t.tenant = j.tenant
		WHERE j.status IN ('claimed','dispatched','running') GROUP BY j.tenant`)
	if err != nil {
		return nil, fmt.Errorf("in flight per tenant: %w", err)
	}
	defer rows.Close()
	var out []TenantInFlight
	for rows.Next() {
		var t TenantInFlight
		var head sql.NullTime
		if err := rows.Scan(&t.Tenant, &t.InFlight, &t.Queued, &head); err != nil {
			return nil, fmt.Errorf("in flight per tenant: %w", err)
		}
		t.HeadAt = timePtr(head)
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("in flight per tenant: %w", err)
	}
	return out, nil
}

// QueueTotals are the whole queue's figures.
type QueueTotals struct {
	TenantsWithWork int
	Queued          int
	OldestHead      *time.Time // nil when nothing is queued
}

// ReadQueueTotals returns the queue depth, the oldest queued job's time and the count of tenants
// with work. Depth and count are one range scan of the depth index over the tenants with work
// (an index entry per tenant, never a job: with 64 tenants of 100,000 jobs each it reads 64
// entries where COUNT(*) over the claim index would read 6,400,000); the oldest is the first
// entry of the head index.
func ReadQueueTotals(ctx context.Context, db sqldb.DB) (QueueTotals, error) {
	var q QueueTotals
	var oldest sql.NullTime
	err := db.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(queued), 0),
		(SELECT MIN(head_at) FROM tenants)
		FROM tenants FORCE INDEX (depth) WHERE queued > 0`).Scan(&q.TenantsWithWork, &q.Queued, &oldest)
	if err != nil {
		return q, fmt.Errorf("queue totals: %w", err)
	}
	q.OldestHead = timePtr(oldest)
	return q, nil
}

// TenantsByHead returns the names of at most limit tenants with work, those whose oldest queued
// job is oldest first (the head index).
func TenantsByHead(ctx context.Context, db sqldb.DB, limit int) ([]string, error) {
	rows, err := db.QueryContext(ctx, `SELECT tenant FROM tenants FORCE INDEX (head)
		WHERE head_at IS NOT NULL ORDER BY head_at, head_id LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("tenants by oldest head: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, fmt.Errorf("tenants by oldest head: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tenants by oldest head: %w", err)
	}
	return out, nil
}

// HeadsRead is the read of the first queued jobs of a fixed number of tenants (slots): one
// statement of constant text, slots sub-selects on the claim index joined by UNION ALL, whatever
// the number of tenants with work. Built once, used by every read. Safe for concurrent use.
type HeadsRead struct {
	slots int
	query string
}

// NewHeadsRead returns the read of the heads of up to slots tenants.
func NewHeadsRead(slots int) *HeadsRead {
	var q strings.Builder
	for i := range slots {
		if i > 0 {
			q.WriteString(" UNION ALL ")
		}
		// The claim index is forced, as in the drainer's own head read: without the hint MariaDB
		// may pick another index and sort a tenant's whole backlog.
		q.WriteString(`(SELECT tenant, rate_key_sha256, queued_at, not_before FROM jobs FORCE INDEX (claim)
			WHERE status = 'queued' AND tenant = ? ORDER BY queued_at, id LIMIT ?)`)
	}
	return &HeadsRead{slots: slots, query: q.String()}
}

// QueueHead is a queued job near the head of its tenant's queue.
type QueueHead struct {
	Tenant        string
	RateKeySHA256 *string
	QueuedAt      time.Time
	NotBefore     *time.Time
}

// Read returns the first perTenant queued jobs of each of tenants (at most the read's slots;
// unused slots are bound to NULL, which matches nothing), in (queued_at, id) order per tenant.
func (h *HeadsRead) Read(ctx context.Context, db sqldb.DB, tenants []string, perTenant int) ([]QueueHead, error) {
	args := make([]any, 0, 2*h.slots)
	for i := range h.slots {
		var t any // NULL: an empty slot, "tenant = NULL" matches nothing
		if i < len(tenants) {
			t = tenants[i]
		}
		args = append(args, t, perTenant)
	}
	rows, err := db.QueryContext(ctx, h.query, args...)
	if err != nil {
		return nil, fmt.Errorf("queue heads: %w", err)
	}
	defer rows.Close()
	var out []QueueHead
	for rows.Next() {
		var j QueueHead
		var key sql.NullString
		var notBefore sql.NullTime
		if err := rows.Scan(&j.Tenant, &key, &j.QueuedAt, &notBefore); err != nil {
			return nil, fmt.Errorf("queue heads: %w", err)
		}
		j.RateKeySHA256, j.NotBefore = strPtr(key), timePtr(notBefore)
		out = append(out, j)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("queue heads: %w", err)
	}
	return out, nil
}

// QueuedRateKeys returns the rate keys of queued jobs with each key's count of queued jobs, from
// the queued_rate_key index (migration 0008): at most limit keys, or every key when limit is 0.
func QueuedRateKeys(ctx context.Context, db sqldb.DB, limit int) (map[string]int64, error) {
	q := `SELECT queued_rate_key, COUNT(*) FROM jobs
		WHERE queued_rate_key IS NOT NULL GROUP BY queued_rate_key`
	var args []any
	if limit > 0 {
		q += ` LIMIT ?`
		args = append(args, limit)
	}
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("count queued jobs per rate key: %w", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var k string
		var n int64
		if err := rows.Scan(&k, &n); err != nil {
			return nil, fmt.Errorf("count queued jobs per rate key: %w", err)
		}
		out[k] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count queued jobs per rate key: %w", err)
	}
	return out, nil
}
