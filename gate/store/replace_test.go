package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// TestReplace: LockReplaceable finds and locks the queued job of each tenant's key, and no other
// (another tenant's, one no longer queued); a row held elsewhere fails it at once with a lock
// wait timeout, never waiting. Replace moves the old job to replaced, pointing at its successor,
// with an audit event and a release poke, and its tenant's queue state follows.
func TestReplace(t *testing.T) {
	k := newFixture(t)
	key := func(id int64, s string) {
		tenant := k.row(id).Tenant
		if err := store.RecordJobKeys(k.ctx, k.db, []store.JobKeys{{ID: id, Tenant: tenant, ReplaceKey: &s}}); err != nil {
			t.Fatal(err)
		}
		k.exec("UPDATE jobs SET replace_key = ? WHERE id = ?", s, id)
	}
	old := k.insert(jobSpec{tenant: "a"})
	key(old, "repo-1")
	other := k.insert(jobSpec{tenant: "b"})
	key(other, "repo-1")
	running := k.insert(jobSpec{tenant: "a", status: job.Running})
	key(running, "repo-2")
	succ := k.insert(jobSpec{tenant: "a"})

	tx := k.begin()
	got, err := store.LockReplaceable(k.ctx, tx, []store.TenantKey{{Tenant: "a", Key: "repo-1"}, {Tenant: "a", Key: "repo-2"}, {Tenant: "a", Key: "none"}})
	if err != nil {
		t.Fatal(err)
	}
	if ids(got) == nil || len(got) != 1 || got[0].ID != old || got[0].ReplaceKey == nil || *got[0].ReplaceKey != "repo-1" {
		t.Fatalf("replaceable %v; want job %d (a's queued repo-1)", ids(got), old)
	}
	k.wantLocked("after LockReplaceable", []int64{old, other, running, succ}, old)

	// Held: a second transaction fails at once.
	tx2 := k.begin()
	start := time.Now()
	_, err = store.LockReplaceable(k.ctx, tx2, []store.TenantKey{{Tenant: "a", Key: "repo-1"}})
	var me *mysql.MySQLError
	if !errors.As(err, &me) || me.Number != 1205 || time.Since(start) > 5*time.Second {
		t.Fatalf("LockReplaceable of a held row: %v after %v; want 1205 at once", err, time.Since(start))
	}
	_ = tx2.Rollback()

	st := &store.Store{}
	if err := st.Replace(k.ctx, tx, k.now, []store.Replacement{{Old: got[0], By: succ}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r := k.row(old)
	if r.Status != job.Replaced || r.ReplacedBy == nil || *r.ReplacedBy != succ || r.Version != 1 || r.FinishedAt == nil ||
		r.ErrorCode == nil || *r.ErrorCode != store.ReplacedCode {
		t.Fatalf("the replaced job: %+v", r)
	}
	if n := k.count("SELECT COUNT(*) FROM audit_events WHERE job_id = ? AND to_status = 'replaced'", old); n != 1 {
		t.Errorf("%d audit events of the replacement", n)
	}
	if n := k.count("SELECT COUNT(*) FROM outbox WHERE subject LIKE '%.release.%'"); n != 1 {
		t.Errorf("%d release pokes", n)
	}
	wantQueueState(t, k, "a", "b")
	if got, err := store.LockReplaceable(k.ctx, k.db, []store.TenantKey{{Tenant: "a", Key: "repo-1"}}); err != nil || len(got) != 0 {
		t.Fatalf("after the replacement, a's repo-1: %v (%v); want none queued", ids(got), err)
	}
	// A replacement of a row no longer queued is fenced.
	if err := st.Replace(k.ctx, k.db, k.now, []store.Replacement{{Old: r, By: succ}}); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("replacing a job already replaced: %v; want ErrFenced", err)
	}
}
