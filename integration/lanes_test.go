package integration_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/harness"
)

// The claim honours lanes, tiers and the interactive reserve for jobs (SPEC §5a). The executor
// counts each job under the groups its payload names (simexec's Payload.Groups) while it runs, so
// the limits are checked where the work runs, as the cap tests check the caps.

// patchConfig changes the runtime config through the API, as an operator would: the API's
// admission (which validates lanes) and the drainers' claims both follow it.
func patchConfig(t testing.TB, env *harness.Env, changes map[string]any) {
	t.Helper()
	r := env.Do(t, http.MethodPatch, "/v1/config", harness.AdminToken, map[string]any{"changes": changes, "note": t.Name()})
	if r.Status != http.StatusOK {
		t.Fatalf("PATCH /v1/config %v: HTTP %d %s", changes, r.Status, r.Raw)
	}
}

// laneJob is an admission with lanes, interactive and the executor groups to count it under.
type laneJob struct {
	tenant      string
	lanes       []string
	interactive bool
	sleepMS     int
	groups      []string
}

func admitLaneJob(t *testing.T, env *harness.Env, j laneJob) int64 {
	t.Helper()
	body := map[string]any{"tenant": j.tenant, "payload": map[string]any{"sleep_ms": j.sleepMS, "groups": j.groups}}
	if len(j.lanes) > 0 {
		body["lanes"] = j.lanes
	}
	if j.interactive {
		body["interactive"] = true
	}
	r := env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, body)
	if r.Status != http.StatusAccepted {
		t.Fatalf("admit %+v: HTTP %d %s", j, r.Status, r.Raw)
	}
	return int64(r.Body["id"].(float64))
}

func inFlightStatus(s string) bool { return s == "dispatched" || s == "running" || s == "claimed" }

// holder holds at the executor the dispatches of the jobs it is told to hold, until release: a
// test's way to keep a job in flight for as long as it needs, with no service time to outlast.
type holder struct {
	mu      sync.Mutex
	held    map[int64]bool
	release chan struct{}
}

func newHolder(t *testing.T) *holder {
	h := &holder{held: map[int64]bool{}, release: make(chan struct{})}
	t.Cleanup(h.let)
	return h
}

// hold makes id's dispatch wait at the executor until let.
func (h *holder) hold(id int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held[id] = true
}

// let lets every held dispatch go on (once).
func (h *holder) let() {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.release:
	default:
		close(h.release)
	}
}

// onReceive is the executor's OnReceive hook.
func (h *holder) onReceive(id int64, _ string, _ time.Time) {
	h.mu.Lock()
	held := h.held[id]
	h.mu.Unlock()
	if held {
		<-h.release
	}
}

// TestClaimSkipsFullLane: a job whose lane is full waits, and its tenant's later job without
// that lane starts meanwhile; the lane's limit holds at the executor.
func TestClaimSkipsFullLane(t *testing.T) {
	t.Parallel()
	h := newHolder(t)
	env := harness.Start(t, harness.Options{OnReceive: h.onReceive})
	patchConfig(t, env, map[string]any{"lanes": map[string]any{"gpu": 1}, "global_in_flight": 0})
	gpu := laneJob{tenant: "A", lanes: []string{"gpu"}, groups: []string{"lane:gpu"}}
	a1 := admitLaneJob(t, env, gpu)
	a2 := admitLaneJob(t, env, gpu)
	a3 := admitLaneJob(t, env, laneJob{tenant: "A"})
	h.hold(a1)
	h.hold(a3)
	patchConfig(t, env, map[string]any{"global_in_flight": 4})
	harness.WaitFor(t, 15*time.Second, "A's first gpu job and its plain job to start", func() (bool, error) {
		return inFlightStatus(drainertest.JobStatus(t, env.DB, a1)) && inFlightStatus(drainertest.JobStatus(t, env.DB, a3)), nil
	})
	// a1 holds the lane until let: a2 cannot have gone, whatever the timing.
	if s := drainertest.JobStatus(t, env.DB, a2); s != "queued" {
		t.Errorf("A's second gpu job is %s while the lane is full; want queued", s)
	}
	h.let()
	harness.WaitFor(t, 30*time.Second, "all three to succeed", func() (bool, error) {
		c, err := env.CountJobs(context.Background())
		return c["succeeded"] == 3, err
	})
	if n := env.Exec.Stats().MaxInFlightByGroup["lane:gpu"]; n != 1 {
		t.Errorf("the executor saw %d gpu jobs at once; the lane's limit is 1", n)
	}
}

// TestClaimInteractiveFirst: within a tenant, an interactive job admitted last starts before
// the tenant's older plain jobs, however many there are (more than a pass reads of a tenant).
func TestClaimInteractiveFirst(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{})
	patchConfig(t, env, map[string]any{"global_in_flight": 0, "tenant_in_flight": 1})
	var plain []int64
	for range 30 {
		plain = append(plain, admitLaneJob(t, env, laneJob{tenant: "X", sleepMS: 5}))
	}
	inter := admitLaneJob(t, env, laneJob{tenant: "X", interactive: true, sleepMS: 5})
	patchConfig(t, env, map[string]any{"global_in_flight": 4})
	harness.WaitFor(t, 60*time.Second, "all 31 to succeed", func() (bool, error) {
		c, err := env.CountJobs(context.Background())
		return c["succeeded"] == 31, err
	})
	var first int64
	if err := env.DB.QueryRowContext(context.Background(), "SELECT id FROM jobs ORDER BY dispatched_at, id LIMIT 1").Scan(&first); err != nil {
		t.Fatal(err)
	}
	if first != inter {
		t.Errorf("job %d was dispatched first; want the interactive job %d before the older plain ones (%d to %d)", first, inter, plain[0], plain[len(plain)-1])
	}
}

// TestClaimTiersAndReserve: a tier's ceiling and its per-tenant cap hold at the executor, tenants
// of other tiers take the rest; non-interactive jobs never take the interactive reserve, and an
// interactive job does while plain ones wait.
func TestClaimTiersAndReserve(t *testing.T) {
	t.Parallel()
	h := newHolder(t)
	env := harness.Start(t, harness.Options{OnReceive: h.onReceive})
	patchConfig(t, env, map[string]any{"global_in_flight": 0,
		"tenant_tiers": map[string]any{"G1": "gold", "G2": "gold", "G3": "gold"}, "tier_in_flight": map[string]any{"gold": 2},
		"tier_tenant_in_flight": map[string]any{"gold": 1}, "interactive_reserve": 1})
	for i := range 12 {
		tenant := fmt.Sprintf("G%d", i%3+1)
		admitLaneJob(t, env, laneJob{tenant: tenant, sleepMS: 30, groups: []string{"tier:gold", "plain"}})
	}
	for range 6 {
		admitLaneJob(t, env, laneJob{tenant: "D", groups: []string{"plain"}})
	}
	// Plain jobs are held at the executor until the interactive job is in, so the reserve is the
	// only room it can take.
	for _, id := range drainertest.QueryIDs(t, env.DB.DB, "SELECT id FROM jobs WHERE interactive = 0") {
		h.hold(id)
	}
	patchConfig(t, env, map[string]any{"global_in_flight": 4})
	// While plain work fills what the reserve leaves, an interactive job starts at once.
	harness.WaitFor(t, 15*time.Second, "three plain jobs in flight", func() (bool, error) {
		c, err := env.CountJobsWhere(context.Background(), "interactive = 0")
		return c["dispatched"]+c["running"] == 3, err
	})
	i := admitLaneJob(t, env, laneJob{tenant: "I", interactive: true})
	harness.WaitFor(t, 15*time.Second, "the interactive job to start in the reserve", func() (bool, error) {
		s := drainertest.JobStatus(t, env.DB, i)
		return inFlightStatus(s) || s == "succeeded", nil
	})
	h.let()
	harness.WaitFor(t, 60*time.Second, "all 19 jobs to succeed", func() (bool, error) {
		c, err := env.CountJobs(context.Background())
		return c["succeeded"] == 19, err
	})
	st := env.Exec.Stats()
	if n := st.MaxInFlightByGroup["tier:gold"]; n != 2 {
		t.Errorf("the executor saw at most %d gold jobs at once; want the tier's ceiling, 2", n)
	}
	for _, g := range []string{"G1", "G2", "G3"} {
		if n := st.MaxInFlightByTenant[g]; n != 1 {
			t.Errorf("the executor saw at most %d jobs of %s at once; want the gold tier's per-tenant cap, 1", n, g)
		}
	}
	if n := st.MaxInFlightByGroup["plain"]; n != 3 {
		t.Errorf("the executor saw at most %d plain jobs at once; want 3 (global 4 less the reserve of 1)", n)
	}
	assertCapsHeld(t, env, 4, 2)
}

// TestThreeDrainersLanesTiersReserve: three drainer processes on a mixed queue (lanes, tiers,
// interactive and plain jobs): every limit holds at the executor, every job starts once.
func TestThreeDrainersLanesTiersReserve(t *testing.T) {
	t.Parallel()
	bin := harness.BuildSluice(t)
	env := harness.Start(t, harness.Options{API: true, Relay: true})
	patchConfig(t, env, map[string]any{"global_in_flight": 6, "tenant_in_flight": 3,
		"lanes":                 map[string]any{"gpu": 2, "search": 3},
		"tenant_tiers":          map[string]any{"t0": "gold", "t1": "gold", "t2": "gold"},
		"tier_in_flight":        map[string]any{"gold": 3},
		"tier_tenant_in_flight": map[string]any{"gold": 2},
		"interactive_reserve":   2})
	const n = 600
	for i := range n {
		j := laneJob{tenant: fmt.Sprintf("t%d", i%8), sleepMS: 3}
		if i%8 < 3 {
			j.groups = append(j.groups, "tier:gold")
		}
		switch i % 5 {
		case 0:
			j.lanes = []string{"gpu"}
		case 1:
			j.lanes = []string{"gpu", "search"}
		case 2:
			j.lanes = []string{"search"}
		}
		for _, l := range j.lanes {
			j.groups = append(j.groups, "lane:"+l)
		}
		j.interactive = i%7 == 0
		if !j.interactive {
			j.groups = append(j.groups, "plain")
		}
		admitLaneJob(t, env, j)
	}
	for i := range 3 {
		env.StartDrainer(t, bin, fmt.Sprintf("drainer-%d", i))
	}
	harness.WaitFor(t, 180*time.Second, "all jobs to succeed", func() (bool, error) {
		c, err := env.CountJobs(context.Background())
		return c["succeeded"] == n, err
	})
	st := env.Exec.Stats()
	if st.TotalStarts != n || st.DuplicateStarts != 0 {
		t.Errorf("executor saw %d starts (%d duplicates), want %d", st.TotalStarts, st.DuplicateStarts, n)
	}
	for g, limit := range map[string]int{"lane:gpu": 2, "lane:search": 3, "tier:gold": 3, "plain": 4} {
		if got := st.MaxInFlightByGroup[g]; got > limit || got == 0 {
			t.Errorf("the executor saw at most %d jobs of %s at once; limit %d", got, g, limit)
		}
	}
	for tenant, got := range st.MaxInFlightByTenant {
		limit := 3
		if tenant == "t0" || tenant == "t1" || tenant == "t2" {
			limit = 2
		}
		if got > limit {
			t.Errorf("the executor saw %d jobs of %s at once; its cap is %d", got, tenant, limit)
		}
	}
	assertCapsHeld(t, env, 6, 3)
}

// TestLoneJobHonoursLanes: the lone-job path (an idle queue's only job, claimed at once) decides
// with the same capacity check: a lone job whose lane is full stays queued until the lane frees,
// then starts.
func TestLoneJobHonoursLanes(t *testing.T) {
	t.Parallel()
	h := newHolder(t)
	env := harness.Start(t, harness.Options{OnReceive: h.onReceive})
	patchConfig(t, env, map[string]any{"lanes": map[string]any{"gpu": 1}, "global_in_flight": 0})
	first := admitLaneJob(t, env, laneJob{tenant: "A", lanes: []string{"gpu"}, groups: []string{"lane:gpu"}})
	h.hold(first)
	patchConfig(t, env, map[string]any{"global_in_flight": 4})
	harness.WaitFor(t, 15*time.Second, "the first gpu job to start", func() (bool, error) {
		return inFlightStatus(drainertest.JobStatus(t, env.DB, first)), nil
	})
	// The queue is empty again: the next pass probes for a lone job, and finds this one; the
	// first holds the lane until the second has been seen in the queue for two poll periods.
	second := admitLaneJob(t, env, laneJob{tenant: "B", lanes: []string{"gpu"}, groups: []string{"lane:gpu"}})
	var polls time.Time
	if err := env.DB.QueryRowContext(context.Background(), "SELECT UTC_TIMESTAMP(6) + INTERVAL 2 SECOND").Scan(&polls); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 15*time.Second, "a heartbeat two poll periods after the second job's admission", func() (bool, error) {
		var n int
		err := env.DB.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM drainers WHERE heartbeat_at >= ?", polls).Scan(&n)
		return n > 0, err
	})
	if s := drainertest.JobStatus(t, env.DB, second); s != "queued" {
		t.Errorf("the second gpu job is %s while the first holds the lane; want queued", s)
	}
	h.let()
	harness.WaitFor(t, 30*time.Second, "both to succeed", func() (bool, error) {
		return drainertest.JobStatus(t, env.DB, first) == "succeeded" && drainertest.JobStatus(t, env.DB, second) == "succeeded", nil
	})
	var firstDone, secondDispatched time.Time
	if err := env.DB.QueryRowContext(context.Background(), "SELECT (SELECT finished_at FROM jobs WHERE id = ?), (SELECT dispatched_at FROM jobs WHERE id = ?)",
		first, second).Scan(&firstDone, &secondDispatched); err != nil {
		t.Fatal(err)
	}
	if secondDispatched.Before(firstDone) {
		t.Errorf("the second gpu job was dispatched at %v, before the first finished at %v", secondDispatched, firstDone)
	}
	if n := env.Exec.Stats().MaxInFlightByGroup["lane:gpu"]; n != 1 {
		t.Errorf("the executor saw %d gpu jobs at once; the lane's limit is 1", n)
	}
}
