package gate

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gate/limits"
	"github.com/sluicehq/sluice/gate/store"
)

// lockSQL is the statement that takes the row lock of n tenants, given in sorted order so that
// two batches lock in the same order and cannot deadlock. Locking a tenant serialises that
// tenant's admissions, which makes its depth cap and idempotent replay exact; other tenants are
// not blocked.
func lockSQL(n int) string {
	return "INSERT INTO tenants (tenant, created_at) VALUES " +
		strings.TrimSuffix(strings.Repeat("(?, UTC_TIMESTAMP(6)),", n), ",") +
		" ON DUPLICATE KEY UPDATE tenant = tenant"
}

const inFlightStates = "('claimed','dispatched','running')"

// read begins the transaction, locks the items' tenants and reads the database clock, the
// depths, in-flight counts, idempotency keys and redrives the decisions need, all in one round
// trip. Each read is its own statement after the lock: a statement that both locked and read
// would take its snapshot before it waited for the lock and miss what the previous holder
// committed (a racing duplicate key, a depth one short). Folding the reads into the lock as
// INSERT ... ON DUPLICATE KEY UPDATE ... RETURNING (subqueries) was tried and fails that way:
// the idempotency-key lookup, a unique-key lookup of constants, is read while the statement is
// optimised, before the lock wait, and TestFrontDoorIdempotency's 50 racers then hit a
// duplicate key. Under READ COMMITTED each later statement of the round trip reads after the
// lock is held.
func (a *Admitter) read(ctx context.Context, tx txConn, items []*item, cfg limits.Config, shared bool, started time.Time) (*state, error) {
	q := a.readQuery(items, cfg, shared, started)
	res, err := tx.query(ctx, q.stmts, q.args)
	if err != nil {
		return nil, fmt.Errorf("read admission state: %w", err)
	}
	defer res.Close()
	st := newState()
	if err := q.scanDepths(res, st); err != nil {
		return nil, err
	}
	if q.countGlobal {
		a.depth.counted(started, st.globalDepth)
	}
	st.now = st.now.UTC()
	if q.keys {
		err := res.EachRow(func(r store.Row) {
			st.keyed[keyOf(r.Tenant, *r.IdempotencyKey)] = &r
		})
		if err != nil {
			return nil, fmt.Errorf("read idempotency keys: %w", err)
		}
	}
	if q.redrives {
		err := res.EachRow(func(r store.Row) { st.redriven[*r.RetryOf] = &r })
		if err != nil {
			return nil, fmt.Errorf("read redrives: %w", err)
		}
	}
	return st, res.Close()
}

// stateQuery is the round trip read sends, and how to read its results.
type stateQuery struct {
	stmts       []string
	args        []any
	tenants     []string // sorted
	countGlobal bool     // the global depth is counted, not estimated
	keys        bool     // a result set of idempotency-key rows follows the depths
	redrives    bool     // a result set of redriven rows follows
}

// readQuery builds read's statements: the lock, then the depths and counts (for one tenant, one
// scan of its index range; for several, a grouped count), then the idempotency keys and the
// redrives asked for, if any. started dates a global depth count (see depthEstimate).
func (a *Admitter) readQuery(items []*item, cfg limits.Config, shared bool, started time.Time) stateQuery {
	seen := map[string]bool{}
	var q stateQuery
	for _, it := range items {
		if !seen[it.req.Tenant] {
			seen[it.req.Tenant] = true
			q.tenants = append(q.tenants, it.req.Tenant)
		}
	}
	sort.Strings(q.tenants)
	tenantArgs := make([]any, len(q.tenants))
	for i, t := range q.tenants {
		tenantArgs[i] = t
	}
	q.stmts = []string{lockSQL(len(q.tenants))}
	q.args = append([]any(nil), tenantArgs...)
	if shared {
		// A group takes its tenants' locks without waiting (see errGroupLocked). SET STATEMENT
		// is MariaDB's; a server that does not know it fails the statement, and the group falls
		// apart the same way (lockBusy).
		q.stmts[0] = "SET STATEMENT innodb_lock_wait_timeout = 0 FOR " + q.stmts[0]
	}

	// The global depth is counted exactly near the cap and for queue=false (whose Retry-After
	// depends on it, as on the global in-flight count); far below the cap a recent count plus
	// this process's admissions since stands in for it, because counting up to 2,000 index
	// entries is most of an admission's cost (see depthEstimate).
	immediate := false
	for _, it := range items {
		immediate = immediate || (it.req.Queue != nil && !*it.req.Queue)
	}
	est, fresh := a.depth.estimate(started, a.cfg.GlobalDepthRefresh)
	q.countGlobal = immediate || !fresh || est+len(items)+depthMargin(cfg.GlobalQueueDepth) >= cfg.GlobalQueueDepth
	globalSQL, globalArg := "(SELECT ?)", any(int64(est))
	if q.countGlobal {
		globalSQL = "(SELECT COUNT(*) FROM (SELECT 1 FROM jobs WHERE status = 'queued' LIMIT ?) g)"
		globalArg = int64(cfg.GlobalQueueDepth + 1)
	}
	inFlightSQL := "(SELECT 0)"
	if immediate {
		inFlightSQL = "(SELECT COUNT(*) FROM jobs WHERE status IN " + inFlightStates + ")"
	}
	if len(q.tenants) == 1 {
		// One scan of the tenant's (tenant, status) index range gives both its depth and its
		// in-flight count.
		q.stmts = append(q.stmts, `SELECT UTC_TIMESTAMP(6),
			COALESCE(SUM(status = 'queued'), 0), COALESCE(SUM(status <> 'queued'), 0),
			`+globalSQL+`, `+inFlightSQL+`
			FROM jobs WHERE tenant = ? AND status IN ('queued','claimed','dispatched','running')`)
		q.args = append(q.args, globalArg, q.tenants[0])
	} else {
		q.stmts = append(q.stmts, `SELECT UTC_TIMESTAMP(6), `+globalSQL+`, `+inFlightSQL,
			`SELECT tenant, status = 'queued', COUNT(*) FROM jobs
			WHERE status IN ('queued','claimed','dispatched','running') AND tenant IN (`+store.Placeholders(len(q.tenants))+`)
			GROUP BY tenant, status = 'queued'`)
		q.args = append(q.args, globalArg)
		q.args = append(q.args, tenantArgs...)
	}
	var keys, redrives []any
	for _, it := range items {
		if it.req.IdempotencyKey != nil {
			keys = append(keys, *it.req.IdempotencyKey)
		}
		if it.retryOf != nil {
			redrives = append(redrives, *it.retryOf)
		}
	}
	if q.keys = len(keys) > 0; q.keys {
		q.stmts = append(q.stmts, "SELECT "+store.Columns+" FROM jobs WHERE tenant IN ("+
			store.Placeholders(len(q.tenants))+") AND idempotency_key IN ("+store.Placeholders(len(keys))+")")
		q.args = append(append(q.args, tenantArgs...), keys...)
	}
	if q.redrives = len(redrives) > 0; q.redrives {
		// The job an earlier redrive of the same job created: the first, if several.
		q.stmts = append(q.stmts, "SELECT "+store.Columns+" FROM jobs WHERE id IN (SELECT MIN(id) FROM jobs WHERE retry_of IN ("+
			store.Placeholders(len(redrives))+") GROUP BY retry_of)")
		q.args = append(q.args, redrives...)
	}
	return q
}

// scanDepths reads the database time, the depths and the in-flight counts into st.
func (q stateQuery) scanDepths(res *store.Results, st *state) error {
	if len(q.tenants) == 1 {
		var depth, inFlight int
		if err := res.ScanOne(&st.now, &depth, &inFlight, &st.globalDepth, &st.globalInFlight); err != nil {
			return fmt.Errorf("read admission state: %w", err)
		}
		st.tenantDepth[q.tenants[0]], st.tenantInFlight[q.tenants[0]] = depth, inFlight
		return nil
	}
	if err := res.ScanOne(&st.now, &st.globalDepth, &st.globalInFlight); err != nil {
		return fmt.Errorf("read admission state: %w", err)
	}
	rows, err := res.Next()
	if err != nil {
		return fmt.Errorf("read tenant depths: %w", err)
	}
	for rows.Next() {
		var t string
		var queued bool
		var n int
		if err := rows.Scan(&t, &queued, &n); err != nil {
			return fmt.Errorf("read tenant depths: %w", err)
		}
		if queued {
			st.tenantDepth[t] = n
		} else {
			st.tenantInFlight[t] = n
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read tenant depths: %w", err)
	}
	return nil
}
