package store

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// A claim leaves its tenants' heads where they were (migration 0018): a head is a lower bound of
// the tenant's oldest queued job, NULL exactly when it has none. The drainer that claimed sets
// them forward afterwards, for every tenant it claimed from since its last advance at once, so a
// tenant claimed from in many passes pays one advance, not one per claimed job.

// lockBehindSQL locks the rows of the tenants to set forward, in key order, skipping those
// another transaction holds (an admission, a claim, a stuck client's transaction): an advance
// never waits for a tenant, so it cannot hold up the drainer's pass. The second statement reads,
// without locking, which of them have a head at all: those skipped are to be set forward next
// time; a tenant with none (or no row: purged) is done.
func lockBehindSQL(n int) []string {
	in := "tenant IN (" + Placeholders(n) + ")"
	return []string{"SELECT tenant FROM tenants WHERE " + in + " ORDER BY tenant FOR UPDATE SKIP LOCKED",
		"SELECT tenant FROM tenants WHERE " + in + " AND head_id IS NOT NULL"}
}

// advanceHeadSQL sets one tenant's head forward to its oldest queued job. The head it starts from
// is read into user variables, which MariaDB takes as constants: each probe seeks straight to the
// old head's position in the claim index (migration 0012's two dives) instead of walking the
// tenant's queued range from its start over the entries of the jobs claimed since. The row is
// locked (lockBehindSQL) and every transaction that puts a job in the queue writes it, so the
// probes, reading the latest committed jobs (READ COMMITTED), see every queued job: the head is
// never set past one. The fence on the head read is a second guard.
const advanceHeadSQL = `SELECT head_at, head_id INTO @sluice_head_at, @sluice_head_id FROM tenants WHERE tenant = ?;
UPDATE tenants SET head_id = COALESCE(
		(SELECT id FROM jobs FORCE INDEX (claim) WHERE status = 'queued' AND tenant = ?
			AND queued_at = @sluice_head_at AND id >= @sluice_head_id ORDER BY id LIMIT 1),
		(SELECT id FROM jobs FORCE INDEX (claim) WHERE status = 'queued' AND tenant = ?
			AND queued_at > @sluice_head_at ORDER BY queued_at, id LIMIT 1)),
	head_at = IF(head_id IS NULL, NULL, (SELECT queued_at FROM jobs WHERE id = head_id))
	WHERE tenant = ? AND head_id = @sluice_head_id AND head_at = @sluice_head_at`

// advancePerTrip bounds the tenants one transaction advances: about 600 bytes of statement
// each, so a round trip stays far below 64 KiB (SPEC §14) and holds few row locks.
const advancePerTrip = 64

// AdvanceHeads sets the heads of tenants forward to their oldest queued jobs, in transactions of at
// most advancePerTrip tenants, each two round trips: lock the tenants' rows in key order, skipping
// those locked elsewhere, then set the heads and commit. It returns the tenants with a head that it
// skipped, their rows held by another transaction (all of a transaction's on an error), to try
// again later. db must take several statements in one round trip (OpenMulti). A tenant whose head
// is NULL, or that has no row, is left alone. Safe to call at any time and from any process: a head
// only ever moves to the tenant's oldest queued job.
func AdvanceHeads(ctx context.Context, db *sql.DB, tenants []string) (skipped []string, err error) {
	ts := append([]string(nil), tenants...)
	sort.Strings(ts)
	ts = slices.Compact(ts)
	for len(ts) > 0 {
		n := min(len(ts), advancePerTrip)
		s, err := advanceHeads(ctx, db, ts[:n])
		skipped = append(skipped, s...)
		if err != nil {
			return append(skipped, ts[n:]...), err
		}
		ts = ts[n:]
	}
	return skipped, nil
}

// advanceHeads is one transaction of AdvanceHeads; on error, every tenant is skipped.
func advanceHeads(ctx context.Context, db *sql.DB, tenants []string) ([]string, error) {
	tx, err := BeginConnTx(ctx, db)
	if err != nil {
		return tenants, fmt.Errorf("advance queue heads: %w", err)
	}
	defer tx.Close()
	args := make([]any, 0, 2*len(tenants))
	for range 2 {
		for _, t := range tenants {
			args = append(args, t)
		}
	}
	res, err := tx.Query(ctx, lockBehindSQL(len(tenants)), args...)
	if err != nil {
		return tenants, fmt.Errorf("advance queue heads: lock tenants: %w", err)
	}
	locked, err := tenantSet(res)
	var headed map[string]bool
	if err == nil {
		headed, err = tenantSet(res)
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return tenants, fmt.Errorf("advance queue heads: lock tenants: %w", err)
	}
	var skipped []string
	stmts := make([]string, 0, len(locked))
	args = make([]any, 0, 4*len(locked))
	for _, t := range tenants {
		if !locked[t] || !headed[t] {
			if headed[t] {
				skipped = append(skipped, t)
			}
			continue
		}
		stmts = append(stmts, advanceHeadSQL)
		args = append(args, t, t, t, t)
	}
	if len(stmts) == 0 {
		return skipped, nil
	}
	if _, err := tx.ExecCommit(ctx, []string{strings.Join(stmts, ";")}, args...); err != nil {
		return tenants, fmt.Errorf("advance queue heads of %d tenant(s): %w", len(stmts), err)
	}
	return skipped, nil
}

// tenantSet reads the next result set of res, one tenant a row.
func tenantSet(res *Results) (map[string]bool, error) {
	rows, err := res.Next()
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, err
		}
		out[t] = true
	}
	return out, rows.Err()
}
