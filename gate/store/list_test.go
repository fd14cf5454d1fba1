package store_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// TestListJobs: pages newest first, filtered by tenants and by state (final or not), continued
// by their cursor, ended early before the results pass their bound, with each queued job's
// position in its tenant's queue; a listing locks nothing and never reads a payload.
func TestListJobs(t *testing.T) {
	k := newFixture(t)
	a1 := k.insert(jobSpec{tenant: "a", payload: "p"})
	b1 := k.insert(jobSpec{tenant: "b"})
	a2 := k.insert(jobSpec{tenant: "a", queuedAt: k.now.Add(-time.Second)})
	aDone := k.insert(jobSpec{tenant: "a", status: job.Succeeded, result: `"` + strings.Repeat("x", 100) + `"`})
	bRun := k.insert(jobSpec{tenant: "b", status: job.Running})
	aDone2 := k.insert(jobSpec{tenant: "a", status: job.Succeeded, result: `"` + strings.Repeat("y", 100) + `"`})
	all := []int64{a1, b1, a2, aDone, bRun, aDone2}
	list := func(p store.ListJobsParams) ([]int64, store.JobPage) {
		t.Helper()
		if p.Limit == 0 {
			p.Limit = 10
		}
		if p.MaxResultBytes == 0 {
			p.MaxResultBytes = 1 << 20
		}
		p.StatementTimeout = 5 * time.Second
		tx := k.begin()
		page, err := store.ListJobs(k.ctx, tx, p)
		if err != nil {
			t.Fatal(err)
		}
		k.wantLocked("during a listing", all)
		_ = tx.Rollback()
		var got []int64
		for _, j := range page.Jobs {
			got = append(got, j.ID)
		}
		return got, page
	}
	for _, c := range []struct {
		name string
		p    store.ListJobsParams
		want []int64
		next int64
	}{
		{"every job", store.ListJobsParams{}, []int64{aDone2, bRun, aDone, a2, b1, a1}, 0},
		{"one tenant", store.ListJobsParams{Tenants: []string{"a"}}, []int64{aDone2, aDone, a2, a1}, 0},
		{"a final state", store.ListJobsParams{Status: job.Succeeded}, []int64{aDone2, aDone}, 0},
		{"queued", store.ListJobsParams{Status: job.Queued, Tenants: []string{"a", "b"}}, []int64{a2, b1, a1}, 0},
		{"a page", store.ListJobsParams{Limit: 2}, []int64{aDone2, bRun}, bRun},
		{"the next page", store.ListJobsParams{Limit: 2, Before: bRun}, []int64{aDone, a2}, a2},
		{"results past the bound", store.ListJobsParams{MaxResultBytes: 150}, []int64{aDone2, bRun}, bRun},
		{"one result past the bound", store.ListJobsParams{MaxResultBytes: 10}, []int64{aDone2}, aDone2},
	} {
		got, page := list(c.p)
		if !slices.Equal(got, c.want) || page.Next != c.next {
			t.Errorf("%s: %v next %d, want %v next %d", c.name, got, page.Next, c.want, c.next)
		}
	}
	_, page := list(store.ListJobsParams{Tenants: []string{"a"}})
	for _, j := range page.Jobs {
		var want int64
		switch j.ID {
		case a2:
			want = 1
		case a1:
			want = 2
		}
		if (j.Position == nil) != (want == 0) || (j.Position != nil && *j.Position != want) {
			t.Errorf("job %d: position %v, want %d", j.ID, j.Position, want)
		}
		if j.ID == aDone && len(j.Result) == 0 {
			t.Errorf("job %d: no result", j.ID)
		}
	}
	if _, page := list(store.ListJobsParams{Before: a1}); len(page.Jobs) != 0 || page.Jobs == nil {
		t.Errorf("past the last job: %+v, want an empty page", page)
	}
}
