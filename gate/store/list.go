package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/sqldb"
)

// ListJobsParams select a page of jobs, newest first.
type ListJobsParams struct {
	// Tenants restricts the page to these tenants (at least one); nil lists every tenant.
	Tenants []string
	// Status, if set, keeps only jobs in that state.
	Status job.Status
	// Before, if not 0, lists only jobs with a lower id: the cursor of the previous page.
	Before int64
	// Limit is the most jobs the page holds.
	Limit int
	// MaxResultBytes ends the page early, before the job whose result would take the page's
	// results past it (the first job is always returned).
	MaxResultBytes int
	// StatementTimeout bounds each statement on the server.
	StatementTimeout time.Duration
	// Reserve, if set, is called with the bytes of the page's results and error messages
	// after the first round trip, before the second reads them; its error ends the listing
	// and is returned as it is.
	Reserve func(bytes int) error
}

// JobPage is a page of jobs and the cursor of the next, 0 when this page is the last.
type JobPage struct {
	Jobs []job.Job
	Next int64
}

// ListJobs returns the page p selects, newest (highest id) first; queued jobs carry their
// position. The cursor is an id bound, so rows inserted meanwhile (which get higher ids) never
// shift a later page. It takes two round trips, three when the page holds queued jobs: the
// page's ids and the sizes of their results and error messages (for p.Reserve), then those
// jobs' columns as ListColumns (never the payload), then the positions. Each statement runs at
// most p.StatementTimeout on the server (MariaDB's max_statement_time, MySQL's
// MAX_EXECUTION_TIME: a listing that an index cannot serve must not run on after its caller has
// given up), and ctx cancels it from here. It locks nothing.
func ListJobs(ctx context.Context, db sqldb.DB, p ListJobsParams) (JobPage, error) {
	var where []string
	var args []any
	if p.Tenants != nil {
		where = append(where, "tenant IN ("+Placeholders(len(p.Tenants))+")")
		for _, t := range p.Tenants {
			args = append(args, t)
		}
	}
	from := " FROM jobs"
	switch {
	case p.Status == "":
	case p.Status.Terminal():
		// The settled_id and tenant_settled_id indexes (migration 0009) hold only final states.
		where = append(where, "settled_status = ?")
		args = append(args, string(p.Status))
	default:
		// Queued and in-flight jobs are few (the depth and in-flight caps bound them): the claim
		// index finds them and they are sorted by id, where reading the primary key newest first
		// could pass over every finished job above them.
		from = " FROM jobs FORCE INDEX (claim)"
		where = append(where, "status = ?")
		args = append(args, string(p.Status))
	}
	if p.Before > 0 {
		where = append(where, "id < ?")
		args = append(args, p.Before)
	}
	q := "SELECT id, COALESCE(LENGTH(result), 0), COALESCE(LENGTH(error_message), 0)" + from
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY id DESC LIMIT ?"
	args = append(args, p.Limit+1)
	ids, next, variable, err := listPage(ctx, db, p, q, args)
	if err != nil {
		return JobPage{}, err
	}
	out := []job.Job{}
	if len(ids) == 0 {
		return JobPage{Jobs: out}, nil
	}
	if p.Reserve != nil {
		if err := p.Reserve(variable); err != nil {
			return JobPage{}, err
		}
	}
	rows, err := listQuery(ctx, db, p.StatementTimeout, "SELECT "+ListColumns+" FROM jobs WHERE id IN ("+
		Placeholders(len(ids))+") ORDER BY id DESC", ids)
	if err != nil {
		return JobPage{}, err
	}
	defer rows.Close()
	for rows.Next() {
		r, err := ScanRow(rows)
		if err != nil {
			return JobPage{}, fmt.Errorf("list jobs: %w", err)
		}
		out = append(out, r.Job)
	}
	if err := rows.Err(); err != nil {
		return JobPage{}, fmt.Errorf("list jobs: %w", err)
	}
	if err := positions(ctx, db, p.StatementTimeout, out); err != nil {
		return JobPage{}, err
	}
	return JobPage{Jobs: out, Next: next}, nil
}

// listPage runs q, which selects the ids, result sizes and error message sizes of up to
// p.Limit+1 jobs, newest first, and returns the ids of the page (at most p.Limit of them, their
// results within p.MaxResultBytes but at least one), the cursor of the next page (0 if there is
// none) and the bytes of the page's results and error messages.
func listPage(ctx context.Context, db sqldb.DB, p ListJobsParams, q string, args []any) ([]any, int64, int, error) {
	rows, err := listQuery(ctx, db, p.StatementTimeout, q, args)
	if err != nil {
		return nil, 0, 0, err
	}
	defer rows.Close()
	var ids []any
	var next, last int64
	total, messages := 0, 0
	for rows.Next() {
		var id int64
		var size, message int
		if err := rows.Scan(&id, &size, &message); err != nil {
			return nil, 0, 0, fmt.Errorf("list jobs: %w", err)
		}
		if len(ids) == p.Limit || (len(ids) > 0 && total+size > p.MaxResultBytes) {
			next = last
			break
		}
		ids, last, total, messages = append(ids, id), id, total+size, messages+message
	}
	if err := rows.Err(); err != nil {
		return nil, 0, 0, fmt.Errorf("list jobs: %w", err)
	}
	return ids, next, total + messages, nil
}

// listQuery runs a listing statement under timeout: MariaDB's SET STATEMENT max_statement_time
// first, and MySQL's MAX_EXECUTION_TIME hint (SELECTs only) when the server does not know SET
// STATEMENT (a syntax error, 1064).
func listQuery(ctx context.Context, db sqldb.DB, timeout time.Duration, q string, args []any) (*sql.Rows, error) {
	rows, err := db.QueryContext(ctx, listStatement(q, true, timeout), args...)
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 1064 {
		rows, err = db.QueryContext(ctx, listStatement(q, false, timeout), args...)
	}
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	return rows, nil
}

// listStatement returns the SELECT q bounded by timeout, in MariaDB's form or MySQL's.
func listStatement(q string, mariaDB bool, timeout time.Duration) string {
	if mariaDB {
		return fmt.Sprintf("SET STATEMENT max_statement_time = %g FOR %s", timeout.Seconds(), q)
	}
	rest, _ := strings.CutPrefix(q, "SELECT ")
	return fmt.Sprintf("SELECT /*+ MAX_EXECUTION_TIME(%d) */ %s", timeout.Milliseconds(), rest)
}

// positions fills in the position of the queued jobs among jobs with one query: the tenants'
// queued jobs numbered in claim order (queued_at, id).
func positions(ctx context.Context, db sqldb.DB, timeout time.Duration, jobs []job.Job) error {
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
	rows, err := listQuery(ctx, db, timeout, `SELECT id, pos FROM (SELECT id,
		ROW_NUMBER() OVER (PARTITION BY tenant ORDER BY queued_at, id) AS pos
		FROM jobs WHERE status = 'queued' AND tenant IN (`+Placeholders(len(tenants))+`)) q
		WHERE id IN (`+Placeholders(len(ids))+`)`, append(tenants, ids...))
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
