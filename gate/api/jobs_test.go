package api_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/integration/apitest"
)

// TestFrontDoorListAndCancel: newest first, default 50, bounded limit, a cursor that stays
// valid while rows are inserted, status filter, positions on queued jobs (equal to GET's), and
// cancel: 200 canceled, again 200, 409 not_cancelable for a job in flight.
func TestFrontDoorListAndCancel(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	ctx := context.Background()
	var ids []int64
	for i := range 60 {
		tenant := "acme"
		if i%3 == 2 {
			tenant = "globex"
		}
		j, _, err := f.Alpha.Admit(ctx, client.AdmitRequest{Tenant: tenant, Payload: i})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	p, err := f.Alpha.List(ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Jobs) != 50 || p.Jobs[0].ID != ids[59] || p.NextCursor == "" {
		t.Fatalf("default page: %d jobs, first %d, cursor %q; want 50 newest first with a cursor", len(p.Jobs), p.Jobs[0].ID, p.NextCursor)
	}
	// Page through 10 at a time while inserting: every original job is seen exactly once, in
	// descending order, and no new one appears in a later page.
	seen := map[int64]bool{}
	cursor := ""
	last := int64(1 << 62)
	for pages := 0; ; pages++ {
		p, err := f.Alpha.List(ctx, client.ListOptions{Limit: 10, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range p.Jobs {
			if j.ID >= last || seen[j.ID] {
				t.Fatalf("page %d: job %d out of order or repeated", pages, j.ID)
			}
			last = j.ID
			seen[j.ID] = true
		}
		if _, _, err := f.Alpha.Admit(ctx, client.AdmitRequest{Tenant: "acme"}); err != nil {
			t.Fatal(err)
		}
		if p.NextCursor == "" {
			break
		}
		cursor = p.NextCursor
		if pages > 10 {
			t.Fatal("too many pages")
		}
	}
	if len(seen) != 60 {
		t.Errorf("paging saw %d jobs, want the 60 that existed", len(seen))
	}
	// Filters and positions: globex's queued jobs are at 1..20 in claim order.
	p, err = f.Alpha.List(ctx, client.ListOptions{Tenant: "globex", Status: "queued", Limit: 1000})
	if err != nil || len(p.Jobs) != 20 {
		t.Fatalf("globex queued: %d jobs %v", len(p.Jobs), err)
	}
	for i, j := range p.Jobs {
		if j.Tenant != "globex" || j.Status != "queued" || j.Position == nil || *j.Position != int64(20-i) {
			t.Errorf("globex job %d: %+v, want queued at position %d", j.ID, j, 20-i)
		}
		if i == 3 {
			g, err := f.Alpha.Job(ctx, j.ID)
			if err != nil || g.Position == nil || *g.Position != *j.Position {
				t.Errorf("GET position %v differs from the listing's %d", g.Position, *j.Position)
			}
		}
	}
	for _, q := range []string{"limit=0", "limit=1001", "limit=x", "status=bogus", "cursor=garbage", "tenant="} {
		if r := f.Do(t, http.MethodGet, "/v1/jobs?"+q, apitest.AlphaToken, nil); r.Status != 400 || r.Body["error_code"] != "invalid_request" {
			t.Errorf("?%s: %d %s, want 400 invalid_request", q, r.Status, r.Raw)
		}
	}
	if r := f.Do(t, http.MethodGet, "/v1/jobs?limit=1000", apitest.AlphaToken, nil); r.Status != 200 {
		t.Errorf("limit=1000: %d", r.Status)
	}

	// Cancel: the first globex job; positions behind it move up.
	first := p.Jobs[len(p.Jobs)-1]
	c, err := f.Alpha.Cancel(ctx, first.ID)
	if err != nil || c.Status != "canceled" || c.FinishedAt == nil {
		t.Fatalf("cancel: %+v %v", c, err)
	}
	if c, err := f.Alpha.Cancel(ctx, first.ID); err != nil || c.Status != "canceled" {
		t.Errorf("cancel again: %+v %v, want 200 canceled", c, err)
	}
	second := p.Jobs[len(p.Jobs)-2]
	if g, _ := f.Alpha.Job(ctx, second.ID); g.Position == nil || *g.Position != 1 {
		t.Errorf("after the cancel the next job's position is %v, want 1", g.Position)
	}
	if _, err := f.DB.ExecContext(ctx, "UPDATE jobs SET status = 'running', version = version + 1 WHERE id = ?", second.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Alpha.Cancel(ctx, second.ID); client.Code(err) != "not_cancelable" {
		t.Errorf("cancel of a running job: %v, want not_cancelable", err)
	}
	if g, _ := f.Alpha.Job(ctx, second.ID); g.Status != "running" || g.Position != nil {
		t.Errorf("running job after a refused cancel: %+v", g)
	}
}

// TestFrontDoorBatch: up to 1,000 admissions in one transaction with per-item results in order
// under the same rules: validation, scope, idempotency (also within the batch), depth caps.
func TestFrontDoorBatch(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	ctx := context.Background()
	reqs := make([]client.AdmitRequest, 1000)
	for i := range reqs {
		reqs[i] = client.AdmitRequest{Tenant: "t" + string(rune('a'+i%16)), Payload: map[string]int{"i": i}}
	}
	res, err := f.Star.AdmitBatch(ctx, reqs)
	if err != nil || len(res) != 1000 {
		t.Fatalf("batch of 1000: %d results, %v", len(res), err)
	}
	for i, r := range res {
		if r.Status != 202 || r.Job == nil || r.Job.Tenant != reqs[i].Tenant || (i > 0 && r.Job.ID <= res[i-1].Job.ID) ||
			r.Job.Position == nil || *r.Job.Position != int64(i/16+1) {
			t.Fatalf("item %d: %+v", i, r)
		}
	}
	var n, ob int
	_ = f.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs").Scan(&n)
	_ = f.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox").Scan(&ob)
	if n != 1000 || ob != 16 {
		t.Errorf("%d jobs and %d outbox rows, want 1000 and one enqueue poke per tenant", n, ob)
	}
	if _, err := f.Star.AdmitBatch(ctx, make([]client.AdmitRequest, 1001)); client.Code(err) != "invalid_request" {
		t.Errorf("batch of 1001: %v, want invalid_request", err)
	}
	if r := f.Do(t, http.MethodPost, "/v1/jobs:batch", apitest.StarToken, map[string]any{"jobs": []any{}}); r.Status != 400 {
		t.Errorf("empty batch: %d", r.Status)
	}

	// Mixed: rules apply per item, in order.
	f.SetConfig(t, map[string]any{"tenant_queue_depth": 2})
	mixed := []client.AdmitRequest{
		{Tenant: "acme", IdempotencyKey: "k"},             // 0: admitted
		{Tenant: "initech"},                               // 1: forbidden for alpha
		{Tenant: "acme", IdempotencyKey: "k"},             // 2: the same key again in the batch: replay of 0
		{Tenant: "acme", IdempotencyKey: "k", Payload: 1}, // 3: same key, other request: 409
		{Tenant: "acme"},                                  // 4: admitted (depth 2 reached)
		{Tenant: "acme", IdempotencyKey: "k2"},            // 5: depth cap: rejected row, key not consumed
		{Tenant: "globex"},                                // 6: admitted
	}
	res, err = f.Alpha.AdmitBatch(ctx, mixed)
	if err != nil {
		t.Fatal(err)
	}
	want := []int{202, 403, 200, 409, 202, 429, 202}
	for i, r := range res {
		if r.Status != want[i] {
			t.Errorf("mixed item %d: %+v, want %d", i, r, want[i])
		}
	}
	if res[2].Job == nil || res[2].Job.ID != res[0].Job.ID || !res[2].Replayed {
		t.Errorf("in-batch replay: %+v, want job %d replayed", res[2], res[0].Job.ID)
	}
	if res[5].Error["error_code"] != "queue_full" || res[5].Error["scope"] != "tenant" || res[5].Error["id"] == nil {
		t.Errorf("depth refusal: %+v", res[5].Error)
	}
	var key any
	if err := f.DB.QueryRowContext(ctx, "SELECT idempotency_key FROM jobs WHERE id = ?", int64(res[5].Error["id"].(float64))).Scan(&key); err != nil || key != nil {
		t.Errorf("rejected row: key %v (%v), want NULL", key, err)
	}
}

// TestFrontDoorRedrive: an admin redrives a lost or failed job into a new queued job with the
// same tenant, rate key and payload and retry_of set; a second redrive answers the same new
// job; other states are 409, producers 403, missing ids 404.
func TestFrontDoorRedrive(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	ctx := context.Background()
	var olds []int64
	for _, st := range []string{"lost", "failed", "queued", "succeeded"} {
		j, _, err := f.Star.Admit(ctx, client.AdmitRequest{Tenant: "acme", RateKey: "key-1", Payload: map[string]string{"run": st}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.DB.ExecContext(ctx, "UPDATE jobs SET status = ?, version = version + 2 WHERE id = ?", st, j.ID); err != nil {
			t.Fatal(err)
		}
		olds = append(olds, j.ID)
	}
	for _, old := range olds[:2] {
		n, r, err := f.Admin.Redrive(ctx, old)
		if err != nil || r.HTTPStatus != 201 {
			t.Fatalf("redrive %d: %v %v", old, r.HTTPStatus, err)
		}
		o, _ := f.Admin.Job(ctx, old)
		if n.RetryOf == nil || *n.RetryOf != old || n.Status != "queued" || n.Tenant != "acme" ||
			n.RateKeySHA256 == nil || *n.RateKeySHA256 != *o.RateKeySHA256 || r.Header.Get("Location") == "" {
			t.Errorf("redriven job: %+v", n)
		}
		var p1, p2 []byte
		_ = f.DB.QueryRowContext(ctx, "SELECT payload FROM jobs WHERE id = ?", old).Scan(&p1)
		_ = f.DB.QueryRowContext(ctx, "SELECT payload FROM jobs WHERE id = ?", n.ID).Scan(&p2)
		if string(p1) != string(p2) || len(p1) == 0 {
			t.Errorf("payload %q, want the original %q", p2, p1)
		}
		again, r, err := f.Admin.Redrive(ctx, old)
		if err != nil || r.HTTPStatus != 200 || again.ID != n.ID || r.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("second redrive: %v %+v %v, want 200 with job %d", r.HTTPStatus, again, err, n.ID)
		}
	}
	for _, old := range olds[2:] {
		if _, _, err := f.Admin.Redrive(ctx, old); client.Code(err) != "not_redrivable" {
			t.Errorf("redrive of a %d: %v, want not_redrivable", old, err)
		}
	}
	if _, _, err := f.Star.Redrive(ctx, olds[0]); client.Code(err) != "forbidden" {
		t.Errorf("producer redrive: %v, want forbidden", err)
	}
	if _, _, err := f.Admin.Redrive(ctx, 987654); client.Code(err) != "not_found" {
		t.Errorf("redrive of a missing id: %v, want not_found", err)
	}
}

// TestFrontDoorRedriveRefused: a redrive refused for a full queue is recorded as a rejected job
// that names the job redriven (SPEC §5), and a later redrive of the same job answers that
// refusal again, as a second redrive answers the first one's job, rather than admitting another
// (job_redrives links the rejected job too, migration 0027).
func TestFrontDoorRedriveRefused(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	ctx := context.Background()
	old, _, err := f.Star.Admit(ctx, client.AdmitRequest{Tenant: "acme", Payload: "first"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.DB.ExecContext(ctx, "UPDATE jobs SET status = 'failed', version = version + 2 WHERE id = ?", old.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.Star.Admit(ctx, client.AdmitRequest{Tenant: "acme", Payload: "fills the queue"}); err != nil {
		t.Fatal(err)
	}
	f.SetConfig(t, map[string]any{"tenant_queue_depth": 1})
	_, r, err := f.Admin.Redrive(ctx, old.ID)
	if client.Code(err) != "queue_full" {
		t.Fatalf("redrive into a full queue: %v %v, want queue_full", r.HTTPStatus, err)
	}
	var rejected int64
	if err := f.DB.QueryRowContext(ctx, "SELECT id FROM jobs WHERE retry_of = ? AND status = 'rejected'", old.ID).Scan(&rejected); err != nil {
		t.Fatalf("the refusal's rejected job: %v", err)
	}
	f.SetConfig(t, map[string]any{"tenant_queue_depth": 500})
	again, r, err := f.Admin.Redrive(ctx, old.ID)
	if err != nil || again.ID != rejected || again.Status != "rejected" || r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("redrive after the refusal: %v %+v %v; want the rejected job %d replayed", r.HTTPStatus, again, err, rejected)
	}
	var n int
	if err := f.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE retry_of = ?", old.ID).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d jobs redrive %d (%v); want the one rejected", n, old.ID, err)
	}
}

// TestFrontDoorListByState: a listing filtered by state, with and without a tenant, pages newest
// first through exactly the jobs in that state, whichever index serves it (the claim index for
// queued and in-flight states, the settled ones for final states; migration 0009).
func TestFrontDoorListByState(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	ctx := context.Background()
	states := []job.Status{job.Queued, job.Running, job.Succeeded, job.Canceled, job.Lost}
	want := map[job.Status]map[string][]int64{} // state -> tenant ("" for all) -> ids, newest first
	var admitted []job.Job
	for i := range 30 {
		tenant := []string{"acme", "globex"}[i%2]
		j, _, err := f.Star.Admit(ctx, client.AdmitRequest{Tenant: tenant})
		if err != nil {
			t.Fatal(err)
		}
		admitted = append(admitted, j)
	}
	for i := len(admitted) - 1; i >= 0; i-- {
		j, state := admitted[i], states[i%len(states)]
		switch state {
		case job.Queued:
		case job.Canceled:
			if _, err := f.Star.Cancel(ctx, j.ID); err != nil {
				t.Fatal(err)
			}
		default:
			if _, err := f.DB.ExecContext(ctx, "UPDATE jobs SET status = ?, version = version + 1 WHERE id = ?", string(state), j.ID); err != nil {
				t.Fatal(err)
			}
		}
		if want[state] == nil {
			want[state] = map[string][]int64{}
		}
		want[state][""] = append(want[state][""], j.ID)
		want[state][j.Tenant] = append(want[state][j.Tenant], j.ID)
	}
	for _, state := range states {
		for _, tenant := range []string{"", "acme", "globex"} {
			var got []int64
			cursor := ""
			for pages := 0; ; pages++ {
				p, err := f.Star.List(ctx, client.ListOptions{Tenant: tenant, Status: state, Limit: 2, Cursor: cursor})
				if err != nil {
					t.Fatalf("%s, tenant %q: %v", state, tenant, err)
				}
				for _, j := range p.Jobs {
					got = append(got, j.ID)
					if j.Status != state || (tenant != "" && j.Tenant != tenant) {
						t.Errorf("%s, tenant %q: listed job %d of %s in state %s", state, tenant, j.ID, j.Tenant, j.Status)
					}
				}
				if p.NextCursor == "" || pages > 10 {
					break
				}
				cursor = p.NextCursor
			}
			if fmt.Sprint(got) != fmt.Sprint(want[state][tenant]) {
				t.Errorf("%s, tenant %q: listed %v, want %v", state, tenant, got, want[state][tenant])
			}
		}
	}
}
