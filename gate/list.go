package gate

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/sqldb"
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
	// Reserve, if set, is called with the bytes of the page's results and error messages
	// once they are known, before they are read; its error ends the listing (the API charges
	// its memory budget with it).
	Reserve func(bytes int) error
}

// List returns jobs matching f, newest (highest id) first, and the cursor of the next page (0
// when this page is the last): store.ListJobs, with each statement bounded by
// ListStatementTimeout and the page's results by MaxListResultBytes. Queued jobs carry their
// position. ctx (the request's, which ends when the client goes away) cancels the statements.
func (a *Admitter) List(ctx context.Context, f ListFilter) ([]job.Job, int64, error) {
	if f.Limit <= 0 {
		f.Limit = DefaultListLimit
	}
	f.Limit = min(f.Limit, MaxListLimit)
	if f.Tenants != nil && len(f.Tenants) == 0 {
		return []job.Job{}, 0, nil
	}
	page, err := store.ListJobs(ctx, a.cfg.DB, store.ListJobsParams{Tenants: f.Tenants, Status: f.Status, Before: f.Before,
		Limit: f.Limit, MaxResultBytes: MaxListResultBytes, StatementTimeout: ListStatementTimeout, Reserve: f.Reserve})
	if err != nil {
		return nil, 0, a.listErr(err)
	}
	return page.Jobs, page.Next, nil
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

func (a *Admitter) readErr(err error) error {
	if sqldb.ConnectionLost(err) {
		return unavailable(err)
	}
	return err
}
