package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// TestListJobsReserve: a listing tells Reserve the bytes of its page's results and error
// messages (the page's, not those of the jobs past it) before it reads them, and a Reserve that
// refuses ends the listing with its own error, so that the API can charge a page to its memory
// budget before building it (issue 30).
func TestListJobsReserve(t *testing.T) {
	k := newFixture(t)
	k.insert(jobSpec{tenant: "a", status: job.Succeeded, result: `"` + strings.Repeat("x", 1000) + `"`})
	failed := k.insert(jobSpec{tenant: "a", status: job.Failed})
	if _, err := k.db.ExecContext(k.ctx, "UPDATE jobs SET error_message = ? WHERE id = ?", strings.Repeat("e", 300), failed); err != nil {
		t.Fatal(err)
	}
	k.insert(jobSpec{tenant: "a", status: job.Succeeded, result: `"` + strings.Repeat("y", 50) + `"`})
	var told []int
	reserve := func(n int) error { told = append(told, n); return nil }
	page, err := store.ListJobs(k.ctx, k.db, store.ListJobsParams{Limit: 2, MaxResultBytes: 1 << 20,
		StatementTimeout: 5 * time.Second, Reserve: reserve})
	if err != nil {
		t.Fatal(err)
	}
	// The newest two: the 52-byte result and the 300-byte error message.
	if len(page.Jobs) != 2 || len(told) != 1 || told[0] != 52+300 {
		t.Fatalf("page of %d jobs, Reserve told %v; want 2 jobs and [352]", len(page.Jobs), told)
	}
	spent := errors.New("spent")
	_, err = store.ListJobs(k.ctx, k.db, store.ListJobsParams{Limit: 10, MaxResultBytes: 1 << 20,
		StatementTimeout: 5 * time.Second, Reserve: func(int) error { return spent }})
	if !errors.Is(err, spent) {
		t.Fatalf("a listing Reserve refused: %v, want its error", err)
	}
}
