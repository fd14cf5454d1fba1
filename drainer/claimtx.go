package drainer

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/limits"
	"github.com/sluicehq/sluice/gate/store"
)

// candidate is a queued job that a pass may claim.
type candidate struct {
	id       int64
	tenant   string
	rateKey  sql.NullString
	queuedAt time.Time
	version  int64
}

func (c candidate) before(o candidate) bool {
	if !c.queuedAt.Equal(o.queuedAt) {
		return c.queuedAt.Before(o.queuedAt)
	}
	return c.id < o.id
}

// claimed is a job this pass moved to dispatched, with what the dispatch needs.
type claimed struct {
	row    store.Row
	nonce  string
	wall   time.Duration
	budget int // the dispatch budget in force at the claim
}

// inFlightPerTenant counts the jobs in flight of each tenant with any.
const inFlightPerTenant = `SELECT tenant, COUNT(*) FROM jobs WHERE status IN ('claimed','dispatched','running') GROUP BY tenant`

// scanInFlight reads the rows of inFlightPerTenant. The count reads the claim index over the
// in-flight states only, so its cost is bounded by the global cap, not by any backlog.
func scanInFlight(rows *sql.Rows) (map[string]int, int, error) {
	out := map[string]int{}
	total := 0
	for rows.Next() {
		var t string
		var n int
		if err := rows.Scan(&t, &n); err != nil {
			return nil, 0, fmt.Errorf("count in-flight jobs: %w", err)
		}
		out[t] = n
		total += n
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("count in-flight jobs: %w", err)
	}
	return out, total, nil
}

// lockClaimsSQL takes the claim lock and reads the runtime configuration in force.
const lockClaimsSQL = `SELECT (SELECT config FROM config_versions ORDER BY version DESC LIMIT 1)
	FROM claim_lock WHERE id = 1 FOR UPDATE`

func decodeClaimConfig(raw sql.NullString) (limits.Config, error) {
	if !raw.Valid {
		return limits.Default(), nil
	}
	return limits.Decode([]byte(raw.String))
}

// lockAndCount takes the claim lock of tx, reading the runtime configuration in force, and
// counts the jobs in flight per tenant, in the transaction's first round trip.
func lockAndCount(ctx context.Context, tx *store.ConnTx) (cfg limits.Config, inFlight map[string]int, total int, err error) {
	cfg, inFlight, total, _, err = lockCountAndProbe(ctx, tx, false)
	return cfg, inFlight, total, err
}

// lockCountAndProbe is lockAndCount, and with probe the lone-job probe (loneProbeSQL) in the same
// round trip, read under the claim lock.
func lockCountAndProbe(ctx context.Context, tx *store.ConnTx, probe bool) (cfg limits.Config, inFlight map[string]int, total int, found []loneJob, err error) {
	stmts := []string{lockClaimsSQL, inFlightPerTenant}
	if probe {
		stmts = append(stmts, loneProbeSQL)
	}
	res, err := tx.Query(ctx, stmts)
	if err != nil {
		return cfg, nil, 0, nil, fmt.Errorf("take claim lock: %w", err)
	}
	defer res.Close()
	var raw sql.NullString
	if err := res.ScanOne(&raw); err != nil {
		return cfg, nil, 0, nil, fmt.Errorf("take claim lock: %w", err)
	}
	if cfg, err = decodeClaimConfig(raw); err != nil {
		return cfg, nil, 0, nil, err
	}
	rows, err := res.Next()
	if err != nil {
		return cfg, nil, 0, nil, fmt.Errorf("count in-flight jobs: %w", err)
	}
	if inFlight, total, err = scanInFlight(rows); err != nil {
		return cfg, nil, 0, nil, err
	}
	if probe {
		if rows, err = res.Next(); err != nil {
			return cfg, nil, 0, nil, fmt.Errorf("read the queue's head: %w", err)
		}
		if found, err = scanLone(rows); err != nil {
			return cfg, nil, 0, nil, err
		}
	}
	return cfg, inFlight, total, found, res.Close()
}

// claimUpdate is a claim's UPDATE, with the nonces it gives the chosen jobs and the claim and
// dispatch time it records.
type claimUpdate struct {
	query  string
	args   []any
	nonces []string
	stamp  time.Time
}

func (cl *claimer) claimUpdate(now time.Time, cfg limits.Config, chosen []candidate) (claimUpdate, error) {
	nonces := make([]string, len(chosen))
	var cases, fence strings.Builder
	args := make([]any, 0, 16+4*len(chosen))
	var started any
	if cl.cfg.UnconfirmedStarts {
		started = now
	}
	// A pass's clock reading may predate the admission of a job it found (the job committed
	// while the pass was reading candidates), so the recorded claim and dispatch times are never
	// earlier than the newest admission among the chosen: a dispatch never precedes its
	// admission. Lease and nonce expiry count from the pass's own reading, which only makes them
	// a little shorter.
	stamp := now
	for _, c := range chosen {
		if c.queuedAt.After(stamp) {
			stamp = c.queuedAt
		}
	}
	if started != nil {
		started = stamp
	}
	args = append(args, stamp, stamp, started, now.Add(cfg.Lease()), cl.cfg.ID, now.Add(cfg.NonceTTL()))
	for i, c := range chosen {
		n, err := newNonce()
		if err != nil {
			return claimUpdate{}, err
		}
		nonces[i] = n
		cases.WriteString(" WHEN ? THEN ?")
		args = append(args, c.id, store.HashNonce(n))
	}
	// The fence is a row-constructor IN over (id, version); OR-ed (id = ? AND version = ?)
	// groups cost the optimizer more than the update itself. The leading id IN (...) keeps it on
	// the primary key: MariaDB 10.11 plans a row-constructor IN of a single tuple as a full
	// index scan (a million-row scan per claim with a backlog).
	for _, c := range chosen {
		args = append(args, c.id)
	}
	for i, c := range chosen {
		if i > 0 {
			fence.WriteString(",")
		}
		fence.WriteString("(?,?)")
		args = append(args, c.id, c.version)
	}
	return claimUpdate{query: `UPDATE jobs SET status = 'dispatched', version = version + 1,
		attempt = attempt + 1, claimed_at = ?, dispatched_at = ?, started_at = ?, lease_until = ?,
		drainer_id = ?, nonce_expires_at = ?, not_before = NULL, nonce_sha256 = CASE id` + cases.String() + ` END
		WHERE id IN (` + store.Placeholders(len(chosen)) + `) AND (id, version) IN (` + fence.String() + `) AND status = 'queued'`,
		args: args, nonces: nonces, stamp: stamp}, nil
}

// claimed returns the chosen jobs the UPDATE got (got), as claimed.
func (u claimUpdate) claimed(chosen []candidate, got map[int64]bool, cfg limits.Config) []claimed {
	stamp := u.stamp
	out := make([]claimed, 0, len(chosen))
	for i, c := range chosen {
		if !got[c.id] {
			continue
		}
		r := store.Row{}
		r.ID, r.Tenant, r.Version, r.Status, r.QueuedAt = c.id, c.tenant, c.version+1, job.Dispatched, c.queuedAt
		if c.rateKey.Valid {
			k := c.rateKey.String
			r.RateKeySHA256 = &k
		}
		r.DispatchedAt = &stamp
		out = append(out, claimed{row: r, nonce: u.nonces[i], wall: cfg.Wall(), budget: cfg.DispatchAttempts})
	}
	return out
}

// claimAndCommit runs the claim's UPDATE (claimUpdate), reads back which chosen jobs carry this
// claim's nonces, and commits, in one round trip. The read sees the transaction's own UPDATE,
// so a job canceled or taken meanwhile is not counted as claimed. Payloads are read after the
// commit (loadPayloads): the claim lock is held until COMMIT, and other drainers wait for it.
func (cl *claimer) claimAndCommit(ctx context.Context, tx *store.ConnTx, now time.Time, cfg limits.Config, chosen []candidate) ([]claimed, error) {
	u, err := cl.claimUpdate(now, cfg, chosen)
	if err != nil {
		return nil, err
	}
	ids := make([]int64, len(chosen))
	want := map[int64]string{}
	for i, c := range chosen {
		ids[i] = c.id
		want[c.id] = string(store.HashNonce(u.nonces[i]))
	}
	// A drainer told to stop (its ctx cancelled) while this round trip is under way lets it
	// finish: the driver answers a cancellation by dropping the connection, which would leave
	// the COMMIT's outcome unknown and the jobs, if it happened, to lease recovery. The caller
	// then hands them back (handBackIfStopping).
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimCommitTimeout)
	defer cancel()
	// The lock order of every transaction that moves jobs into or out of queued (gate/store,
	// lockInOrder): the job rows by id, then their tenants' rows by key, which the UPDATE's
	// triggers would otherwise take row by row in its own order.
	tenants := make([]string, len(chosen))
	for i, c := range chosen {
		tenants[i] = c.tenant
	}
	lockTenants, tenantArgs := store.LockTenantsSQL(tenants)
	args := append(int64Args(ids), tenantArgs...)
	aq, aargs := cl.claimAudit(chosen, u)
	args = append(append(append(args, u.args...), aargs...), int64Args(ids)...)
	res, err := tx.QueryCommit(cctx, []string{
		"SELECT id FROM jobs WHERE id IN (" + store.Placeholders(len(ids)) + ") ORDER BY id FOR UPDATE",
		lockTenants, u.query, aq,
		"SELECT id, nonce_sha256 FROM jobs WHERE id IN (" + store.Placeholders(len(ids)) + ")"},
		args...)
	if err != nil {
		return nil, fmt.Errorf("claim %d job(s): %w", len(chosen), err)
	}
	defer res.Close()
	if _, err := res.Next(); err != nil { // the job rows' lock
		return nil, fmt.Errorf("claim %d job(s): %w", len(chosen), err)
	}
	rows, err := res.Next()
	if err != nil {
		return nil, fmt.Errorf("claim %d job(s): %w", len(chosen), err)
	}
	got := map[int64]bool{}
	for rows.Next() {
		var id int64
		var hash []byte
		if err := rows.Scan(&id, &hash); err != nil {
			return nil, fmt.Errorf("claim %d job(s): read back: %w", len(chosen), err)
		}
		got[id] = string(hash) == want[id]
	}
	if err := res.Close(); err != nil {
		return nil, fmt.Errorf("claim %d job(s): %w", len(chosen), err)
	}
	return u.claimed(chosen, got, cfg), nil
}

// claimAudit is the INSERT of the claim's transition rows, for the chosen jobs that carry this
// claim's nonces after its UPDATE: those it moved (a job canceled or taken meanwhile keeps its
// own nonce or none).
func (cl *claimer) claimAudit(chosen []candidate, u claimUpdate) (string, []any) {
	ids := make([]int64, len(chosen))
	from := make(map[int64]job.Status, len(chosen))
	hashes := make([]any, len(chosen))
	for i, c := range chosen {
		ids[i], from[c.id], hashes[i] = c.id, job.Queued, store.HashNonce(u.nonces[i])
	}
	return store.AuditTransitionsSQL(cl.cfg.ID, ids, from, false,
		"nonce_sha256 IN ("+store.Placeholders(len(hashes))+")", hashes...)
}

// loadPayloads reads the payloads and attempt counts of jobs this drainer claimed.
func (cl *claimer) loadPayloads(ctx context.Context, cs []claimed) error {
	ids := make([]int64, len(cs))
	byID := map[int64]int{}
	for i, c := range cs {
		ids[i] = c.row.ID
		byID[c.row.ID] = i
	}
	rows, err := cl.cfg.DB.QueryContext(ctx, "SELECT id, payload, attempt, dispatch_failures FROM jobs WHERE id IN ("+store.Placeholders(len(ids))+")", int64Args(ids)...)
	if err != nil {
		return fmt.Errorf("read claimed payloads: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var payload []byte
		var attempt, failures int
		if err := rows.Scan(&id, &payload, &attempt, &failures); err != nil {
			return fmt.Errorf("read claimed payloads: %w", err)
		}
		r := &cs[byID[id]].row
		r.Payload, r.Attempt, r.DispatchFailures = payload, attempt, failures
	}
	return rows.Err()
}

// newNonce mints the random nonce of one dispatch (SPEC §4, start confirmation).
func newNonce() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("mint nonce: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// claimCommitTimeout bounds the claim's last round trip once it no longer follows the
// drainer's context: its UPDATE may wait for row locks up to innodb_lock_wait_timeout (10 s).
const claimCommitTimeout = 15 * time.Second

// handBackIfStopping hands jobs this pass claimed back to the queue, unsent, when ctx was
// cancelled meanwhile (the drainer is stopping: SPEC §11, claimed jobs not yet sent go back to
// queued), and reports whether it did.
func (cl *claimer) handBackIfStopping(ctx context.Context, now time.Time, cs []claimed) bool {
	if ctx.Err() == nil {
		return false
	}
	cl.releaseUnsent(ctx, now, cs, "the drainer stopped before sending it")
	return true
}

// releaseUnsent returns claimed jobs that were never sent to queued, fenced on the claim, with
// why as their error message. It runs whether or not ctx was cancelled: a stopping drainer is the
// usual reason to call it. If the database refuses, lease recovery takes the jobs later.
func (cl *claimer) releaseUnsent(ctx context.Context, now time.Time, cs []claimed, why string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimCommitTimeout)
	defer cancel()
	items := make([]store.Finishing, len(cs))
	for i, c := range cs {
		items[i] = store.Finishing{Row: c.row, Outcome: store.Outcome{Status: job.Queued,
			ErrorCode: "dispatch_error", ErrorMessage: why}}
	}
	err := inTx(ctx, cl.cfg.DB, func(tx *sql.Tx) error {
		_, err := cl.store.FinishMany(ctx, tx, now, items)
		return err
	})
	for _, c := range cs {
		cl.headCache.invalidate(c.row.Tenant)
	}
	if err != nil {
		cl.cfg.Log.Warn("could not hand back claimed jobs that were never sent; lease recovery will", "jobs", len(cs), "error", err)
	}
}

// inTx runs fn in a transaction of db, and commits it unless fn fails.
func inTx(ctx context.Context, db *sql.DB, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

func int64Args(ids []int64) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}
