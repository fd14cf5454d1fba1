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

// advanceHeadSQL sets one tenant's head forward to its oldest queued job. The head it starts from
// is read into user variables, which MariaDB takes as constants: each probe seeks straight to the
// old head's position in the claim index (migration 0012's two dives) instead of walking the
// tenant's queued range from its start over the entries of the jobs claimed since. The UPDATE is
// fenced on that head: if an admission or a requeue moved it meanwhile (only ever back, to a
// job that goes first), the row is left alone. Its probes run once the row is locked and read the
// latest committed jobs (READ COMMITTED), and every transaction that puts a job in the queue
// writes the same row, so a job that enters the queue is either seen by the probe or lowers the
// head itself after this statement: the head is never set past a queued job.
const advanceHeadSQL = `SELECT head_at, head_id INTO @sluice_head_at, @sluice_head_id FROM tenants WHERE tenant = ?;
UPDATE tenants SET head_id = COALESCE(
		(SELECT id FROM jobs FORCE INDEX (claim) WHERE status = 'queued' AND tenant = ?
			AND queued_at = @sluice_head_at AND id >= @sluice_head_id ORDER BY id LIMIT 1),
		(SELECT id FROM jobs FORCE INDEX (claim) WHERE status = 'queued' AND tenant = ?
			AND queued_at > @sluice_head_at ORDER BY queued_at, id LIMIT 1)),
	head_at = IF(head_id IS NULL, NULL, (SELECT queued_at FROM jobs WHERE id = head_id))
	WHERE tenant = ? AND head_id = @sluice_head_id AND head_at = @sluice_head_at`

// advancePerTrip bounds the tenants one round trip (and transaction) advances: about 600 bytes
// of statement each, so a round trip stays far below 64 KiB (SPEC §14) and holds few row locks.
const advancePerTrip = 64

// AdvanceHeads sets the heads of tenants forward to their oldest queued jobs, in transactions of
// at most advancePerTrip tenants, each one round trip that locks its tenants' rows in key order
// (lockorder.go: a transaction that locks tenants but no job row waits for nobody who waits for
// it). db must take several statements in one round trip (OpenMulti). A tenant whose head is NULL
// or moved meanwhile is left alone. Safe to call at any time and from any process: a head only
// ever moves to the tenant's oldest queued job.
func AdvanceHeads(ctx context.Context, db *sql.DB, tenants []string) error {
	ts := append([]string(nil), tenants...)
	sort.Strings(ts)
	ts = slices.Compact(ts)
	for len(ts) > 0 {
		n := min(len(ts), advancePerTrip)
		if err := advanceHeads(ctx, db, ts[:n]); err != nil {
			return err
		}
		ts = ts[n:]
	}
	return nil
}

func advanceHeads(ctx context.Context, db *sql.DB, tenants []string) error {
	tx, err := BeginConnTx(ctx, db)
	if err != nil {
		return fmt.Errorf("advance queue heads: %w", err)
	}
	defer tx.Close()
	stmts := make([]string, len(tenants))
	args := make([]any, 0, 4*len(tenants))
	for i, t := range tenants {
		stmts[i] = advanceHeadSQL
		args = append(args, t, t, t, t)
	}
	if _, err := tx.ExecCommit(ctx, []string{strings.Join(stmts, ";")}, args...); err != nil {
		return fmt.Errorf("advance queue heads of %d tenant(s): %w", len(tenants), err)
	}
	return nil
}
