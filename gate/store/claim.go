package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/sqldb"
)

// The claim transaction: the drainer's one serialised step. It runs on a ConnTx: LockClaims begins
// it, takes the claim lock (reading the runtime config in force) and counts the jobs in flight per
// tenant (with the lone-job probe, after a poke); ClaimJobs locks the chosen jobs and their
// tenants, moves them to dispatched fenced on their versions, reads back which carry this claim's
// nonces, and commits. A claim that waits for another transaction to commit first (the outcomes
// it counts out of flight, written beside it) splits that last round trip: OpenClaim, then
// CommitClaim. The claim lock is held from the first to the last: short statements, no wait on
// memcached, no backlog scan. Claims from every drainer are serialised by it, and each statement
// reads the latest committed data (READ COMMITTED): the in-flight counts cannot be raised by
// another claim while it is held (completions can only lower them), so no claim puts more jobs in
// flight than the caps as read in its own transaction.

// inFlightUsageSQL reads the jobs in flight by tenant and capacity class (SPEC §5a): what
// config.Usage holds, one row per job (the 1 is its count, TRUE says a job), added up in Go. It
// reads the claim index over the in-flight states and each such job's row (lanes, interactive),
// so its cost is bounded by the global cap, not by any backlog. It does not GROUP BY: grouping
// on lanes (up to 520 bytes) with the tenant makes MariaDB build an on-disk (Aria) temporary
// table for every read (Created_tmp_disk_tables went up by one a statement), where the rows
// themselves are at most the global cap.
const inFlightUsageSQL = `SELECT tenant, interactive, lanes, 1, TRUE ` + inFlightJobs

// usageSQL reads what is in flight, the jobs and the live slots that count, in one statement
// (scanUsage's rows): one statement fewer in the round trips of every admission, claim and slot
// grant than the two apart.
const usageSQL = inFlightUsageSQL + " UNION ALL " + liveSlotsSQL

// inFlightJobs is the range of the jobs in flight, for the readers that count them one row each.
// The index is forced: left to itself, the optimizer can read the whole table during a drain, its
// estimate of the range thrown off by the index entries that the drain's status changes
// delete-mark.
const inFlightJobs = `FROM jobs FORCE INDEX (claim) WHERE status IN ('claimed','dispatched','running')`

// addUnit adds n of u, whose lanes are stored as lanes (JoinLanes), to us.
func addUnit(us *config.Usage, cfg config.Config, u config.Unit, lanes string, n int) {
	if lanes != "" {
		u.Lanes = SplitLanes(lanes)
	}
	us.Add(cfg, u, n)
}

// scanUsage adds the rows of inFlightUsageSQL, liveSlotsSQL or usageSQL (the same columns) to
// us, each tenant's tier as cfg says, and the jobs (not the slots) of each tenant that jobs holds
// to its count there; what names the read in its errors.
func scanUsage(rows *sql.Rows, cfg config.Config, us *config.Usage, jobs map[string]int, what string) error {
	for rows.Next() {
		var u config.Unit
		var lanes string
		var n int
		var isJob bool
		if err := rows.Scan(&u.Tenant, &u.Interactive, &lanes, &n, &isJob); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		addUnit(us, cfg, u, lanes, n)
		if !isJob {
			continue // a slot: counted in us alone
		}
		if _, ok := jobs[u.Tenant]; ok {
			jobs[u.Tenant] += n
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// ReadInFlightUsage returns the jobs in flight as a config.Usage (tiers as cfg says), read in one
// statement bounded by the global cap.
func ReadInFlightUsage(ctx context.Context, db sqldb.DB, cfg config.Config) (config.Usage, error) {
	return queryUsage(ctx, db, cfg, inFlightUsageSQL, "count in-flight jobs")
}

// ReadUsage returns what is in flight, the jobs and the live slots that count together, as a
// config.Usage (tiers as cfg says), in one statement bounded by the global cap.
func ReadUsage(ctx context.Context, db sqldb.DB, cfg config.Config) (config.Usage, error) {
	return queryUsage(ctx, db, cfg, usageSQL, "count in-flight jobs and live slots")
}

// queryUsage runs q, a statement of scanUsage's rows, as a config.Usage; what names it in errors.
func queryUsage(ctx context.Context, db sqldb.DB, cfg config.Config, q, what string) (config.Usage, error) {
	us := config.NewUsage()
	rows, err := db.QueryContext(ctx, q)
	if err != nil {
		return us, fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	return us, scanUsage(rows, cfg, &us, nil, what)
}

// lockClaimsSQL takes the claim lock and reads the runtime configuration in force.
const lockClaimsSQL = `SELECT (SELECT config FROM config_versions ORDER BY version DESC LIMIT 1)
	FROM claim_lock WHERE id = 1 FOR UPDATE`

func decodeClaimConfig(raw sql.NullString) (config.Config, error) {
	if !raw.Valid {
		return config.Default(), nil
	}
	return config.Decode([]byte(raw.String))
}

// ClaimLock is what a claim reads under the claim lock.
type ClaimLock struct {
	// Config is the runtime configuration in force (the newest version, or the defaults).
	Config config.Config
	// Usage is what is in flight, by tenant, tier, lane and interactive, as read under the
	// claim lock: the jobs in flight and the live slots that count (SPEC §5a), counted together
	// (usageSQL).
	Usage config.Usage
	// Lone is the lone-job probe's answer (ProbeQueue), when asked for.
	Lone []QueuedJob
}

// LockClaims begins tx in its first round trip, takes the claim lock, reads the runtime
// configuration in force and what is in flight (Usage: the jobs in flight and the live slots that
// count; slots.go: a slot's grant counts both under the same lock, so the caps hold for their
// sum); with probe, the lone-job probe (ProbeQueue) goes in the same round trip, read under the
// claim lock.
func LockClaims(ctx context.Context, tx *ConnTx, probe bool) (ClaimLock, error) {
	var l ClaimLock
	stmts := []string{lockClaimsSQL, usageSQL}
	if probe {
		stmts = append(stmts, loneProbeSQL)
	}
	res, err := tx.Query(ctx, stmts)
	if err != nil {
		return l, fmt.Errorf("take claim lock: %w", err)
	}
	defer res.Close()
	var raw sql.NullString
	if err := res.ScanOne(&raw); err != nil {
		return l, fmt.Errorf("take claim lock: %w", err)
	}
	if l.Config, err = decodeClaimConfig(raw); err != nil {
		return l, err
	}
	if l.Usage, err = readUsage(res, l.Config); err != nil {
		return l, err
	}
	if probe {
		rows, err := res.Next()
		if err != nil {
			return l, fmt.Errorf("read the queue's head: %w", err)
		}
		if l.Lone, err = scanLone(rows); err != nil {
			return l, err
		}
	}
	return l, res.Close()
}

// Head is a queued job at the head of its tenant's queue: a job a claim may take.
type Head struct {
	ID          int64
	Tenant      string
	RateKey     sql.NullString // the rate key's SHA-256
	QueuedAt    time.Time
	Version     int64
	Lanes       []string // nil for none
	Interactive bool
	Priority    int
}

// Unit is what h asks of the caps.
func (h Head) Unit() config.Unit {
	return config.Unit{Tenant: h.Tenant, Lanes: h.Lanes, Interactive: h.Interactive}
}

// Unit is what job r asks of the caps (or holds of them, in flight).
func (r Row) Unit() config.Unit {
	return config.Unit{Tenant: r.Tenant, Lanes: r.Lanes, Interactive: r.Interactive}
}

// Before reports whether h goes before o in a tenant's queue: its interactive jobs first (SPEC
// §5a), then by priority, highest first, a job queued before aged (not zero) as if at
// job.MaxPriority (SPEC §5), then in (queued_at, id) order.
func (h Head) Before(o Head, aged time.Time) bool {
	if h.Interactive != o.Interactive {
		return h.Interactive
	}
	if hp, op := h.effectivePriority(aged), o.effectivePriority(aged); hp != op {
		return hp > op
	}
	if !h.QueuedAt.Equal(o.QueuedAt) {
		return h.QueuedAt.Before(o.QueuedAt)
	}
	return h.ID < o.ID
}

// effectivePriority is h's priority, or job.MaxPriority once it was queued before aged.
func (h Head) effectivePriority(aged time.Time) int {
	if !aged.IsZero() && h.QueuedAt.Before(aged) {
		return job.MaxPriority
	}
	return h.Priority
}

// belowDefault reports whether h goes after every default-priority job of its tenant that is not
// interactive: a plain job of a lower priority, not aged.
func (h Head) belowDefault(aged time.Time) bool {
	return !h.Interactive && h.effectivePriority(aged) < job.DefaultPriority
}

// ClaimJob is a job a claim chose, as read before the claim transaction, with the nonce hash the
// claim gives it.
type ClaimJob struct {
	ID          int64
	Version     int64
	Tenant      string
	NonceSHA256 []byte
}

// ClaimParams are one claim's jobs and what it records on them.
type ClaimParams struct {
	DrainerID string
	// Stamp is the claim and dispatch time recorded; StartedAt, if not nil, the start time of
	// jobs whose start is not confirmed.
	Stamp     time.Time
	StartedAt *time.Time
	// LeaseUntil and NonceExpiresAt end the lease and the nonce's time to confirm the start.
	LeaseUntil     time.Time
	NonceExpiresAt time.Time
	Jobs           []ClaimJob
}

// claimUpdateSQL is a claim's UPDATE of p.Jobs, and its arguments. The primary key is forced: the
// optimizer otherwise weighs the status indexes' queued ranges on every claim (index dives
// through the entries a drain delete-marks), and once fewer jobs are queued than the claim names
// (a drain's last claims, a claim of every queued job) walks a queued range instead, locking
// every queued job (TestClaimUpdateReadsItsJobsByID; seen with the lease index before 0026).
func claimUpdateSQL(p ClaimParams) (string, []any) {
	var cases, fence strings.Builder
	args := make([]any, 0, 16+4*len(p.Jobs))
	var started any
	if p.StartedAt != nil {
		started = *p.StartedAt
	}
	args = append(args, p.Stamp, p.Stamp, started, p.LeaseUntil, p.DrainerID, p.NonceExpiresAt)
	for _, c := range p.Jobs {
		cases.WriteString(" WHEN ? THEN ?")
		args = append(args, c.ID, c.NonceSHA256)
	}
	// The fence is a row-constructor IN over (id, version) (see the package doc).
	for _, c := range p.Jobs {
		args = append(args, c.ID)
	}
	for i, c := range p.Jobs {
		if i > 0 {
			fence.WriteString(",")
		}
		fence.WriteString("(?,?)")
		args = append(args, c.ID, c.Version)
	}
	return `UPDATE jobs FORCE INDEX (PRIMARY) SET status = 'dispatched', version = version + 1,
		attempt = attempt + 1, claimed_at = ?, dispatched_at = ?, started_at = ?, lease_until = ?,
		drainer_id = ?, nonce_expires_at = ?, not_before = NULL, nonce_sha256 = CASE id` + cases.String() + ` END
		WHERE id IN (` + Placeholders(len(p.Jobs)) + `) AND (id, version) IN (` + fence.String() + `) AND status = 'queued'
		AND (start_by IS NULL OR start_by > ?)`,
		append(args, p.Stamp)
}

// claimCountPerTenant is how many jobs a tenant a claim must take, on average, for the claim to
// count its tenants itself (claimCountSQL) rather than leave them to the trigger. Counting costs a
// statement and a read of each job by id, and saves a trigger's UPDATE of a tenant row for every
// job after a tenant's first: measured (BenchmarkDrainThroughput, 64-job claims, alternated with
// the build before), with 16 jobs a tenant the drain ran 1.30x as fast on 0.77x the server's CPU
// a job; with one job a tenant it saves no row update, and counting every claim so measured
// within the noise (integration/BENCHMARKS.md, session 24).
const claimCountPerTenant = 2

// claimStampSQL tells the update trigger (migration 0025) which claim this session runs when the
// claim counts its tenants itself: a job that enters dispatched with this claimed_at is counted by
// claimCountSQL, not row by row. The claim clears it right after its UPDATE, and a claim that
// leaves the count to the trigger clears it before its own: two claims can share a stamp (a
// clock's tick, an injected clock), and a stamp left on the connection would then make the
// trigger skip the second claim's jobs, which nothing would count (TestStateMachineProperties
// found it so).
// ClaimJobs gives it the stamp to the microsecond, as claimed_at stores it.
const claimStampSQL = "SET @sluice_claim_stamp = CAST(? AS DATETIME(6))"

// claimCountSQL subtracts the jobs of ids that carry one of the claim's nonce hashes (those its
// UPDATE moved, and only those) from their tenants' queue counts, clearing the head of a tenant
// left with none, as the trigger did for each job before migration 0025: one statement of one
// row per tenant rather than a trigger's sub-statement per job. The tenants' rows are already
// locked, in key order. Every assignment reads the count from before the statement, whichever
// order the server assigns in (a multiple-table UPDATE does not promise left to right), so the
// count goes last and the heads compare it with the jobs subtracted. The jobs are read by their
// ids: left to itself, MariaDB pushes the join on tenant into the derived table (a lateral
// derived table) and reads every job of each tenant through an index on tenant, a claim's cost
// growing with the backlog.
func claimCountSQL(ids []int64, hashes []any) (string, []any) {
	return `UPDATE tenants t JOIN (SELECT tenant, COUNT(*) AS n FROM jobs FORCE INDEX (PRIMARY) WHERE id IN (` + Placeholders(len(ids)) +
			`) AND nonce_sha256 IN (` + Placeholders(len(hashes)) + `) GROUP BY tenant) c ON c.tenant = t.tenant
		SET t.head_id = IF(t.queued = c.n, NULL, t.head_id), t.head_at = IF(t.queued = c.n, NULL, t.head_at),
			t.queued = t.queued - c.n`,
		append(int64Args(ids), hashes...)
}

// Claimed is what a claim got.
type Claimed struct {
	// Got holds, for each job of the claim, whether it was claimed.
	Got map[int64]bool
	// Payloads are what the dispatch of each job claimed needs besides what the claim read.
	Payloads map[int64]Payload
	// Behind are the tenants of the jobs claimed that still have queued work: the claim left
	// their heads where they were (migration 0018), for AdvanceHeads to set forward.
	Behind []string
}

// ClaimJobs runs the claim's UPDATE of p.Jobs (each fenced on its id, version and the queued
// state, so a job canceled or taken since it was read is skipped), reads back which of them carry
// this claim's nonces, with their payloads and whether their tenants still have queued work, and
// commits, in one round trip of tx. The read sees the transaction's own UPDATE, so a job canceled
// or taken meanwhile is not counted as claimed. The lock order of every transaction that moves
// jobs into or out of queued (lockorder.go) comes first: the job rows by id, then their tenants'
// rows by key. A claim of several jobs a tenant then subtracts the jobs it moved from their
// tenants' queue counts in one statement (claimCountSQL), which the update trigger leaves to it
// (migration 0025); the trigger counts those of any other claim, a job at a time.
//
// The payloads come back before the COMMIT, so the claim lock is held while they are sent: a round
// trip less per claim than reading them after it, for the time the server takes to write them to
// the socket: for payloads of the usual size, short beside a round trip (max_payload_bytes, 256
// KiB by default, bounds each).
func (s *Store) ClaimJobs(ctx context.Context, tx *ConnTx, p ClaimParams) (Claimed, error) {
	return s.claimJobs(ctx, tx, p, true)
}

// OpenClaim is ClaimJobs without the audit rows and the COMMIT: the transaction stays open, its
// claim lock held, until CommitClaim (or the ConnTx's Close, which rolls it back). A claim that
// counted another transaction's jobs out of flight (the outcomes written beside it) commits only
// once that one has.
func (s *Store) OpenClaim(ctx context.Context, tx *ConnTx, p ClaimParams) (Claimed, error) {
	return s.claimJobs(ctx, tx, p, false)
}

// CommitClaim writes the audit rows of the claim OpenClaim left open and commits, in one round
// trip. The rows are written now, not with the UPDATE, so that a transition committed before this
// COMMIT (an outcome that freed what the claim took) is first in the trail's order (at, id) too.
func (s *Store) CommitClaim(ctx context.Context, tx *ConnTx, p ClaimParams) error {
	var stmts []string
	var args []any
	if !s.AuditOff {
		q, qargs := claimAuditSQL(p)
		stmts, args = []string{q}, qargs
	}
	if _, err := tx.ExecCommit(ctx, stmts, args...); err != nil {
		return fmt.Errorf("commit the claim of %d job(s): %w", len(p.Jobs), err)
	}
	return nil
}

// claimAuditSQL is the statement of a claim's audit rows (a transition each, SPEC §10), for the
// jobs that carry this claim's nonces: a job taken meanwhile gets none.
func claimAuditSQL(p ClaimParams) (string, []any) {
	ids := make([]int64, len(p.Jobs))
	hashes := make([]any, len(p.Jobs))
	from := make(map[int64]job.Status, len(p.Jobs))
	for i, c := range p.Jobs {
		ids[i], hashes[i], from[c.ID] = c.ID, c.NonceSHA256, job.Queued
	}
	return auditTransitionsSQL(p.DrainerID, ids, from, false, "nonce_sha256 IN ("+Placeholders(len(hashes))+")", hashes...)
}

// claimJobs is ClaimJobs, or with commit false OpenClaim.
func (s *Store) claimJobs(ctx context.Context, tx *ConnTx, p ClaimParams, commit bool) (Claimed, error) {
	p.Stamp = p.Stamp.Truncate(time.Microsecond)
	q, uargs := claimUpdateSQL(p)
	ids := make([]int64, len(p.Jobs))
	want := map[int64]string{}
	tenantOf := make(map[int64]string, len(p.Jobs))
	tenants := make([]string, len(p.Jobs))
	hashes := make([]any, len(p.Jobs))
	for i, c := range p.Jobs {
		ids[i] = c.ID
		want[c.ID] = string(c.NonceSHA256)
		tenants[i] = c.Tenant
		tenantOf[c.ID] = c.Tenant
		hashes[i] = c.NonceSHA256
	}
	lockTenants, tenantArgs := lockTenantRowsSQL(tenants)
	stmts := []string{"SELECT id FROM jobs WHERE id IN (" + Placeholders(len(ids)) + ") ORDER BY id FOR UPDATE", lockTenants}
	args := append(int64Args(ids), tenantArgs...)
	if len(p.Jobs) >= claimCountPerTenant*len(tenantArgs) {
		count, countArgs := claimCountSQL(ids, hashes)
		stmts = append(stmts, claimStampSQL, q, claimStampSQL, count)
		args = append(append(append(append(args, p.Stamp), uargs...), nil), countArgs...)
	} else {
		stmts = append(stmts, claimStampSQL, q)
		args = append(append(args, nil), uargs...)
	}
	if !s.AuditOff && commit {
		aq, aargs := claimAuditSQL(p)
		stmts = append(stmts, aq)
		args = append(args, aargs...)
	}
	stmts = append(stmts, `SELECT j.id, j.nonce_sha256, t.head_id IS NOT NULL, j.payload, j.attempt, j.dispatch_failures
		FROM jobs j JOIN tenants t ON t.tenant = j.tenant WHERE j.id IN (`+Placeholders(len(ids))+")")
	args = append(args, int64Args(ids)...)
	run := tx.Query
	if commit {
		run = tx.QueryCommit
	}
	res, err := run(ctx, stmts, args...)
	if err != nil {
		return Claimed{}, fmt.Errorf("claim %d job(s): %w", len(p.Jobs), err)
	}
	defer res.Close()
	out := Claimed{Got: map[int64]bool{}, Payloads: map[int64]Payload{}}
	if _, err := res.Next(); err != nil { // the job rows' lock
		return Claimed{}, fmt.Errorf("claim %d job(s): %w", len(p.Jobs), err)
	}
	rows, err := res.Next()
	if err != nil {
		return Claimed{}, fmt.Errorf("claim %d job(s): %w", len(p.Jobs), err)
	}
	behind := map[string]bool{}
	for rows.Next() {
		var pl Payload
		var hash []byte
		var queued bool
		if err := rows.Scan(&pl.ID, &hash, &queued, &pl.Payload, &pl.Attempt, &pl.DispatchFailures); err != nil {
			return Claimed{}, fmt.Errorf("claim %d job(s): read back: %w", len(p.Jobs), err)
		}
		id := pl.ID
		out.Got[id] = string(hash) == want[id]
		if !out.Got[id] {
			continue
		}
		out.Payloads[id] = pl
		if t := tenantOf[id]; queued && !behind[t] {
			behind[t] = true
			out.Behind = append(out.Behind, t)
		}
	}
	if err := res.Close(); err != nil {
		return Claimed{}, fmt.Errorf("claim %d job(s): %w", len(p.Jobs), err)
	}
	return out, nil
}

// Payload is what a dispatch needs of a claimed job besides what the claim chose it by.
type Payload struct {
	ID               int64
	Payload          []byte
	Attempt          int
	DispatchFailures int
}
