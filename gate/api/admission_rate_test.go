package api_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/integration/apitest"
	"github.com/sluicehq/sluice/integration/memcachedtest"
)

// TestFrontDoorRateLimit: admission_rate_per_minute refuses the admission over the limit with
// 429 rate_limited and Retry-After, writing nothing; replays are not charged.
func TestFrontDoorRateLimit(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{Memcached: "127.0.0.1:11211"})
	ctx := context.Background()
	f.SetConfig(t, map[string]any{"admission_rate_per_minute": 3})
	tenant := apitest.UniqueTenant("rl")
	keyed := client.AdmitRequest{Tenant: tenant, IdempotencyKey: "k1"}
	for i := range 3 {
		req := client.AdmitRequest{Tenant: tenant}
		if i == 0 {
			req = keyed
		}
		if _, _, err := f.Star.Admit(ctx, req); err != nil {
			t.Fatalf("admission %d under the limit: %v", i, err)
		}
	}
	before := f.RowCounts(t)
	r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": tenant})
	if r.Status != 429 || r.Body["error_code"] != "rate_limited" || r.Header.Get("Retry-After") == "" {
		t.Errorf("4th admission: %d %s %v, want 429 rate_limited with Retry-After", r.Status, r.Raw, r.Header)
	}
	if after := f.RowCounts(t); after != before {
		t.Errorf("rate-limited admission wrote rows: %v → %v", before, after)
	}
	// A replay is answered (it comes before the rate limit) and not charged.
	if _, resp, err := f.Star.Admit(ctx, keyed); err != nil || resp.HTTPStatus != 200 {
		t.Errorf("replay over the limit: %v %v, want 200", resp.HTTPStatus, err)
	}
	if n, err := f.Limiter.Count(tenant, f.Time()); err != nil || n != 3 {
		t.Errorf("charged %d (%v), want 3", n, err)
	}
	// Another tenant has its own budget.
	if _, _, err := f.Star.Admit(ctx, client.AdmitRequest{Tenant: apitest.UniqueTenant("rl-other")}); err != nil {
		t.Errorf("another tenant: %v", err)
	}
	// A new minute is a new budget.
	f.Now.Advance(60e9)
	if _, _, err := f.Star.Admit(ctx, client.AdmitRequest{Tenant: tenant}); err != nil {
		t.Errorf("next minute: %v", err)
	}
}

// TestFrontDoorRateLimitRefund injects a fault (a) after the reservation, (b) after the row
// insert and (c) at COMMIT: each leaves exactly one charge for a committed admission and none
// otherwise, and an unknown COMMIT outcome is settled by re-reading the row by id.
func TestFrontDoorRateLimitRefund(t *testing.T) {
	t.Parallel()
	injected := errors.New("injected fault")
	var faultAt atomic.Value // which point fails: set by the test, read by the server
	faultAt.Store("")
	fault := func() string { return faultAt.Load().(string) }
	faults := &gate.Faults{
		AfterReserve: func(context.Context) error {
			if fault() == "reserve" {
				return injected
			}
			return nil
		},
		AfterInsert: func(context.Context) error {
			if fault() == "insert" {
				return injected
			}
			return nil
		},
		Commit: func(_ context.Context, tx gate.Tx) error { return apitest.CommitWithFault(tx, fault()) },
	}
	f := apitest.Setup(t, apitest.Options{Memcached: "127.0.0.1:11211", Faults: faults})
	ctx := context.Background()
	f.SetConfig(t, map[string]any{"admission_rate_per_minute": 100})
	cases := []struct {
		fault    string
		status   int
		code     string
		charges  int
		jobsMade int
	}{
		{"", 202, "", 1, 1},
		{"reserve", 500, "internal", 0, 0},
		{"insert", 500, "internal", 0, 0},
		{"commit-lost", 503, "outcome_unknown", 1, 1},
		{"commit-rolled-back", 503, "outcome_unknown", 0, 0},
		{"commit-refused", 500, "internal", 0, 0},
	}
	for _, c := range cases {
		faultAt.Store(c.fault)
		tenant := apitest.UniqueTenant("refund")
		r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": tenant})
		faultAt.Store("")
		if r.Status != c.status || (c.code != "" && r.Body["error_code"] != c.code) {
			t.Errorf("fault %q: HTTP %d %s, want %d %s", c.fault, r.Status, r.Raw, c.status, c.code)
		}
		n, err := f.Limiter.Count(tenant, f.Time())
		if err != nil {
			t.Fatal(err)
		}
		var jobs int
		if err := f.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE tenant = ?", tenant).Scan(&jobs); err != nil {
			t.Fatal(err)
		}
		if n != c.charges || jobs != c.jobsMade {
			t.Errorf("fault %q: %d charges and %d jobs, want %d and %d", c.fault, n, jobs, c.charges, c.jobsMade)
		}
		if c.code == "outcome_unknown" && r.Body["retryable"] != false {
			t.Errorf("fault %q: unkeyed outcome_unknown with retryable %v, want false", c.fault, r.Body["retryable"])
		}
	}
	// A batch that fails at COMMIT refunds every unit it took.
	faultAt.Store("insert")
	tenant := apitest.UniqueTenant("refund-batch")
	reqs := make([]client.AdmitRequest, 20)
	for i := range reqs {
		reqs[i] = client.AdmitRequest{Tenant: tenant}
	}
	if _, err := f.Star.AdmitBatch(ctx, reqs); client.Code(err) != "internal" {
		t.Errorf("failed batch: %v", err)
	}
	faultAt.Store("")
	if n, _ := f.Limiter.Count(tenant, f.Time()); n != 0 {
		t.Errorf("failed batch left %d charges, want 0", n)
	}
	if _, err := f.Star.AdmitBatch(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	if n, _ := f.Limiter.Count(tenant, f.Time()); n != 20 {
		t.Errorf("committed batch of 20 charged %d", n)
	}
}

// TestFrontDoorRateLimitFailsOpen: with memcached down, admission goes on without the limit and
// counts the failure; the limiter does not pay a timeout per admission.
func TestFrontDoorRateLimitFailsOpen(t *testing.T) {
	t.Parallel()
	mc := memcachedtest.Start(t)
	f := apitest.Setup(t, apitest.Options{Memcached: mc.Addr()})
	ctx := context.Background()
	f.SetConfig(t, map[string]any{"admission_rate_per_minute": 2})
	tenant := apitest.UniqueTenant("open")
	for range 2 {
		if _, _, err := f.Star.Admit(ctx, client.AdmitRequest{Tenant: tenant}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := f.Star.Admit(ctx, client.AdmitRequest{Tenant: tenant}); client.Code(err) != "rate_limited" {
		t.Fatalf("over the limit with memcached up: %v", err)
	}
	mc.Stop()
	for i := range 5 {
		if _, _, err := f.Star.Admit(ctx, client.AdmitRequest{Tenant: tenant}); err != nil {
			t.Fatalf("admission %d with memcached down: %v, want admitted (fail open)", i, err)
		}
	}
	if got := f.Counter(t, "sluice_admission_rate_limiter_errors_total", "", ""); got < 1 {
		t.Errorf("limiter errors counted: %v", got)
	}
	if n := len(f.Logs.Lines(t, "admission rate limiter unavailable; admitting without it (fail open)")); n != 1 {
		t.Errorf("%d fail-open log lines, want 1 (at most one per 15 s)", n)
	}
}
