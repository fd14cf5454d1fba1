package integration_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/integration/harness"
)

// Slots with drainers: one accounting for jobs and slots (the caps hold for their sum with three
// processes taking slots and draining at once), a release or an expiry frees capacity for the
// queue at once.

// slotJobStatus reads job id's status.
func slotJobStatus(t *testing.T, e *harness.Env, id int64) string {
	t.Helper()
	var s string
	if err := e.DB.QueryRowContext(context.Background(), "SELECT status FROM jobs WHERE id = ?", id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSlotReleaseStartsQueuedJob: a job queued behind a slot that holds the only unit waits
// while the drainer runs passes, and starts once the slot is released (the release's poke).
func TestSlotReleaseStartsQueuedJob(t *testing.T) {
	t.Parallel()
	e := startSlotsEnv(t, harness.Options{})
	patchConfig(t, e, map[string]any{"global_in_flight": 1})
	id := slotIDOf(t, takeSlot(t, e, harness.ProducerToken, true, map[string]any{"tenant": "acme"}))
	passes := harness.Counter(t, e.App.Registry(), "sluice_drainer_passes_total")
	job := e.Admit(t, "beta", map[string]any{})
	// The admission's poke runs passes; none may claim the job while the slot holds the unit.
	harness.WaitFor(t, 10*time.Second, "two drain passes after the admission", func() (bool, error) {
		return harness.Counter(t, e.App.Registry(), "sluice_drainer_passes_total") >= passes+2, nil
	})
	if s := slotJobStatus(t, e, job); s != "queued" {
		t.Fatalf("job %d is %s while a slot holds the only unit", job, s)
	}
	if r := e.Do(t, http.MethodDelete, "/v1/slots/"+id, harness.ProducerToken, nil); r.Status != http.StatusNoContent {
		t.Fatalf("release: HTTP %d", r.Status)
	}
	harness.WaitFor(t, 10*time.Second, "the queued job's start after the release", func() (bool, error) {
		return slotJobStatus(t, e, job) == "succeeded", nil
	})
}

// TestSlotExpiryFreesCapacity: a slot whose lease ran out stops counting, the upkeep deletes it
// (a lost audit row, sluice_slots_lost_total) and the queued job behind it starts.
func TestSlotExpiryFreesCapacity(t *testing.T) {
	t.Parallel()
	e := startSlotsEnv(t, harness.Options{})
	patchConfig(t, e, map[string]any{"global_in_flight": 1})
	id := slotIDOf(t, takeSlot(t, e, harness.ProducerToken, true, map[string]any{"tenant": "acme"}))
	job := e.Admit(t, "beta", map[string]any{})
	expireSlot(t, e, id)
	// The expired slot stops counting at once, so the job may start before the sweep; the sweep
	// counts the slot after its transaction commits.
	harness.WaitFor(t, 10*time.Second, "the expired slot's sweep and the job's start", func() (bool, error) {
		var n int
		err := e.DB.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM slots").Scan(&n)
		return err == nil && n == 0 && slotJobStatus(t, e, job) == "succeeded" &&
			harness.Counter(t, e.App.Registry(), "sluice_slots_lost_total") == 1, err
	})
	var lost int
	if err := e.DB.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM audit_events WHERE event = 'slot_lost' AND slot_id = ?", id).Scan(&lost); err != nil || lost != 1 {
		t.Errorf("%d lost audit rows (%v)", lost, err)
	}
}

// capLimits are the limits the property test checks.
type capLimits struct {
	global, tenant, lane int
	tierTenants          map[string]bool
	tier                 int
	reserve              int // interactive_reserve: non-interactive units never exceed global - reserve
}

// checkCaps reads, in one consistent snapshot, the jobs in flight and the live slots that count
// (a slot granted past a limit does not), and returns what breaks a limit, if anything.
func checkCaps(ctx context.Context, db *sql.DB, l capLimits) (string, error) {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return "", err
	}
	defer func() { _ = tx.Rollback() }()
	rows, err := tx.QueryContext(ctx, `SELECT tenant, lanes, interactive FROM jobs WHERE status IN ('claimed','dispatched','running')
		UNION ALL SELECT tenant, lanes, interactive FROM slots WHERE counted AND expires_at > NOW(6)`)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	total, tier, lane, plain := 0, 0, 0, 0
	tenants := map[string]int{}
	for rows.Next() {
		var tenant, lanes string
		var interactive bool
		if err := rows.Scan(&tenant, &lanes, &interactive); err != nil {
			return "", err
		}
		n := 1
		if !interactive {
			plain++
		}
		total += n
		tenants[tenant] += n
		if l.tierTenants[tenant] {
			tier += n
		}
		if strings.Contains(lanes, "search") {
			lane += n
		}
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	var bad []string
	if total > l.global {
		bad = append(bad, fmt.Sprintf("total %d > %d", total, l.global))
	}
	for t, n := range tenants {
		if n > l.tenant {
			bad = append(bad, fmt.Sprintf("tenant %s %d > %d", t, n, l.tenant))
		}
	}
	if lane > l.lane {
		bad = append(bad, fmt.Sprintf("lane search %d > %d", lane, l.lane))
	}
	if tier > l.tier {
		bad = append(bad, fmt.Sprintf("tier gold %d > %d", tier, l.tier))
	}
	if plain > l.global-l.reserve {
		bad = append(bad, fmt.Sprintf("non-interactive %d > %d (reserve %d)", plain, l.global-l.reserve, l.reserve))
	}
	return strings.Join(bad, "; "), nil
}

// TestSlotCapsExactWithThreeProcesses is a property test: three processes (API, relay and
// drainer each) share one database while workers take, renew and release slots and admit jobs
// that the drainers claim and finish, in random interleavings; a checker reads every instant it
// can (one consistent snapshot each) and no snapshot may break a limit: the global cap, the
// tenant cap, a lane's limit, a tier's ceiling and the interactive reserve, for jobs and slots
// together. enforce_for is aware and a third of the slot requests are not: those are granted past
// a limit, uncounted, and must not break the limits either.
func TestSlotCapsExactWithThreeProcesses(t *testing.T) {
	t.Parallel()
	e := startSlotsEnv(t, harness.Options{})
	patchConfig(t, e, map[string]any{"global_in_flight": 4, "tenant_in_flight": 2, "lanes": map[string]int{"search": 2},
		"tenant_tiers": map[string]string{"t3": "gold"}, "tier_in_flight": map[string]int{"gold": 1}, "interactive_reserve": 1,
		"enforce_for": "aware"})
	l := capLimits{global: 4, tenant: 2, lane: 2, tier: 1, tierTenants: map[string]bool{"t3": true}, reserve: 1}
	urls := []string{e.URL}
	for range 2 {
		a := e.StartApp(t, harness.Options{})
		urls = append(urls, "http://"+a.Addr())
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var violations []string
	snapshots := 0
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		for ctx.Err() == nil {
			bad, err := checkCaps(ctx, e.DB.DB, l)
			if err != nil {
				if ctx.Err() == nil {
					violations = append(violations, "check: "+err.Error())
				}
				return
			}
			snapshots++
			if bad != "" {
				violations = append(violations, bad)
			}
		}
	}()

	tenants := []string{"t1", "t2", "t3", "t4"}
	var mu sync.Mutex
	var jobs []int64
	stats := map[string]int{}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 18))
			var held []string
			for range 40 {
				env := &harness.Env{URL: urls[rng.IntN(len(urls))], HTTP: e.HTTP}
				switch op := rng.IntN(10); {
				case op < 4:
					body := map[string]any{"tenant": tenants[rng.IntN(len(tenants))], "interactive": rng.IntN(4) == 0,
						"lease_seconds": 5 + rng.IntN(2)*55}
					if rng.IntN(2) == 0 {
						body["lanes"] = []string{"search"}
					}
					r := takeSlot(t, env, harness.ProducerToken, rng.IntN(3) != 0, body)
					mu.Lock()
					stats[fmt.Sprint("take ", r.Status)]++
					if r.Status == http.StatusCreated {
						stats[fmt.Sprint("take ", r.Body["decision"])]++
					}
					mu.Unlock()
					if r.Status == http.StatusCreated {
						held = append(held, fmt.Sprint(int64(r.Body["id"].(float64))))
					}
				case op < 5 && len(held) > 0:
					r := env.Do(t, http.MethodPost, "/v1/slots/"+held[rng.IntN(len(held))]+"/renew", harness.ProducerToken, nil)
					mu.Lock()
					stats[fmt.Sprint("renew ", r.Status)]++
					mu.Unlock()
				case op < 7 && len(held) > 0:
					i := rng.IntN(len(held))
					if r := env.Do(t, http.MethodDelete, "/v1/slots/"+held[i], harness.ProducerToken, nil); r.Status != http.StatusNoContent {
						t.Errorf("release: HTTP %d %s", r.Status, r.Raw)
					}
					held = append(held[:i], held[i+1:]...)
				default:
					body := map[string]any{"tenant": tenants[rng.IntN(len(tenants))], "interactive": rng.IntN(4) == 0,
						"payload": map[string]any{"sleep_ms": rng.IntN(40)}}
					if rng.IntN(2) == 0 {
						body["lanes"] = []string{"search"}
					}
					r := env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, body)
					if r.Status != http.StatusAccepted {
						t.Errorf("admit %v: HTTP %d %s", body, r.Status, r.Raw)
						continue
					}
					id := int64(r.Body["id"].(float64))
					mu.Lock()
					jobs = append(jobs, id)
					mu.Unlock()
				}
			}
			for _, id := range held {
				(&harness.Env{URL: urls[0], HTTP: e.HTTP}).Do(t, http.MethodDelete, "/v1/slots/"+id, harness.ProducerToken, nil)
			}
		}()
	}
	wg.Wait()
	harness.WaitFor(t, 60*time.Second, "every job finished", func() (bool, error) {
		var n int
		err := e.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE status NOT IN ('succeeded')").Scan(&n)
		return n == 0, err
	})
	cancel()
	<-checked
	if len(violations) > 0 {
		t.Errorf("%d of %d snapshots broke a limit, first: %v", len(violations), snapshots, violations[:min(5, len(violations))])
	}
	t.Logf("%d snapshots; %d jobs; %v", snapshots, len(jobs), stats)
	if stats["take 201"] == 0 || stats["take 429"] == 0 || stats["take shadow-refused"] == 0 || len(jobs) == 0 {
		t.Errorf("the run did not exercise grants, refusals and jobs: %v, %d jobs", stats, len(jobs))
	}
}

// TestSlotFloodLeavesQueue (issue 30, finding 6): a producer that does not handle a refusal loops
// POST /v1/slots, with admission_mode shadow or with enforce_for aware and no
// Sluice-Capacity-Aware header. Every request is granted, but only those within the limits count:
// the rest answer shadow-refused, counted false, and take nothing from the queue, so another
// tenant's queued jobs still start at the global cap. Counted, the flood's slots filled the
// global cap and no queued job was ever dispatched again.
func TestSlotFloodLeavesQueue(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		config map[string]any
	}{
		{"shadow", map[string]any{"admission_mode": "shadow"}},
		{"aware", map[string]any{"enforce_for": "aware"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := startSlotsEnv(t, harness.Options{})
			patchConfig(t, e, tc.config) // global 4, tenant 2: the defaults
			const flood = 12
			var held []string
			for i := range flood {
				r := takeSlot(t, e, harness.ProducerToken, false, map[string]any{"tenant": "flood", "lease_seconds": 600})
				held = append(held, slotIDOf(t, r))
				counted := i < 2 // the tenant's cap
				if want := map[bool]string{true: "admitted", false: "shadow-refused"}[counted]; r.Body["decision"] != want ||
					r.Body["counted"] != counted || r.Header.Get("Sluice-Capacity-Decision") != want {
					t.Fatalf("slot %d: %s %v, want %s, counted %v", i, r.Raw, r.Header, want, counted)
				}
			}
			// Renewed, as a holder does, an uncounted slot stays uncounted.
			for _, id := range held {
				if r := e.Do(t, http.MethodPost, "/v1/slots/"+id+"/renew", harness.ProducerToken, nil); r.Status != http.StatusOK {
					t.Fatalf("renew %s: HTTP %d %s", id, r.Status, r.Raw)
				}
			}
			var live, counted int
			if err := e.DB.QueryRowContext(context.Background(), "SELECT COUNT(*), COALESCE(SUM(counted), 0) FROM slots WHERE expires_at > NOW(6)").
				Scan(&live, &counted); err != nil || live != flood || counted != 2 {
				t.Fatalf("%d live slots, %d counted (%v); want %d, 2", live, counted, err, flood)
			}
			if r := e.Do(t, http.MethodGet, "/v1/status", harness.AdminToken, nil); r.Status != http.StatusOK ||
				r.Body["slots"].(map[string]any)["total"] != float64(2) {
				t.Errorf("status slots: HTTP %d %v, want 2 (the counted ones)", r.Status, r.Body["slots"])
			}
			// Two units are left under the global cap: beta's jobs take them, two at a time.
			var jobs []int64
			for range 4 {
				jobs = append(jobs, e.Admit(t, "beta", map[string]any{}))
			}
			harness.WaitFor(t, 30*time.Second, "beta's queued jobs started and finished beside the flood's slots", func() (bool, error) {
				for _, id := range jobs {
					if slotJobStatus(t, e, id) != "succeeded" {
						return false, nil
					}
				}
				return true, nil
			})
			// Releasing an uncounted slot frees nothing: no release poke is written for it.
			var pokes, after int
			q := "SELECT COUNT(*) FROM outbox WHERE subject LIKE '%release%'"
			if err := e.DB.QueryRowContext(context.Background(), q).Scan(&pokes); err != nil {
				t.Fatal(err)
			}
			if r := e.Do(t, http.MethodDelete, "/v1/slots/"+held[flood-1], harness.ProducerToken, nil); r.Status != http.StatusNoContent {
				t.Fatalf("release: HTTP %d", r.Status)
			}
			if err := e.DB.QueryRowContext(context.Background(), q).Scan(&after); err != nil || after != pokes {
				t.Errorf("%d release pokes after releasing an uncounted slot, want %d (%v)", after, pokes, err)
			}
		})
	}
}
