package api_test

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/integration/apitest"
	"github.com/sluicehq/sluice/integration/harness"
)

// oneLaneFrontDoor is a front door with one admission lane whose first transaction waits in
// AfterReserve, holding the lane, until release is called; txs counts the transactions.
type oneLaneFrontDoor struct {
	*apitest.Env
	entered chan struct{} // closed when the first transaction holds the lane
	release func()
	txs     *atomic.Int32
}

func startOneLaneFrontDoor(t *testing.T) *oneLaneFrontDoor {
	t.Helper()
	o := &oneLaneFrontDoor{entered: make(chan struct{}), txs: &atomic.Int32{}}
	release := make(chan struct{})
	faults := &gate.Faults{AfterReserve: func(context.Context) error {
		if o.txs.Add(1) == 1 {
			close(o.entered)
			<-release
		}
		return nil
	}}
	o.Env = apitest.Setup(t, apitest.Options{Faults: faults, Lanes: 1})
	o.release = sync.OnceFunc(func() { close(release) })
	t.Cleanup(o.release) // a failed wait must not leave the first admission blocked
	return o
}

// waitWaiting waits until n admissions wait for the lane.
func (o *oneLaneFrontDoor) waitWaiting(t *testing.T, n int) {
	t.Helper()
	harness.WaitFor(t, 10*time.Second, fmt.Sprintf("%d admissions waiting for the lane", n), func() (bool, error) {
		return o.Admitter.Waiting() == n, nil
	})
}

// TestAdmissionGroupCommit: single admissions that arrive while the lane is busy share the next
// transaction, and each is still decided as if alone: the tenant depth cap exact, positions
// consecutive, one job per idempotency key with the duplicates answered as replays. The first
// admission holds the only lane until all others wait; then the 40 waiting admissions take 5
// transactions, not 40: one group, and one transaction for each later duplicate of the key,
// since two admissions with the same key never share a group.
func TestAdmissionGroupCommit(t *testing.T) {
	t.Parallel()
	f := startOneLaneFrontDoor(t)
	f.SetConfig(t, map[string]any{"tenant_queue_depth": 10})
	capped, keyed, plain := apitest.UniqueTenant("capped"), apitest.UniqueTenant("keyed"), apitest.UniqueTenant("plain")

	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[string][]harness.Response{}
	post := func(name string, body map[string]any) {
		defer wg.Done()
		r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, body)
		mu.Lock()
		got[name] = append(got[name], r)
		mu.Unlock()
	}
	wg.Add(1)
	go post("first", map[string]any{"tenant": plain})
	<-f.entered
	for range 15 {
		wg.Add(1)
		go post("capped", map[string]any{"tenant": capped})
	}
	for range 5 {
		wg.Add(1)
		go post("keyed", map[string]any{"tenant": keyed, "idempotency_key": "once", "payload": 1})
	}
	for range 20 {
		wg.Add(1)
		go post("plain", map[string]any{"tenant": plain})
	}
	f.waitWaiting(t, 40)
	f.release()
	wg.Wait()

	if n := f.txs.Load(); n != 6 {
		t.Errorf("%d admission transactions for 41 admissions, want 6 (the first, one group, 4 replays)", n)
	}
	positions := func(rs []harness.Response) []int {
		var ps []int
		for _, r := range rs {
			if r.Status == 202 {
				ps = append(ps, int(r.Body["position"].(float64)))
			}
		}
		sort.Ints(ps)
		return ps
	}
	want := func(n, from int) string {
		ps := make([]int, n)
		for i := range ps {
			ps[i] = from + i
		}
		return fmt.Sprint(ps)
	}
	var full int
	for _, r := range got["capped"] {
		if r.Status == 429 && r.Body["error_code"] == "queue_full" {
			full++
		}
	}
	if ps := positions(got["capped"]); fmt.Sprint(ps) != want(10, 1) || full != 5 {
		t.Errorf("capped tenant: positions %v and %d refused, want %s and 5", ps, full, want(10, 1))
	}
	if ps := positions(append(got["first"], got["plain"]...)); fmt.Sprint(ps) != want(10, 1) {
		// The tenant cap is 10 for every tenant: 21 admissions, 10 admitted.
		t.Errorf("plain tenant: positions %v, want %s", ps, want(10, 1))
	}
	var created, replayed int
	ids := map[any]bool{}
	for _, r := range got["keyed"] {
		switch {
		case r.Status == 202:
			created++
		case r.Status == 200 && r.Header.Get("Idempotent-Replayed") == "true":
			replayed++
		default:
			t.Errorf("keyed admission: %d %s", r.Status, r.Raw)
		}
		ids[r.Body["id"]] = true
	}
	if created != 1 || replayed != 4 || len(ids) != 1 {
		t.Errorf("keyed: %d created, %d replayed, %d distinct ids; want 1, 4, 1", created, replayed, len(ids))
	}
}

// TestAdmissionWaiterGone: an admission whose client went away while it waited for a lane leaves
// the queue and writes nothing.
func TestAdmissionWaiterGone(t *testing.T) {
	t.Parallel()
	f := startOneLaneFrontDoor(t)
	holder, gone := apitest.UniqueTenant("holder"), apitest.UniqueTenant("gone")
	done := make(chan harness.Response, 1)
	go func() {
		done <- f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": holder})
	}()
	<-f.entered

	ctx, cancel := context.WithCancel(context.Background())
	failed := make(chan error, 1)
	go func() {
		_, _, err := f.Star.Admit(ctx, client.AdmitRequest{Tenant: gone})
		failed <- err
	}()
	f.waitWaiting(t, 1)
	cancel()
	if err := <-failed; err == nil {
		t.Fatal("the cancelled admission succeeded")
	}
	f.waitWaiting(t, 0) // the server saw the client leave and took the admission out of the queue
	f.release()
	if r := <-done; r.Status != 202 {
		t.Fatalf("the admission holding the lane: %d %s", r.Status, r.Raw)
	}
	var n int
	if err := f.DB.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM jobs WHERE tenant = ?", gone).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d jobs written for the admission whose client left while waiting", n)
	}
}

// TestAdmissionGroupDoesNotWaitForOneTenant: a group never waits for a tenant lock. When another
// transaction holds one of its tenants (here a connection that locked the tenant row and sits
// on it), the group falls apart and each admission runs alone: the other tenants' admissions
// finish while the lock is still held, and only the locked tenant's admission waits for it.
func TestAdmissionGroupDoesNotWaitForOneTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := startOneLaneFrontDoor(t)
	// The locked tenant sorts before every other: an admission waiting for its row lock also
	// waits for the gap before it (a duplicate-key check), which would hold up new tenants'
	// rows inserted into that gap, grouped or not.
	wedged := apitest.UniqueTenant("a-wedged")
	f.FillQueued(t, wedged, 0, "queued") // its tenants row
	locker, err := f.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback()
	if _, err := locker.ExecContext(ctx, "SELECT tenant FROM tenants WHERE tenant = ? FOR UPDATE", wedged); err != nil {
		t.Fatal(err)
	}

	holder := make(chan harness.Response, 1)
	go func() {
		holder <- f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": apitest.UniqueTenant("z-first")})
	}()
	<-f.entered
	wedgedDone := make(chan harness.Response, 1)
	go func() {
		wedgedDone <- f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": wedged})
	}()
	others := make(chan harness.Response, 10)
	for range 10 {
		go func() {
			others <- f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": apitest.UniqueTenant("z-other")})
		}()
	}
	f.waitWaiting(t, 11)
	f.release() // the 11 waiting admissions form one group, with the wedged tenant in it

	// innodb_lock_wait_timeout is 10 s: admissions stuck behind the wedged lock could not
	// finish within 5 s.
	within := time.After(5 * time.Second)
	for i := range 10 {
		select {
		case r := <-others:
			if r.Status != 202 {
				t.Errorf("admission of another tenant: %d %s", r.Status, r.Raw)
			}
		case <-within:
			t.Fatalf("%d of 10 other tenants' admissions finished while one tenant's lock was held; want all", i)
		}
	}
	select {
	case r := <-wedgedDone:
		t.Fatalf("the locked tenant's admission answered %d while its lock was held", r.Status)
	default:
	}
	if err := locker.Commit(); err != nil {
		t.Fatal(err)
	}
	if r := <-wedgedDone; r.Status != 202 {
		t.Errorf("the locked tenant's admission after the lock was released: %d %s", r.Status, r.Raw)
	}
	if r := <-holder; r.Status != 202 {
		t.Errorf("the admission that held the lane: %d %s", r.Status, r.Raw)
	}
}
