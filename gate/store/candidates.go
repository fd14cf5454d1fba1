package store

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/sqldb"
)

// The reads a claim pass makes before its transaction to choose its candidates: the pages of
// tenants with work, and the tenants' queue heads (the lone-job probe is in lone.go). None locks
// anything.

// TenantPageParams select the page of tenants with work that a claim pass reads next, from the
// tenants' queue state (migration 0010): one index of tenants, for a number of rows bounded by
// Limit, whatever the number of tenants with work or their backlogs.
type TenantPageParams struct {
	// ByName walks work_tenant by name (round_robin): the names after After, up to UpTo
	// (included) when Wrapped. Else the head index, every tenant's oldest queued job, oldest
	// first (fair, fifo): from the start when FromStart, else after (HeadAt, HeadID).
	ByName    bool
	After     string
	Wrapped   bool
	UpTo      string
	FromStart bool
	HeadAt    time.Time
	HeadID    int64
	Limit     int
	// DueOnly leaves out the tenants whose oldest queued job (their head) is queued after the
	// database's now: scheduled for later (run_at, delay_seconds). On the head index (fair, fifo)
	// the range ends there, so tenants with only such jobs cost a pass nothing however many they
	// are; by name (round_robin) the walk filters them, reading past them. A head is a lower
	// bound, so nothing due is left out.
	DueOnly bool
	// WithInFlight also counts the jobs in flight, in the same statement: a pass's first read.
	// Config gives their tenants' tiers.
	WithInFlight bool
	Config       config.Config
}

// TenantHead is a tenant with work and its place in the index read.
type TenantHead struct {
	Tenant string
	HeadAt sql.NullTime
	HeadID sql.NullInt64
	// Interactive: the tenant has interactive queued jobs, which go before its others (read
	// them with HeadsWant.Interactive).
	Interactive bool
	// Prioritized: the tenant has jobs of another priority than the default in job_priorities
	// (migration 0022; some may have left the queue since), read them with
	// HeadsWant.Prioritized.
	Prioritized bool
	// Only is the tenant's one queued job when it has exactly one and its head is that job
	// (not left behind by a claim): all a heads read would find, eligible or not. Else nil.
	Only *QueuedJob
}

// TenantPage is what ReadTenantPage read.
type TenantPage struct {
	Tenants []TenantHead
	Usage   config.Usage // WithInFlight: the jobs in flight and live slots by capacity class
	// Running, WithInFlight under ordering fair_time, is how long each tenant's jobs in flight
	// have run so far, in seconds, summed (since their start, else their dispatch).
	Running map[string]float64
}

// dueNow is the latest queued_at of a job due now: the database's clock, which every admission
// dates its jobs by, so that a job committed before a read is never later than it whatever the
// reader's own clock (a test's fake one, a drainer's synced one) says. Only a scheduled job is
// queued after it.
const dueNow = "UTC_TIMESTAMP(6)"

// tenantsSQL is the read of p's page of tenants with work, as rows (tenant, NULL, head_at,
// head_id, has interactive queued jobs, NULL, has rows in job_priorities, and the tenant's only queued job's id, rate key,
// queued_at, version, lanes, interactive, not_before, or NULLs) (ReadTenantPage adds the jobs in
// flight as rows (tenant, 1, NULL, NULL, interactive, lanes, NULLs)). Whether it has jobs of
// another priority than the default is one dive into the small job_priorities table, made only
// when that table has a row at all: an uncorrelated sub-select, evaluated once a statement, so
// that a queue that uses no priority pays one dive a page, not one a tenant, which would slow
// the drain measurably. fair and fifo walk the head index (every tenant's oldest queued job,
// oldest first); round_robin walks work_tenant by name from the tenant served last to the end,
// then from the first name up to it. Whether a
// tenant has interactive queued jobs is one dive into the interactive_queue index per tenant
// read (migration 0014). A tenant with one queued job whose head is that job (a head is a lower
// bound: if its job is still queued, it is the oldest) gets the job's row by its primary key:
// with many tenants of one job each, that row is all a heads read would find, and the heads
// read (a sub-select per tenant) is left out for it (TenantHead.Only).
func tenantsSQL(p TenantPageParams) (string, []any) {
	n := p.Limit
	const cols = `SELECT tenants.tenant, NULL, head_at, head_id,
		EXISTS (SELECT 1 FROM jobs FORCE INDEX (interactive_queue) WHERE interactive_tenant = tenants.tenant), NULL,
		IF((SELECT EXISTS (SELECT 1 FROM job_priorities)),
			EXISTS (SELECT 1 FROM job_priorities FORCE INDEX (tenant_order) WHERE job_priorities.tenant = tenants.tenant), FALSE),
		j.id, j.rate_key_sha256, j.queued_at, j.version, j.lanes, j.interactive, j.not_before FROM tenants`
	const only = ` LEFT JOIN jobs j ON j.id = tenants.head_id AND tenants.queued = 1 AND j.status = 'queued'`
	// On the head index the bound ends the range; by name it filters the rows walked.
	due := ""
	if p.DueOnly {
		due = " AND head_at <= " + dueNow
	}
	if p.ByName {
		if p.Wrapped {
			return "(" + cols + " FORCE INDEX (work_tenant)" + only + " WHERE work_tenant > ? AND work_tenant <= ?" + due + " ORDER BY work_tenant LIMIT ?)",
				[]any{p.After, p.UpTo, n}
		}
		return "(" + cols + " FORCE INDEX (work_tenant)" + only + " WHERE work_tenant > ?" + due + " ORDER BY work_tenant LIMIT ?)",
			[]any{p.After, n}
	}
	if p.FromStart {
		return "(" + cols + " FORCE INDEX (head)" + only + " WHERE head_at IS NOT NULL" + due + " ORDER BY head_at, head_id LIMIT ?)",
			[]any{n}
	}
	// A row constructor comparison is not a range MariaDB seeks to, so the keyset is spelt out.
	return "(" + cols + " FORCE INDEX (head)" + only + ` WHERE head_at IS NOT NULL AND (head_at > ? OR (head_at = ? AND head_id > ?))` + due + `
		ORDER BY head_at, head_id LIMIT ?)`, []any{p.HeadAt, p.HeadAt, p.HeadID, n}
}

// ReadTenantPage reads p's page of tenants with work, and with p.WithInFlight the jobs in
// flight and the live slots per tenant in the same round trip. The in-flight count reads the
// claim index over the in-flight states only, and the slots' the live range of their index, so
// it is bounded by the global cap.
func ReadTenantPage(ctx context.Context, db sqldb.DB, p TenantPageParams) (TenantPage, error) {
	q, args := tenantsSQL(p)
	what := "read tenants with queued jobs"
	if p.WithInFlight {
		// One row per job in flight and per live slot (see inFlightUsageSQL: no GROUP BY, no
		// temporary table).
		const none = `NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL `
		// Under fair_time a job in flight also gives how long it has been running, in the
		// head_id column (its time is charged only at its outcome: TenantPage.Running).
		running := "NULL"
		if p.Config.Ordering == config.FairTime {
			running = "GREATEST(TIMESTAMPDIFF(MICROSECOND, COALESCE(started_at, dispatched_at), UTC_TIMESTAMP(6)), 0)"
		}
		q += ` UNION ALL SELECT tenant, 1, NULL, ` + running + `, interactive, lanes, ` + none + inFlightJobs +
			` UNION ALL SELECT tenant, 1, NULL, NULL, interactive, lanes, ` + none + liveSlots
		what = "read in-flight counts and tenants with queued jobs"
	}
	page, err := readTenants(ctx, db, q, args, p.Config)
	if err != nil {
		return page, fmt.Errorf("%s: %w", what, err)
	}
	return page, nil
}

// readTenants runs q, whose rows are tenants with work (tenant, NULL, head_at, head_id,
// interactive, NULL, prioritized, the only queued job's columns) and, WithInFlight, the jobs in flight and
// live slots (tenant, 1, NULL, NULL, interactive, lanes, NULLs), and counts the latter in the
// page's Usage with cfg's tiers.
func readTenants(ctx context.Context, db sqldb.DB, q string, args []any, cfg config.Config) (TenantPage, error) {
	page := TenantPage{Usage: config.NewUsage()}
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return page, err
	}
	defer rows.Close()
	for rows.Next() {
		var r TenantHead
		var n, onlyID, onlyVersion sql.NullInt64
		var lanes, onlyKey, onlyLanes sql.NullString
		var onlyAt, onlyNotBefore sql.NullTime
		var onlyInteractive sql.NullBool
		var prioritized sql.NullBool
		if err := rows.Scan(&r.Tenant, &n, &r.HeadAt, &r.HeadID, &r.Interactive, &lanes, &prioritized,
			&onlyID, &onlyKey, &onlyAt, &onlyVersion, &onlyLanes, &onlyInteractive, &onlyNotBefore); err != nil {
			return page, err
		}
		if !n.Valid {
			r.Prioritized = prioritized.Bool
			if onlyID.Valid {
				j := &QueuedJob{Head: Head{ID: onlyID.Int64, Tenant: r.Tenant, RateKey: onlyKey, QueuedAt: onlyAt.Time,
					Version: onlyVersion.Int64, Interactive: onlyInteractive.Bool}, NotBefore: onlyNotBefore}
				if onlyLanes.String != "" {
					j.Lanes = SplitLanes(onlyLanes.String)
				}
				r.Only = j
			}
			page.Tenants = append(page.Tenants, r)
			continue
		}
		addUnit(&page.Usage, cfg, config.Unit{Tenant: r.Tenant, Interactive: r.Interactive}, lanes.String, int(n.Int64))
		if r.HeadID.Valid {
			if page.Running == nil {
				page.Running = map[string]float64{}
			}
			page.Running[r.Tenant] += float64(r.HeadID.Int64) / 1e6
		}
	}
	return page, rows.Err()
}

// HeadsWant is how many heads to read of one tenant.
type HeadsWant struct {
	Tenant string
	N      int
	// Interactive also reads the tenant's interactive queued jobs (at most N), which go first.
	Interactive bool
	// Prioritized also reads the tenant's queued jobs of another priority than the default (at
	// most N, highest first), from job_priorities.
	Prioritized bool
}

// HeadsParams ask for the oldest eligible queued jobs of some tenants.
type HeadsParams struct {
	// Now is the pass's time: a job whose not_before is after it is not eligible.
	Now time.Time
	// AgedBefore: a job queued before it goes as if at job.MaxPriority (priority_aging_seconds
	// before Now). Zero: no job is aged.
	AgedBefore time.Time
	// Tenants are the tenants read, each with the most heads to read.
	Tenants []HeadsWant
	// Excluded are rate keys whose jobs are left out (keys found gated earlier in the pass).
	Excluded []string
	// Cut, if not nil, is filled in with the tenants whose heads ReadHeads cut short (see there):
	// more queued jobs exist beyond them, however few they are.
	Cut map[string]bool
}

// maxStatementBytes bounds the text of one heads statement: a pass's reads stay far below the
// server's packet limit (SPEC §14: no statement of a pass exceeds 64 KiB) whatever the number of
// tenants read and of gated keys excluded, by splitting the read into several statements.
const maxStatementBytes = 48 << 10

// The sub-selects of a heads read, named in each row so that the merge knows where it came from.
const (
	fromQueue       = 0 // the claim index, in queue order
	fromInteractive = 1 // the interactive_queue index
	fromPriorities  = 2 // job_priorities, highest priority first
)

// ReadHeads returns, for each tenant of p, its first eligible queued jobs (at most its N) in the
// order the claim takes them (Head.before): interactive first, then by priority, highest first
// (a job queued before p.AgedBefore as if at the top), then by age. It leaves out the jobs of the
// rate keys in p.Excluded. One sub-select per tenant reads its queue in age order from the claim
// index; they are joined by UNION ALL into statements of at most 48 KiB. For a tenant read with
// Interactive, a second sub-select reads its oldest eligible interactive jobs (at most N) from
// the interactive_queue index, and for one read with Prioritized a third its first N jobs of
// another priority than the default from job_priorities (migration 0022).
//
// The merge is exact as far as it goes. The interactive and prioritized reads add only jobs that
// go before those the age-ordered read would have found had it been longer, but one exception:
// a job of a priority below the default goes after every default job of its tenant, also those
// newer than the last one the age-ordered read returned. When that read returned N jobs (more may
// follow), such jobs (not aged, not interactive) are dropped from the heads and the tenant is
// marked in p.Cut, unless they are all that is left, in which case they go (so that a tenant's
// low-priority backlog never stalls behind default jobs that a read of N cannot reach). Otherwise
// whether more exist beyond the heads is still whether they number at least N.
func ReadHeads(ctx context.Context, db sqldb.DB, p HeadsParams) (map[string][]Head, error) {
	out := map[string][]Head{}
	fromQueueN := map[string]int{}
	exclude := ""
	if len(p.Excluded) > 0 {
		exclude = " AND (rate_key_sha256 IS NULL OR rate_key_sha256 NOT IN (" + Placeholders(len(p.Excluded)) + "))"
	}
	var q strings.Builder
	var args []any
	flush := func() error {
		if q.Len() == 0 {
			return nil
		}
		err := readHeads(ctx, db, q.String(), args, out, fromQueueN)
		q.Reset()
		args = args[:0]
		return err
	}
	for _, w := range p.Tenants {
		// The claim index is forced and walked in (queued_at, id) order, stopping after LIMIT
		// rows: without the hint MariaDB may pick tenant_id and sort the whole backlog, and
		// naming the equality columns in ORDER BY (status is an ENUM) also makes it sort.
		// The queued_at bound ends the range before the jobs scheduled for later (a scheduled job
		// is queued at its run_at), however many there are: the read stays bounded by N.
		sub := `(SELECT id, tenant, rate_key_sha256, queued_at, version, lanes, interactive, priority, 0 FROM jobs FORCE INDEX (claim)
			WHERE status = 'queued' AND tenant = ? AND queued_at <= ` + dueNow + ` AND (not_before IS NULL OR not_before <= ?)
			AND (start_by IS NULL OR start_by > ?)` + exclude + `
			ORDER BY queued_at, id LIMIT ?)`
		subs := 1 // the sub-selects of w: its queue, its interactive jobs and its prioritized ones
		if w.Interactive {
			sub += ` UNION ALL (SELECT id, tenant, rate_key_sha256, queued_at, version, lanes, interactive, priority, 1
				FROM jobs FORCE INDEX (interactive_queue)
				WHERE interactive_tenant = ? AND queued_at <= ` + dueNow + ` AND (not_before IS NULL OR not_before <= ?)
				AND (start_by IS NULL OR start_by > ?)` + exclude + `
				ORDER BY queued_at, id LIMIT ?)`
			subs++
		}
		if w.Prioritized {
			// job_priorities first, in its index's order; each row's job by its primary key. Rows
			// whose jobs have left the queue are passed over (the drainers' upkeep deletes them).
			sub += ` UNION ALL (SELECT STRAIGHT_JOIN j.id, j.tenant, j.rate_key_sha256, j.queued_at, j.version, j.lanes,
				j.interactive, j.priority, 2 FROM job_priorities p FORCE INDEX (tenant_order) JOIN jobs j ON j.id = p.job_id
				WHERE p.tenant = ? AND j.status = 'queued' AND j.queued_at <= ` + dueNow + `
				AND (j.not_before IS NULL OR j.not_before <= ?) AND (j.start_by IS NULL OR j.start_by > ?)` + exclude + `
				ORDER BY p.priority DESC, p.queued_at, p.job_id LIMIT ?)`
			subs++
		}
		if q.Len() > 0 && q.Len()+len(sub)+len(" UNION ALL ") > maxStatementBytes {
			if err := flush(); err != nil {
				return nil, err
			}
		}
		if q.Len() > 0 {
			q.WriteString(" UNION ALL ")
		}
		q.WriteString(sub)
		for range subs {
			args = append(args, w.Tenant, p.Now, p.Now)
			for _, k := range p.Excluded {
				args = append(args, k)
			}
			args = append(args, w.N)
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	for _, w := range p.Tenants {
		hs := out[w.Tenant]
		if len(hs) == 0 {
			continue
		}
		sort.Slice(hs, func(i, j int) bool { return hs[i].Before(hs[j], p.AgedBefore) })
		// A job read by two sub-selects is kept once: sorted, the copies are next to each other.
		hs = slices.CompactFunc(hs, func(a, b Head) bool { return a.ID == b.ID })
		if w.Prioritized && fromQueueN[w.Tenant] >= w.N {
			kept := slices.DeleteFunc(slices.Clone(hs), func(h Head) bool { return h.belowDefault(p.AgedBefore) })
			if len(kept) > 0 && len(kept) < len(hs) {
				hs = kept
				if p.Cut != nil {
					p.Cut[w.Tenant] = true
				}
			}
		}
		out[w.Tenant] = hs
	}
	return out, nil
}

// readHeads runs one statement of ReadHeads and adds its rows to out, counting in fromQueueN
// each tenant's rows of the age-ordered read.
func readHeads(ctx context.Context, db sqldb.DB, q string, args []any, out map[string][]Head, fromQueueN map[string]int) error {
	hr, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("read queue heads: %w", err)
	}
	defer hr.Close()
	for hr.Next() {
		var h Head
		var lanes string
		var from int
		if err := hr.Scan(&h.ID, &h.Tenant, &h.RateKey, &h.QueuedAt, &h.Version, &lanes, &h.Interactive, &h.Priority, &from); err != nil {
			return fmt.Errorf("read queue heads: %w", err)
		}
		if from == fromQueue {
			fromQueueN[h.Tenant]++
		}
		if lanes != "" {
			h.Lanes = SplitLanes(lanes)
		}
		out[h.Tenant] = append(out[h.Tenant], h)
	}
	if err := hr.Err(); err != nil {
		return fmt.Errorf("read queue heads: %w", err)
	}
	return nil
}
