package gate

import (
	"context"
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// List limits (SPEC §6).
const (
	DefaultListLimit = 50
	MaxListLimit     = 1000
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
// higher ids) never shift a later page. Queued jobs carry their position.
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
	q := "SELECT " + store.Columns + from
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY id DESC LIMIT ?"
	args = append(args, f.Limit+1)
	rows, err := a.cfg.DB.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, 0, a.readErr(fmt.Errorf("list jobs: %w", err))
	}
	defer rows.Close()
	out := []job.Job{}
	for rows.Next() {
		r, err := store.ScanRow(rows)
		if err != nil {
			return nil, 0, fmt.Errorf("list jobs: %w", err)
		}
		out = append(out, r.Job)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, a.readErr(fmt.Errorf("list jobs: %w", err))
	}
	var next int64
	if len(out) > f.Limit {
		out = out[:f.Limit]
		next = out[len(out)-1].ID
	}
	if err := a.positions(ctx, out); err != nil {
		return nil, 0, a.readErr(err)
	}
	return out, next, nil
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
	rows, err := a.cfg.DB.QueryContext(ctx, `SELECT id, pos FROM (SELECT id,
		ROW_NUMBER() OVER (PARTITION BY tenant ORDER BY queued_at, id) AS pos
		FROM jobs WHERE status = 'queued' AND tenant IN (`+store.Placeholders(len(tenants))+`)) q
		WHERE id IN (`+store.Placeholders(len(ids))+`)`, append(tenants, ids...)...)
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
