package store_test

import (
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// TestChargeTime: with ChargeTime on, an outcome the executor reported charges its job's time
// from start to outcome to its tenant in tenant_time, in the outcome's transaction, adding to
// what the tenant had, decayed with the window; a requeue charges nothing, and with ChargeTime off
// nothing is written. An answer's arrival (Outcome.EndedAt) ends the charge. TimeUsed reads the
// charges decayed to now.
func TestChargeTime(t *testing.T) {
	k := newFixture(t)
	on := false
	st := &store.Store{ChargeTime: func() bool { return on }}
	running := func(tenant string, ran time.Duration) store.Row {
		id := k.insert(jobSpec{tenant: tenant, status: job.Running, version: 1})
		k.exec("UPDATE jobs SET started_at = ? WHERE id = ?", k.now.Add(-ran), id)
		return k.row(id)
	}
	finish := func(items ...store.Finishing) {
		t.Helper()
		tx := k.begin()
		if _, err := st.FinishMany(k.ctx, tx, k.now, items); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	done := func(r store.Row, s job.Status) store.Finishing {
		return store.Finishing{Row: r, Outcome: store.Outcome{Status: s, Reported: true}}
	}
	finish(done(running("a", 10*time.Second), job.Succeeded))
	if n := k.count("SELECT COUNT(*) FROM tenant_time"); n != 0 {
		t.Fatalf("charging off: %d tenant_time rows", n)
	}

	on = true
	finish(done(running("a", 2*time.Second), job.Succeeded), done(running("a", 3*time.Second), job.Failed),
		done(running("b", time.Second), job.Succeeded),
		store.Finishing{Row: running("c", 7*time.Second), Outcome: store.Outcome{Status: job.Queued, ErrorCode: "executor_refused"}})
	used := func() map[string]float64 {
		t.Helper()
		u, err := store.TimeUsed(k.ctx, k.db, []string{"a", "b", "c", "d", "none"})
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 0.01*want {
			t.Errorf("%s: %.4f s used, want %.4f", what, got, want)
		}
	}
	u := used()
	near("a", u["a"], 5)
	near("b", u["b"], 1)
	if _, ok := u["c"]; ok || len(u) != 2 { // d not yet charged
		t.Errorf("time used %v: c's requeue, and none, were charged", u)
	}
	// A window ago, b's second counts e^-1; a new charge adds to the decayed value.
	k.exec("UPDATE tenant_time SET used_at = used_at - INTERVAL 60 SECOND WHERE tenant = 'b'")
	near("b a window later", used()["b"], math.Exp(-1))
	finish(done(running("b", 4*time.Second), job.Succeeded))
	near("b charged again", used()["b"], math.Exp(-1)+4)
	// An answer that arrived before the write ends the charge there, not at the write.
	early := done(running("d", 4*time.Second), job.Succeeded)
	early.Outcome.EndedAt = k.now.Add(-time.Second)
	finish(early)
	near("d, answered a second before its write", used()["d"], 3)
}
