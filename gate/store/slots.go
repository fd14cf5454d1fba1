package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/sqldb"
	"github.com/sluicehq/sluice/outbox"
)

// Slots (SPEC §5a, migration 0015): leases on capacity for work the caller runs itself. A slot
// counts while its expires_at, on the database's clock, is in the future. Its grant runs under
// the claim lock, like a claim, and counts the jobs in flight and the live slots together, so
// every cap holds for their sum; a claim counts the live slots in the same round trip as its
// jobs (LockClaims). A slot granted past a limit (decision shadow-refused, or admission_mode off)
// does not count (counted false, migration 0020): it is never read as in flight, so a caller
// looping grants cannot take capacity the claim would give the queue. Renewal is fenced on the caller and on the slot being alive: an expired
// slot is never revived. A release and the upkeep's expiry sweep write a release poke, so the
// drainers take the freed capacity at once.

// Slot audit events (SPEC §10).
const (
	EventSlotGranted     = "slot_granted"
	EventSlotRefused     = "slot_refused"
	EventSlotReleased    = "slot_released"
	EventSlotLost        = "slot_lost"
	EventSlotRenewFailed = "slot_renew_failed"
)

// ErrSlotLost is a renewal of a slot whose lease ran out: it is gone and never revived.
var ErrSlotLost = errors.New("store: the slot's lease ran out")

// ErrSlotNotFound is a slot that does not exist, or that belongs to another caller.
var ErrSlotNotFound = errors.New("store: slot not found")

// Slot is a row of slots.
type Slot struct {
	ID           int64
	Tenant       string
	Caller       string
	Lanes        []string
	Interactive  bool
	LeaseSeconds int
	// Counted: the slot counts against the limits while live. False for a slot granted past a
	// limit (TakeSlotParams.Decide): it is recorded, renewed and released like any other, and
	// never read as in flight.
	Counted   bool
	ExpiresAt time.Time
	CreatedAt time.Time
}

// Unit is the slot as a unit of capacity.
func (s Slot) Unit() config.Unit {
	return config.Unit{Tenant: s.Tenant, Lanes: s.Lanes, Interactive: s.Interactive}
}

// liveSlotsSQL reads the live slots that count: tenant, interactive flag and lanes, a row each, in
// inFlightUsageSQL's columns (scanUsage reads both): one range of the counted index (covering, so
// no row is read), bounded by the slots that count, which the global cap bounds however many
// uncounted slots are live. It is not grouped, for the reason inFlightUsageSQL is not: a GROUP BY over the lanes column made
// MariaDB build an on-disk temporary table per read.
const liveSlotsSQL = `SELECT tenant, interactive, lanes, 1, FALSE ` + liveSlots

// liveSlots is the range of the live slots that count, for the readers that count them one row
// each. `counted = TRUE` (not a bare `counted`) makes the range cover both key parts.
const liveSlots = `FROM slots FORCE INDEX (counted) WHERE counted = TRUE AND expires_at > NOW(6)`

// LiveSlots returns the live slots that count as a config.Usage (tiers as cfg says), for
// /v1/status and the metrics: one range of the counted index, bounded by the slots that count.
func LiveSlots(ctx context.Context, db sqldb.DB, cfg config.Config) (config.Usage, error) {
	return queryUsage(ctx, db, cfg, liveSlotsSQL, "count live slots")
}

// readUsage reads the next result set of res, usageSQL's, as what is in flight: the jobs and the
// live slots together.
func readUsage(res *Results, cfg config.Config) (config.Usage, error) {
	us, _, err := readUsageJobs(res, cfg, nil)
	return us, err
}

// readUsageJobs is readUsage that also returns the jobs in flight of each of tenants, the slots
// left out.
func readUsageJobs(res *Results, cfg config.Config, tenants []string) (config.Usage, map[string]int, error) {
	us := config.NewUsage()
	jobs := make(map[string]int, len(tenants))
	for _, t := range tenants {
		jobs[t] = 0
	}
	rows, err := res.Next()
	if err != nil {
		return us, nil, fmt.Errorf("count in-flight jobs and live slots: %w", err)
	}
	return us, jobs, scanUsage(rows, cfg, &us, jobs, "count in-flight jobs and live slots")
}

// waitingSQL reads, in the head index's order (oldest queued job first), the tenants with queued
// work other than the slot's own, with their oldest job's rate key and whether its not-before
// has passed: the fair-order check of a slot's grant. It stops after LIMIT rows (a primary-key
// lookup of each head), so it never grows with the number of tenants with work. A head that a
// claim left behind (migration 0018), until its drainer sets it forward, is a job just
// dispatched: its rate key stands in for the tenant's next job's, and it is due (a claim clears
// not_before). Its row may even be purged by then: the tenant still has queued work, so it is
// read as due with no rate key (LEFT JOIN), not left out.
const waitingSQL = `SELECT STRAIGHT_JOIN t.tenant, j.rate_key_sha256, j.id IS NULL OR j.not_before IS NULL OR j.not_before <= NOW(6)
	FROM tenants t FORCE INDEX (head) LEFT JOIN jobs j ON j.id = t.head_id
	WHERE t.head_at IS NOT NULL AND t.tenant <> ? ORDER BY t.head_at, t.head_id LIMIT ?`

// Waiting is a tenant with queued work, as a slot's grant reads it.
type Waiting struct {
	Tenant string
	// HeadRateKey is the SHA-256 of its oldest queued job's rate key, "" for none.
	HeadRateKey string
	// Due: that job's not-before (an executor's 503) has passed or was never set.
	Due bool
}

// tenantQueuedSQL reads the slot tenant's queued depth, for the refusal's Retry-After.
const tenantQueuedSQL = `SELECT COALESCE((SELECT queued FROM tenants WHERE tenant = ?), 0)`

// SlotState is what a slot's grant reads under the claim lock.
type SlotState struct {
	// Config is the runtime configuration in force.
	Config config.Config
	// Usage is what is in flight: jobs and live slots.
	Usage config.Usage
	// TenantQueued is the slot tenant's queued depth.
	TenantQueued int
	// Waiting are tenants with queued work other than the slot's, by their oldest queued job,
	// at most TakeSlotParams.WaitingLimit of them.
	Waiting []Waiting
}

// TakeSlotParams are one slot request.
type TakeSlotParams struct {
	Tenant       string
	Caller       string
	Lanes        []string
	Interactive  bool
	LeaseSeconds int
	// WaitingLimit bounds the tenants with work read for the fair-order check.
	WaitingLimit int
	// Decide is called under the claim lock with what was read and says whether the slot is
	// written and whether it counts.
	Decide func(SlotState) SlotGrant
}

// SlotGrant is Decide's answer.
type SlotGrant struct {
	// Grant: the slot is written; otherwise nothing is.
	Grant bool
	// Counted: the slot counts against the limits (Slot.Counted).
	Counted bool
	// Event is the audit row of the grant (its SlotID is filled in by TakeSlot).
	Event AuditEvent
}

// TakeSlot decides a slot request under the claim lock and, if Decide grants it, inserts the slot
// (counted as Decide says) and its audit row and commits: two round trips of a ConnTx on db (an OpenMulti pool). The first
// begins the transaction, takes the claim lock (reading the runtime config in force, as a claim
// does), counts the jobs in flight and the live slots, reads the tenants waiting ahead in fair
// order and the tenant's queued depth; the second inserts, reads back and commits. A refusal
// rolls back: nothing is written. It returns what was read, and the slot when one was granted.
//
// Since the claim lock serialises grants with claims, and both count jobs and live slots under
// it, no grant or claim puts the sum above a cap as read in its own transaction.
func TakeSlot(ctx context.Context, db *sql.DB, p TakeSlotParams) (SlotState, *Slot, error) {
	var st SlotState
	tx, err := BeginConnTx(ctx, db)
	if err != nil {
		return st, nil, fmt.Errorf("take slot: begin: %w", err)
	}
	defer tx.Close()
	res, err := tx.Query(ctx, []string{lockClaimsSQL, usageSQL, waitingSQL, tenantQueuedSQL},
		p.Tenant, max(p.WaitingLimit, 1), p.Tenant)
	if err != nil {
		return st, nil, fmt.Errorf("take slot: lock: %w", err)
	}
	if st, err = readSlotState(res); err != nil {
		_ = res.Close()
		return st, nil, fmt.Errorf("take slot: %w", err)
	}
	if err := res.Close(); err != nil {
		return st, nil, fmt.Errorf("take slot: %w", err)
	}
	g := p.Decide(st)
	if !g.Grant {
		return st, nil, nil
	}
	lanes := JoinLanes(p.Lanes)
	evArgs := appendAuditArgs(nil, g.Event)
	// appendAuditArgs gives event, tenant, job_id, slot_id, ...: the slot id is the INSERT's.
	evArgs = append(evArgs[:2:2], evArgs[4:]...)
	args := append([]any{p.Tenant, p.Caller, lanes, p.Interactive, p.LeaseSeconds, g.Counted, p.LeaseSeconds}, evArgs...)
	rs, err := tx.QueryCommit(ctx, []string{
		`INSERT INTO slots (tenant, caller, lanes, interactive, lease_seconds, counted, expires_at, created_at)
			VALUES (?, ?, ?, ?, ?, ?, NOW(6) + INTERVAL ? SECOND, NOW(6))`,
		`SELECT id, expires_at, created_at FROM slots WHERE id = LAST_INSERT_ID()`,
		auditInsert + `VALUES (?, ?, NULL, LAST_INSERT_ID(), ?, ?, ?, ?, ?, ?, ?, ?)`,
	}, args...)
	if err != nil {
		return st, nil, fmt.Errorf("take slot: insert: %w", err)
	}
	s := &Slot{Tenant: p.Tenant, Caller: p.Caller, Lanes: SplitLanes(lanes), Interactive: p.Interactive, LeaseSeconds: p.LeaseSeconds,
		Counted: g.Counted}
	if err := rs.ScanOne(&s.ID, &s.ExpiresAt, &s.CreatedAt); err != nil {
		_ = rs.Close()
		return st, nil, fmt.Errorf("take slot: read back: %w", err)
	}
	if err := rs.Close(); err != nil {
		return st, nil, fmt.Errorf("take slot: commit: %w", err)
	}
	return st, s, nil
}

// readSlotState reads TakeSlot's first round trip.
func readSlotState(res *Results) (SlotState, error) {
	var st SlotState
	var raw sql.NullString
	if err := res.ScanOne(&raw); err != nil {
		return st, fmt.Errorf("claim lock: %w", err)
	}
	var err error
	if st.Config, err = decodeClaimConfig(raw); err != nil {
		return st, err
	}
	if st.Usage, err = readUsage(res, st.Config); err != nil {
		return st, err
	}
	rows, err := res.Next()
	if err != nil {
		return st, fmt.Errorf("tenants waiting: %w", err)
	}
	for rows.Next() {
		var w Waiting
		var key sql.NullString
		if err := rows.Scan(&w.Tenant, &key, &w.Due); err != nil {
			return st, fmt.Errorf("tenants waiting: %w", err)
		}
		w.HeadRateKey = key.String
		st.Waiting = append(st.Waiting, w)
	}
	if err := rows.Err(); err != nil {
		return st, fmt.Errorf("tenants waiting: %w", err)
	}
	if err := res.ScanOne(&st.TenantQueued); err != nil {
		return st, fmt.Errorf("tenant depth: %w", err)
	}
	return st, nil
}

// RenewSlot extends slot id's lease to now + its own lease_seconds (database clock), fenced on
// the caller (any, with admin) and on the slot being alive, in one round trip of db (an
// OpenMulti pool). ErrSlotNotFound: no such slot, or another caller's; ErrSlotLost: its lease
// had run out (the row may not have been swept yet; it is not revived).
func RenewSlot(ctx context.Context, db sqldb.DB, id int64, caller string, admin bool) (Slot, error) {
	// The SELECT after the UPDATE tells the outcome without trusting rows affected (a renewal in
	// the same microsecond changes nothing): a slot the UPDATE extended is alive, one it did not
	// has expires_at in the past and stays there.
	rows, err := db.QueryContext(ctx, `UPDATE slots SET expires_at = NOW(6) + INTERVAL lease_seconds SECOND
		WHERE id = ? AND (caller = ? OR ?) AND expires_at > NOW(6);
		SELECT id, tenant, caller, lanes, interactive, lease_seconds, counted, expires_at, created_at, expires_at > NOW(6)
		FROM slots WHERE id = ? AND (caller = ? OR ?)`, id, caller, admin, id, caller, admin)
	if err != nil {
		return Slot{}, fmt.Errorf("renew slot %d: %w", id, err)
	}
	res := ResultsOf(rows)
	defer res.Close()
	var s Slot
	var lanes string
	var alive bool
	switch err := res.ScanOne(&s.ID, &s.Tenant, &s.Caller, &lanes, &s.Interactive, &s.LeaseSeconds, &s.Counted, &s.ExpiresAt, &s.CreatedAt, &alive); {
	case errors.Is(err, sql.ErrNoRows):
		return Slot{}, ErrSlotNotFound
	case err != nil:
		return Slot{}, fmt.Errorf("renew slot %d: %w", id, err)
	}
	s.Lanes = SplitLanes(lanes)
	if err := res.Close(); err != nil {
		return Slot{}, fmt.Errorf("renew slot %d: %w", id, err)
	}
	if !alive {
		return s, ErrSlotLost
	}
	return s, nil
}

// Released is what ReleaseSlot did.
type Released struct {
	Slot Slot
	// Found: the slot existed and was deleted.
	Found bool
	// Expired: its lease had run out (the upkeep had not yet swept it).
	Expired bool
	// Poke is the release poke written, when Found and the slot counted: for the fast path that
	// publishes it at once. A slot that did not count freed nothing: no poke (a caller releasing
	// uncounted slots in a loop makes no drainer run a pass).
	Poke outbox.Row
}

// ReleaseSlot deletes slot id, fenced on the caller (any, with admin), with its audit row and,
// if it counted, a release poke, in two round trips of a ConnTx on db: the first locks and reads the row, the
// second writes and commits. A slot that is gone is not an error (Found false): a release is
// idempotent. ErrSlotNotFound: the slot belongs to another caller.
func (s *Store) ReleaseSlot(ctx context.Context, db *sql.DB, now time.Time, id int64, caller string, admin bool) (Released, error) {
	var out Released
	tx, err := BeginConnTx(ctx, db)
	if err != nil {
		return out, fmt.Errorf("release slot %d: begin: %w", id, err)
	}
	defer tx.Close()
	res, err := tx.Query(ctx, []string{`SELECT id, tenant, caller, lanes, interactive, lease_seconds, counted, expires_at, created_at,
		expires_at <= NOW(6) FROM slots WHERE id = ? FOR UPDATE`}, id)
	if err != nil {
		return out, fmt.Errorf("release slot %d: %w", id, err)
	}
	sl := &out.Slot
	var lanes string
	err = res.ScanOne(&sl.ID, &sl.Tenant, &sl.Caller, &lanes, &sl.Interactive, &sl.LeaseSeconds, &sl.Counted, &sl.ExpiresAt, &sl.CreatedAt, &out.Expired)
	err = errors.Join(err, res.Close())
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return out, nil
	case err != nil:
		return out, fmt.Errorf("release slot %d: %w", id, err)
	case sl.Caller != caller && !admin:
		return Released{}, ErrSlotNotFound
	}
	sl.Lanes = SplitLanes(lanes)
	out.Found = true
	slotID := strconv.FormatInt(id, 10)
	detail, _ := json.Marshal(map[string]any{"lease_seconds": sl.LeaseSeconds, "expired": out.Expired, "owner": sl.Caller,
		"counted": sl.Counted})
	aq, aargs := auditInsertSQL([]AuditEvent{{Event: EventSlotReleased, Tenant: sl.Tenant, SlotID: &slotID,
		Actor: caller, Detail: detail}})
	stmts, args := []string{aq, `DELETE FROM slots WHERE id = ?`}, append(aargs, id)
	msg := outbox.PokeMessage(s.prefix(), outbox.Release, sl.Tenant, 0)
	if sl.Counted {
		pq, pargs := outbox.Insert(now, msg)
		stmts, args = append(stmts, pq), append(args, pargs...)
	}
	done, err := tx.ExecCommit(ctx, stmts, args...)
	if err != nil {
		return out, fmt.Errorf("release slot %d: %w", id, err)
	}
	if sl.Counted {
		pokeID, _ := done.LastInsertId() // the last statement's: the outbox row's
		out.Poke = outbox.Row{ID: pokeID, Subject: msg.Subject, Payload: msg.Payload, CreatedAt: now}
	}
	return out, nil
}

// ExpiredSlot is a slot whose lease ran out, as the upkeep's scan read it.
type ExpiredSlot struct {
	ID      int64
	Tenant  string
	Counted bool
}

// expiredSlotsSQL reads the slots whose lease ran out, counted or not, oldest first: the other end
// of the live index's range, so it reads only expired rows (and each one's counted flag by its
// primary key: at most LIMIT of them).
const expiredSlotsSQL = `SELECT id, tenant, counted FROM slots FORCE INDEX (live) WHERE expires_at <= NOW(6)
	ORDER BY expires_at LIMIT ?`

func scanExpiredSlots(rows *sql.Rows) ([]ExpiredSlot, error) {
	var out []ExpiredSlot
	for rows.Next() {
		var e ExpiredSlot
		if err := rows.Scan(&e.ID, &e.Tenant, &e.Counted); err != nil {
			return nil, fmt.Errorf("scan expired slots: %w", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("scan expired slots: %w", err)
	}
	return out, nil
}

// SweepSlots deletes the slots of expired that are still expired (a slot's lease never comes
// back), each with a lost audit row naming actor, and writes a release poke per tenant of a slot
// that counted (one that did not freed nothing), in one round trip and transaction of a ConnTx on
// db. Another drainer sweeping the same slots meanwhile deletes each once: it returns the slots
// this call deleted.
func (s *Store) SweepSlots(ctx context.Context, db *sql.DB, now time.Time, actor string, expired []ExpiredSlot) (int, error) {
	if len(expired) == 0 {
		return 0, nil
	}
	tx, err := BeginConnTx(ctx, db)
	if err != nil {
		return 0, fmt.Errorf("sweep slots: begin: %w", err)
	}
	defer tx.Close()
	ids := make([]int64, len(expired))
	var msgs []outbox.Message
	seen := map[string]bool{}
	for i, e := range expired {
		ids[i] = e.ID
		if e.Counted && !seen[e.Tenant] {
			seen[e.Tenant] = true
			msgs = append(msgs, outbox.PokeMessage(s.prefix(), outbox.Release, e.Tenant, 0))
		}
	}
	in := "id IN (" + Placeholders(len(ids)) + ") AND expires_at <= NOW(6)"
	idArgs := int64Args(ids)
	args := append(append(append(append([]any{}, idArgs...), actor), idArgs...), idArgs...)
	stmts := []string{
		"SELECT id FROM slots WHERE " + in + " ORDER BY id FOR UPDATE",
		auditInsert + `SELECT '` + EventSlotLost + `', tenant, NULL, id, ?, NULL, NULL, NULL, NULL, NULL, NULL,
			JSON_OBJECT('lease_seconds', lease_seconds, 'expires_at', expires_at, 'counted', counted IS TRUE) FROM slots WHERE ` + in,
		"DELETE FROM slots WHERE " + in}
	if len(msgs) > 0 {
		pq, pargs := outbox.Insert(now, msgs...)
		stmts, args = append(stmts, pq), append(args, pargs...)
	}
	res, err := tx.ExecCommit(ctx, stmts, args...)
	if err != nil {
		return 0, fmt.Errorf("sweep %d slot(s): %w", len(ids), err)
	}
	// The lock, the audit rows, the DELETE, the pokes if any.
	affected := res.AllRowsAffected()
	if len(affected) != len(stmts) {
		return 0, fmt.Errorf("sweep slots: %d results for %d statements", len(affected), len(stmts))
	}
	return int(affected[2]), nil
}

// SlotFilter selects a page of GET /v1/slots.
type SlotFilter struct {
	Tenant string // "" for every tenant
	Before int64  // a cursor: only ids below it (0: from the newest)
	Limit  int
}

// ListSlots returns at most f.Limit slots, live or expired and not yet swept, newest first.
func ListSlots(ctx context.Context, db sqldb.DB, f SlotFilter) ([]Slot, error) {
	q := `SELECT id, tenant, caller, lanes, interactive, lease_seconds, counted, expires_at, created_at FROM slots WHERE TRUE`
	var args []any
	if f.Tenant != "" {
		q += ` AND tenant = ?`
		args = append(args, f.Tenant)
	}
	if f.Before > 0 {
		q += ` AND id < ?`
		args = append(args, f.Before)
	}
	q += ` ORDER BY id DESC LIMIT ?`
	args = append(args, f.Limit)
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list slots: %w", err)
	}
	defer rows.Close()
	var out []Slot
	for rows.Next() {
		var s Slot
		var lanes string
		if err := rows.Scan(&s.ID, &s.Tenant, &s.Caller, &lanes, &s.Interactive, &s.LeaseSeconds, &s.Counted, &s.ExpiresAt, &s.CreatedAt); err != nil {
			return nil, fmt.Errorf("list slots: %w", err)
		}
		s.Lanes = SplitLanes(lanes)
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list slots: %w", err)
	}
	return out, nil
}
