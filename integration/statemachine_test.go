package integration_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/testdb"
)

// pending is a dispatch the executor holds, waiting for the test to answer it.
type pending struct {
	*drainertest.Held
	confirmed bool
	startID   string // the start attempt the API let through, once confirmed
}

// TestStateMachineProperties runs random interleavings of admit, claim passes of three drainers,
// start confirmations (a first attempt, its retry after a lost answer, or the dispatch replayed
// to another executor: a new start attempt with the same nonce), executor answers (done, 429,
// 503, unknown, accepted), asynchronous completions, cancels and clock jumps past leases, against
// the real store and drainer on a real database, one step at a time. After every step it checks
// SPEC §12 invariants 1-4: no job is in an undefined state, no job was let start by more than one
// start attempt, caps hold, and a terminal job never changes again (every write after a claim is
// fenced).
func TestStateMachineProperties(t *testing.T) {
	t.Parallel()
	for seed := int64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			runStateMachine(t, seed, 400)
		})
	}
}

func runStateMachine(t *testing.T, seed int64, steps int) {
	ctx := context.Background()
	rng := rand.New(rand.NewSource(seed))
	db := testdb.New(t)
	fake := clock.NewFake(time.Now())
	cache := config.NewCache(db, nil)
	adm, err := gate.New(gate.Config{DB: db.DB, Limits: cache})
	if err != nil {
		t.Fatal(err)
	}
	st := &store.Store{}
	out := make(chan *drainertest.Held, 64)
	recorded := make(chan int64, 64)
	var drainers []*drainer.Drainer
	for i := 0; i < 3; i++ {
		d, err := drainer.New(drainer.Config{DB: db.DB, Executor: &drainertest.Executor{Hold: out}, Clock: fake,
			ID: fmt.Sprintf("d%d", i), Observer: drainer.ObserverFuncs{OnRecorded: func(id int64) { recorded <- id }}})
		if err != nil {
			t.Fatal(err)
		}
		drainers = append(drainers, d)
	}
	var held []*pending
	var accepted []*pending // answered 202: their completion comes through the API
	t.Cleanup(func() {
		for _, p := range held {
			p.Reply(executor.Answer{Kind: executor.Unknown, Err: errors.New("test over")})
		}
		go func() { // the drainers' last records, during Stop
			for range recorded {
			}
		}()
		for _, d := range drainers {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			d.Stop(sctx)
			cancel()
		}
		close(recorded)
	})
	starts := map[int64]map[string]bool{} // job -> "nonce/start id" of each start attempt let through
	terminal := map[int64]string{}        // job -> "status/version" once terminal
	tenants := []string{"a", "b", "c"}
	inTx := func(fn func(tx *sql.Tx, now time.Time) error) error {
		now, _ := fake.Now(ctx)
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := fn(tx, now); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	// waitRecorded waits until a drainer has dealt with the answer to job id.
	waitRecorded := func(id int64) {
		select {
		case got := <-recorded:
			if got != id {
				t.Fatalf("recorded job %d, want %d", got, id)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the drainer did not record the answer to job %d", id)
		}
	}
	for step := 0; step < steps; step++ {
		action := rng.Intn(9)
		switch action {
		case 0: // admit
			if _, err := adm.Admit(ctx, "p", gate.Request{Tenant: tenants[rng.Intn(len(tenants))]}, nil); err != nil {
				t.Fatalf("step %d admit: %v", step, err)
			}
		case 1, 2: // a claim pass of a random drainer
			i := rng.Intn(3)
			p, err := drainers[i].RunOnce(ctx)
			if err != nil {
				t.Fatalf("step %d pass of d%d: %v", step, i, err)
			}
			for k := 0; k < p.Claimed; k++ {
				select {
				case h := <-out:
					held = append(held, &pending{Held: h})
				case <-time.After(10 * time.Second):
					t.Fatalf("step %d: claimed %d but only %d dispatches arrived", step, p.Claimed, k)
				}
			}
		case 3: // an executor confirms a held dispatch's start
			if len(held) == 0 {
				continue
			}
			p := held[rng.Intn(len(held))]
			// The attempt that started the job repeating itself (its answer lost), or a new
			// attempt: the first, or the same dispatch replayed to another executor.
			startID, retry := p.startID, p.startID != "" && rng.Intn(2) == 0
			if !retry {
				startID = fmt.Sprintf("attempt-%d", step)
			}
			// As the API confirms it: store.ConfirmStartsCommit, the start's own transaction.
			now, _ := fake.Now(ctx)
			start := &store.Start{ID: p.JobID, Nonce: p.Nonce, StartID: startID}
			err := st.ConfirmStartsCommit(ctx, db.DB, now, []*store.Start{start}, false)
			if err == nil {
				err = start.Err
			}
			var je *job.Error
			switch {
			case err == nil:
				p.confirmed, p.startID = true, startID
				if starts[p.JobID] == nil {
					starts[p.JobID] = map[string]bool{}
				}
				starts[p.JobID][p.Nonce+"/"+startID] = true
			case errors.As(err, &je):
				if retry && je.Detail["status"] == job.Running {
					t.Fatalf("step %d: the start attempt that started job %d was refused on its retry: %v", step, p.JobID, err)
				}
			default:
				t.Fatalf("step %d confirm: %v", step, err)
			}
		case 4, 5: // the executor answers a held dispatch
			if len(held) == 0 {
				continue
			}
			k := rng.Intn(len(held))
			p := held[k]
			held = append(held[:k], held[k+1:]...)
			var a executor.Answer
			switch r := rng.Intn(5); {
			case r == 0 && p.confirmed:
				a = executor.Answer{Kind: executor.Done, Status: []string{"succeeded", "failed"}[rng.Intn(2)]}
			case r == 1:
				a = executor.Answer{Kind: executor.RateLimited, RetryAfter: 1 + rng.Intn(5)}
			case r == 2:
				a = executor.Answer{Kind: executor.Refused}
			case r == 3 && p.confirmed:
				a = executor.Answer{Kind: executor.Accepted}
			default: // an executor that did not run it, or a lost connection
				a = executor.Answer{Kind: executor.Unknown, Err: errors.New("connection lost")}
			}
			p.Reply(a)
			waitRecorded(p.JobID)
			if a.Kind == executor.Accepted {
				accepted = append(accepted, p)
			}
		case 6: // an asynchronous executor completes a job it accepted
			if len(accepted) == 0 {
				continue
			}
			k := rng.Intn(len(accepted))
			p := accepted[k]
			accepted = append(accepted[:k], accepted[k+1:]...)
			err := inTx(func(tx *sql.Tx, now time.Time) error {
				_, _, err := st.Complete(ctx, tx, now, p.JobID, store.Completion{Nonce: p.Nonce, Status: "succeeded"})
				return err
			})
			var je *job.Error
			if err != nil && !errors.As(err, &je) {
				t.Fatalf("step %d complete: %v", step, err)
			}
		case 7: // a producer cancels a random job
			var id int64
			if err := db.QueryRowContext(ctx, "SELECT id FROM jobs ORDER BY RAND() LIMIT 1").Scan(&id); err != nil {
				continue
			}
			err := inTx(func(tx *sql.Tx, now time.Time) error {
				_, _, err := st.Cancel(ctx, tx, now, id)
				return err
			})
			if err != nil && !errors.Is(err, store.ErrNotCancelable) {
				t.Fatalf("step %d cancel: %v", step, err)
			}
		case 8: // time passes, sometimes past every lease
			fake.Advance(time.Duration(rng.Intn(12000)) * time.Millisecond)
		}
		checkInvariants(t, ctx, db.DB, step, starts, terminal)
	}
}

func checkInvariants(t *testing.T, ctx context.Context, db *sql.DB, step int, starts map[int64]map[string]bool, terminal map[int64]string) {
	t.Helper()
	for id, attempts := range starts {
		if len(attempts) > 1 {
			t.Fatalf("step %d: job %d was started %d times: %v", step, id, len(attempts), attempts)
		}
	}
	rows, err := db.QueryContext(ctx, `SELECT id, tenant, status, version, lease_until IS NOT NULL,
		drainer_id IS NOT NULL, started_at IS NOT NULL FROM jobs`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	perTenant := map[string]int{}
	total := 0
	for rows.Next() {
		var id, version int64
		var tenant, status string
		var leased, owned, started bool
		if err := rows.Scan(&id, &tenant, &status, &version, &leased, &owned, &started); err != nil {
			t.Fatal(err)
		}
		s := job.Status(status)
		switch {
		case s.InFlight():
			if !leased || !owned {
				t.Fatalf("step %d: job %d is %s without a lease or an owner", step, id, s)
			}
			perTenant[tenant]++
			total++
		case s == job.Queued:
		case s.Terminal():
			snap := fmt.Sprintf("%s/%d", s, version)
			if prev, ok := terminal[id]; ok && prev != snap {
				t.Fatalf("step %d: terminal job %d changed from %s to %s", step, id, prev, snap)
			}
			terminal[id] = snap
			if s == job.Lost && !started {
				t.Fatalf("step %d: job %d is lost although its start was never confirmed", step, id)
			}
		default:
			t.Fatalf("step %d: job %d in unknown state %q", step, id, s)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if total > 4 {
		t.Fatalf("step %d: %d jobs in flight, global cap 4", step, total)
	}
	for tenant, n := range perTenant {
		if n > 2 {
			t.Fatalf("step %d: tenant %s has %d in flight, cap 2", step, tenant, n)
		}
	}
	if step%2 == 1 {
		// Heads left behind by claims stay so into the next step.
		drainertest.CheckQueueState(t, ctx, db, fmt.Sprintf("step %d", step), false)
		return
	}
	drainertest.CheckTenantQueueState(t, ctx, db, fmt.Sprintf("step %d", step))
}
