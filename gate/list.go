package gate

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// List limits (SPEC §6).
const (
	DefaultListLimit = 50
	MaxListLimit     = 1000
	// MaxListResultBytes bounds the results of one page: a page ends early, with a cursor,
	// before the job whose result would take it past this, so that 1,000 jobs with results of
	// up to max_payload_bytes each never make one answer of hundreds of MiB. The first job of a
	// page is always returned.
	MaxListResultBytes = 8 << 20
	// ListStatementTimeout bounds each statement of a listing on the server (MariaDB's
	// max_statement_time, MySQL's MAX_EXECUTION_TIME): producers can list, and a listing that
	// an index cannot serve must not run on after its caller has given up.
	ListStatementTimeout = 5 * time.Second
)

// ListFilter selects jobs for List.
type ListFilter struct {
	// Tenants restricts the listing to these tenants; nil lists every tenant. A producer's
	// listing is always restricted to its own tenants.
	Tenants []string
	// Status, if set, keeps only jobs in that state.
	Status job.Status
	// Limit is the page size, 1 to MaxListLimit. 0 means DefaultListLimit.
	Limit int
	// Before, if not 0, lists only jobs with a lower id: the cursor of the previous page.
	Before int64
}

// List returns jobs matching f, newest (highest id) first, and the cursor of the next page (0
// when this page is the last). The cursor is an id bound, so rows inserted meanwhile (which get
// higher ids) never shift a later page. Queued jobs carry their position. A page holds fewer
// than f.Limit jobs, with a cursor, when their results would pass MaxListResultBytes.
//
// It takes two round trips: the page's ids and result sizes, then those jobs' columns as
// ListColumns (never the payload). Each statement runs at most ListStatementTimeout on the
// server, and ctx (the request's, which ends when the client goes away) cancels it from here.
func (a *Admitter) List(ctx context.Context, f ListFilter) ([]job.Job, int64, error) {
	if f.Limit <= 0 {
		f.Limit = DefaultListLimit
	}
	f.Limit = min(f.Limit, MaxListLimit)
	var where []string
	var args []any
	if f.Tenants != nil {
		if len(f.Tenants) == 0 {
			return []job.Job{}, 0, nil
		}
		where = append(where, "tenant IN ("+store.Placeholders(len(f.Tenants))+")")
		for _, t := range f.Tenants {
			args = append(args, t)
		}
	}
	from := " FROM jobs"
	switch {
	case f.Status == "":
	case f.Status.Terminal():
		// The settled_id and tenant_settled_id indexes (migration 0009) hold only final states.
		where = append(where, "settled_status = ?")
		args = append(args, string(f.Status))
	default:
		// Queued and in-flight jobs are few (the depth and in-flight caps bound them): the claim
		// index finds them and they are sorted by id, where reading the primary key newest first
		// could pass over every finished job above them.
		from = " FROM jobs FORCE INDEX (claim)"
		where = append(where, "status = ?")
		args = append(args, string(f.Status))
	}
	if f.Before > 0 {
		where = append(where, "id < ?")
		args = append(args, f.Before)
	}
	q := "SELECT id, COALESCE(LENGTH(result), 0)" + from
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY id DESC LIMIT ?"
	args = append(args, f.Limit+1)
	ids, next, err := a.listPage(ctx, q, args, f.Limit)
	if err != nil {
		return nil, 0, err
	}
	out := []job.Job{}
	if len(ids) == 0 {
		return out, 0, nil
	}
	rows, err := a.listQuery(ctx, "SELECT "+store.ListColumns+" FROM jobs WHERE id IN ("+
		store.Placeholders(len(ids))+") ORDER BY id DESC", ids)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	for rows.Next() {
		r, err := store.ScanRow(rows)
		if err != nil {
			return nil, 0, fmt.Errorf("list jobs: %w", err)
		}
		out = append(out, r.Job)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, a.listErr(fmt.Errorf("list jobs: %w", err))
	}
	if err := a.positions(ctx, out); err != nil {
		return nil, 0, a.listErr(err)
	}
	return out, next, nil
}

// listPage runs q, which selects the ids and result sizes of up to limit+1 jobs, newest first,
// and returns the ids of the page (at most limit of them, their results within
// MaxListResultBytes but at least one) and the cursor of the next page, 0 if there is none.
func (a *Admitter) listPage(ctx context.Context, q string, args []any, limit int) ([]any, int64, error) {
	rows, err := a.listQuery(ctx, q, args)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var ids []any
	var next, last int64
	total := 0
	for rows.Next() {
		var id int64
		var size int
		if err := rows.Scan(&id, &size); err != nil {
			return nil, 0, fmt.Errorf("list jobs: %w", err)
		}
		if len(ids) == limit || (len(ids) > 0 && total+size > MaxListResultBytes) {
			next = last
			break
		}
		ids, last, total = append(ids, id), id, total+size
	}
	if err := rows.Err(); err != nil {
		return nil, 0, a.listErr(fmt.Errorf("list jobs: %w", err))
	}
	return ids, next, nil
}

// listQuery runs a listing statement under ListStatementTimeout: MariaDB's SET STATEMENT
// max_statement_time first, and MySQL's MAX_EXECUTION_TIME hint (SELECTs only) when the server
// does not know SET STATEMENT.
func (a *Admitter) listQuery(ctx context.Context, q string, args []any) (*sql.Rows, error) {
	rows, err := a.cfg.DB.QueryContext(ctx, listStatement(q, true), args...)
	if syntaxError(err) {
		rows, err = a.cfg.DB.QueryContext(ctx, listStatement(q, false), args...)
	}
	if err != nil {
		return nil, a.listErr(fmt.Errorf("list jobs: %w", err))
	}
	return rows, nil
}

// listStatement returns the SELECT q bounded by ListStatementTimeout, in MariaDB's form or
// MySQL's.
func listStatement(q string, mariaDB bool) string {
	if mariaDB {
		return fmt.Sprintf("SET STATEMENT max_statement_time = %g FOR %s", ListStatementTimeout.Seconds(), q)
	}
	rest, _ := strings.CutPrefix(q, "SELECT ")
	return fmt.Sprintf("SELECT /*+ MAX_EXECUTION_TIME(%d) */ %s", ListStatementTimeout.Milliseconds(), rest)
}

// listErr is readErr, and a statement stopped by ListStatementTimeout (MariaDB 1969, MySQL
// 3024) is 503 unavailable, retryable, with a hint to narrow the listing.
func (a *Admitter) listErr(err error) error {
	if serverErr(err, 1969, 3024) {
		return &job.Error{Code: job.CodeUnavailable, Err: err,
			Message: fmt.Sprintf("listing took longer than %s; narrow it (tenant, status) or retry", ListStatementTimeout),
			Detail:  map[string]any{"retryable": true}}
	}
	return a.readErr(err)
}

// positions fills in the position of the queued jobs among jobs with one query: the tenants'
// queued jobs numbered in claim order (queued_at, id).
func (a *Admitter) positions(ctx context.Context, jobs []job.Job) error {
	var ids, tenants []any
	seen := map[string]bool{}
	idx := map[int64]int{}
	for i, j := range jobs {
		if j.Status != job.Queued {
			continue
		}
		ids = append(ids, j.ID)
		idx[j.ID] = i
		if !seen[j.Tenant] {
			seen[j.Tenant] = true
			tenants = append(tenants, j.Tenant)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := a.listQuery(ctx, `SELECT id, pos FROM (SELECT id,
		ROW_NUMBER() OVER (PARTITION BY tenant ORDER BY queued_at, id) AS pos
		FROM jobs WHERE status = 'queued' AND tenant IN (`+store.Placeholders(len(tenants))+`)) q
		WHERE id IN (`+store.Placeholders(len(ids))+`)`, append(tenants, ids...))
	if err != nil {
		return fmt.Errorf("job positions: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, pos int64
		if err := rows.Scan(&id, &pos); err != nil {
			return fmt.Errorf("job positions: %w", err)
		}
		p := pos
		jobs[idx[id]].Position = &p
	}
	return rows.Err()
}

func (a *Admitter) readErr(err error) error {
	if ConnectionLost(err) {
		return unavailable(err)
	}
	return err
}
