package store_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// grantAll is a Decide that grants every slot, counted as counted says, recording what it was
// shown.
func grantAll(seen *store.SlotState, counted bool) func(store.SlotState) store.SlotGrant {
	return func(st store.SlotState) store.SlotGrant {
		*seen = st
		return store.SlotGrant{Grant: true, Counted: counted,
			Event: store.AuditEvent{Event: store.EventSlotGranted, Tenant: "x", Actor: "p1", Scope: "global"}}
	}
}

// take grants a slot of tenant to caller that counts and returns it.
func (k *fixture) take(tenant, caller string, lease int, lanes ...string) store.Slot {
	k.t.Helper()
	return k.takeCounted(true, tenant, caller, lease, lanes...)
}

// takeCounted grants a slot of tenant to caller, counted or not, and returns it.
func (k *fixture) takeCounted(counted bool, tenant, caller string, lease int, lanes ...string) store.Slot {
	k.t.Helper()
	var st store.SlotState
	_, s, err := store.TakeSlot(k.ctx, k.db.DB, store.TakeSlotParams{Tenant: tenant, Caller: caller, Lanes: lanes,
		LeaseSeconds: lease, WaitingLimit: 10, Decide: grantAll(&st, counted)})
	if err != nil || s == nil || s.Counted != counted {
		k.t.Fatalf("take slot (counted %v): %+v %v", counted, s, err)
	}
	return *s
}

// expire moves slot id's lease into the past, as the database's clock would.
func (k *fixture) expire(id int64) {
	k.t.Helper()
	k.exec("UPDATE slots SET expires_at = NOW(6) - INTERVAL 1 SECOND WHERE id = ?", id)
}

// TestTakeSlot: a grant reads, under the claim lock, the config, the jobs in flight and the live
// slots together, the tenants with queued work ahead (not the slot's own) and the tenant's depth;
// it writes the slot with its audit row; a refusal writes nothing.
func TestTakeSlot(t *testing.T) {
	k := newFixture(t)
	k.insert(jobSpec{tenant: "a", status: job.Running})
	k.insert(jobSpec{tenant: "a"})
	k.insert(jobSpec{tenant: "b", queuedAt: k.now.Add(-time.Minute), rateKey: "kb"})
	later := k.now.Add(time.Hour)
	k.insert(jobSpec{tenant: "c", queuedAt: k.now.Add(-2 * time.Minute), notBefore: &later})
	first := k.take("b", "p1", 30, "search", "gpu")
	if first.Tenant != "b" || first.Caller != "p1" || !slices.Equal(first.Lanes, []string{"gpu", "search"}) || first.LeaseSeconds != 30 ||
		first.ExpiresAt.Sub(first.CreatedAt) != 30*time.Second {
		t.Errorf("granted %+v", first)
	}
	expired := k.take("c", "p1", 60)
	k.expire(expired.ID)

	var st store.SlotState
	_, s, err := store.TakeSlot(k.ctx, k.db.DB, store.TakeSlotParams{Tenant: "a", Caller: "p2", Interactive: true,
		LeaseSeconds: 60, WaitingLimit: 10, Decide: func(got store.SlotState) store.SlotGrant {
			st = got
			if !k.claimLockHeld() {
				t.Error("Decide runs without the claim lock")
			}
			return store.SlotGrant{}
		}})
	if err != nil || s != nil {
		t.Fatalf("refused: %v %v", s, err)
	}
	us := st.Usage
	if us.Total != 2 || us.Tenant["a"] != 1 || us.Tenant["b"] != 1 || us.Tenant["c"] != 0 || us.Lane["search"] != 1 || us.Lane["gpu"] != 1 ||
		us.Interactive != 0 || us.Tier["default"] != 2 {
		t.Errorf("usage %+v: want a's running job and b's live slot (c's is expired)", us)
	}
	if !slices.Equal(st.Waiting, []store.Waiting{{Tenant: "c"}, {Tenant: "b", HeadRateKey: "kb", Due: true}}) || st.TenantQueued != 1 ||
		st.Config.GlobalInFlight != config.Default().GlobalInFlight {
		t.Errorf("waiting %v, tenant queued %d", st.Waiting, st.TenantQueued)
	}
	if n := k.count("SELECT COUNT(*) FROM slots"); n != 2 {
		t.Errorf("a refusal wrote a slot: %d rows", n)
	}
	if k.claimLockHeld() {
		t.Error("the claim lock is held after a refusal")
	}
	if n := k.count("SELECT COUNT(*) FROM audit_events WHERE event = 'slot_granted' AND slot_id = ? AND actor = 'p1'", first.ID); n != 1 {
		t.Errorf("%d granted audit rows for slot %d", n, first.ID)
	}
	// The waiting read is bounded.
	_, _, err = store.TakeSlot(k.ctx, k.db.DB, store.TakeSlotParams{Tenant: "a", Caller: "p2", LeaseSeconds: 60, WaitingLimit: 1,
		Decide: func(got store.SlotState) store.SlotGrant { st = got; return store.SlotGrant{} }})
	if err != nil || len(st.Waiting) != 1 || st.Waiting[0].Tenant != "c" {
		t.Errorf("waiting with limit 1: %v %v", st.Waiting, err)
	}
	// A head a claim left behind whose job was purged since (migration 0018): the tenant still
	// waits, due, with no rate key known.
	k.exec("UPDATE tenants SET head_id = 999999 WHERE tenant = 'c'")
	_, _, err = store.TakeSlot(k.ctx, k.db.DB, store.TakeSlotParams{Tenant: "a", Caller: "p2", LeaseSeconds: 60, WaitingLimit: 1,
		Decide: func(got store.SlotState) store.SlotGrant { st = got; return store.SlotGrant{} }})
	if err != nil || !slices.Equal(st.Waiting, []store.Waiting{{Tenant: "c", Due: true}}) {
		t.Errorf("waiting, c's head purged: %v %v", st.Waiting, err)
	}
}

// TestLockClaimsCountsSlots: the claim counts the live slots with the jobs in flight, per tenant
// and in total; an expired slot no longer counts, nor does a slot granted uncounted (past a
// limit), however many. The tenant page's in-flight read and the status's do the same.
func TestLockClaimsCountsSlots(t *testing.T) {
	k := newFixture(t)
	k.insert(jobSpec{tenant: "a", status: job.Running})
	k.take("a", "p", 60)
	k.take("b", "p", 60, "search")
	k.expire(k.take("b", "p", 60).ID)
	for range 5 {
		k.takeCounted(false, "c", "p", 60, "search")
	}
	tx := k.beginConn()
	l, err := store.LockClaims(k.ctx, tx, false)
	if err != nil {
		t.Fatal(err)
	}
	tx.Close()
	if l.Usage.Total != 3 || l.Usage.Tenant["a"] != 2 || l.Usage.Tenant["b"] != 1 || l.Usage.Lane["search"] != 1 {
		t.Errorf("claim lock read %+v", l)
	}
	page, err := store.ReadTenantPage(k.ctx, k.db, store.TenantPageParams{FromStart: true, Limit: 5, WithInFlight: true})
	if err != nil {
		t.Fatal(err)
	}
	if page.Usage.Total != 3 || page.Usage.Tenant["a"] != 2 || page.Usage.Tenant["b"] != 1 || page.Usage.Tenant["c"] != 0 {
		t.Errorf("tenant page in flight %v total %d", page.Usage.Tenant, page.Usage.Total)
	}
	live, err := store.LiveSlots(k.ctx, k.db, config.Default())
	if err != nil || live.Total != 2 || live.Lane["search"] != 1 {
		t.Errorf("live slots %+v %v", live, err)
	}
}

// TestRenewSlot: renewal extends by the slot's own lease, only for its caller or an admin;
// an expired slot answers ErrSlotLost and stays expired.
func TestRenewSlot(t *testing.T) {
	k := newFixture(t)
	s := k.take("a", "p1", 30)
	// A shorter lease configured later does not shorten a live slot: the slot's own is used.
	got, err := store.RenewSlot(k.ctx, k.db.DB, s.ID, "p1", false)
	if err != nil || got.LeaseSeconds != 30 || got.ExpiresAt.Before(s.ExpiresAt) || !got.Counted {
		t.Fatalf("renew: %+v %v", got, err)
	}
	// An uncounted slot renews the same, and stays uncounted.
	if u, err := store.RenewSlot(k.ctx, k.db.DB, k.takeCounted(false, "a", "p1", 30).ID, "p1", false); err != nil || u.Counted {
		t.Errorf("renew of an uncounted slot: %+v %v", u, err)
	}
	if n := k.count("SELECT TIMESTAMPDIFF(SECOND, NOW(6), expires_at) FROM slots WHERE id = ?", s.ID); n < 28 || n > 30 {
		t.Errorf("renewed to %d s from now, want 30", n)
	}
	if _, err := store.RenewSlot(k.ctx, k.db.DB, s.ID, "p2", false); !errors.Is(err, store.ErrSlotNotFound) {
		t.Errorf("another caller's renewal: %v", err)
	}
	if _, err := store.RenewSlot(k.ctx, k.db.DB, s.ID, "admin", true); err != nil {
		t.Errorf("an admin's renewal: %v", err)
	}
	if _, err := store.RenewSlot(k.ctx, k.db.DB, s.ID+100, "p1", false); !errors.Is(err, store.ErrSlotNotFound) {
		t.Errorf("no such slot: %v", err)
	}
	k.expire(s.ID)
	for range 2 {
		if _, err := store.RenewSlot(k.ctx, k.db.DB, s.ID, "p1", false); !errors.Is(err, store.ErrSlotLost) {
			t.Errorf("expired slot's renewal: %v", err)
		}
	}
	if n := k.count("SELECT COUNT(*) FROM slots WHERE id = ? AND expires_at > NOW(6)", s.ID); n != 0 {
		t.Error("an expired slot was revived")
	}
}

// TestReleaseSlot: a release deletes the slot with its audit row and a release poke, in one
// transaction; again it finds nothing and is no error; another caller's slot is not found.
func TestReleaseSlot(t *testing.T) {
	k := newFixture(t)
	st := &store.Store{}
	s := k.take("a", "p1", 60)
	if _, err := st.ReleaseSlot(k.ctx, k.db.DB, k.now, s.ID, "p2", false); !errors.Is(err, store.ErrSlotNotFound) {
		t.Errorf("another caller's release: %v", err)
	}
	r, err := st.ReleaseSlot(k.ctx, k.db.DB, k.now, s.ID, "p1", false)
	if err != nil || !r.Found || r.Expired || r.Slot.Tenant != "a" {
		t.Fatalf("release: %+v %v", r, err)
	}
	var subject string
	if err := k.db.QueryRowContext(k.ctx, "SELECT subject FROM outbox WHERE id = ?", r.Poke.ID).Scan(&subject); err != nil || subject != r.Poke.Subject {
		t.Errorf("the poke returned %+v, the outbox row's subject %q (%v)", r.Poke, subject, err)
	}
	if n := k.count("SELECT COUNT(*) FROM slots"); n != 0 {
		t.Errorf("%d slots left", n)
	}
	if n := k.count("SELECT COUNT(*) FROM outbox WHERE subject LIKE '%release%'"); n != 1 {
		t.Errorf("%d release pokes", n)
	}
	if n := k.count("SELECT COUNT(*) FROM audit_events WHERE event = 'slot_released' AND slot_id = ?", s.ID); n != 1 {
		t.Errorf("%d released audit rows", n)
	}
	if r, err := st.ReleaseSlot(k.ctx, k.db.DB, k.now, s.ID, "p1", false); err != nil || r.Found {
		t.Errorf("second release: %+v %v", r, err)
	}
	old := k.take("a", "p1", 60)
	k.expire(old.ID)
	if r, err := st.ReleaseSlot(k.ctx, k.db.DB, k.now, old.ID, "admin", true); err != nil || !r.Found || !r.Expired {
		t.Errorf("an admin's release of an expired slot: %+v %v", r, err)
	}
	// A slot that did not count freed nothing: deleted and audited, without a poke.
	pokes := k.count("SELECT COUNT(*) FROM outbox")
	u := k.takeCounted(false, "a", "p1", 60)
	if r, err := st.ReleaseSlot(k.ctx, k.db.DB, k.now, u.ID, "p1", false); err != nil || !r.Found || r.Slot.Counted || r.Poke.ID != 0 {
		t.Errorf("release of an uncounted slot: %+v %v", r, err)
	}
	if n := k.count("SELECT COUNT(*) FROM outbox"); n != pokes {
		t.Errorf("%d outbox rows after releasing an uncounted slot, want %d", n, pokes)
	}
	if n := k.count("SELECT COUNT(*) FROM slots WHERE id = ?", u.ID) + k.count(
		"SELECT COUNT(*) FROM audit_events WHERE event = 'slot_released' AND slot_id = ?", u.ID); n != 1 {
		t.Errorf("uncounted slot %d: %d rows and released audit rows, want the audit row only", u.ID, n)
	}
}

// TestSweepSlots: the upkeep's scan reads the expired slots in its round trip, and the sweep
// deletes those still expired with a lost audit row each and a poke per tenant; a second sweep
// of the same slots deletes nothing.
func TestSweepSlots(t *testing.T) {
	k := newFixture(t)
	st := &store.Store{}
	live := k.take("a", "p", 60)
	// c's slot did not count: it is swept like the others, and its tenant gets no poke.
	gone := []int64{k.take("a", "p", 60).ID, k.take("a", "p", 60).ID, k.take("b", "p", 60).ID, k.takeCounted(false, "c", "p", 60).ID}
	for _, id := range gone {
		k.expire(id)
	}
	hb := &store.Heartbeat{DrainerID: "d1", Host: "h", PID: 1, Version: "t", Now: k.now, PollInterval: time.Second}
	jobs, expired, err := store.ScanExpiredWithSlots(k.ctx, k.db.DB, store.ScanExpiredParams{Now: k.now, Heartbeat: hb}, 10)
	if err != nil || len(jobs) != 0 || len(expired) != 4 || expired[3] != (store.ExpiredSlot{ID: gone[3], Tenant: "c"}) || !expired[0].Counted {
		t.Fatalf("scan: %v %+v %v", jobs, expired, err)
	}
	n, err := st.SweepSlots(k.ctx, k.db.DB, k.now, "d1", expired)
	if err != nil || n != 4 {
		t.Fatalf("sweep: %d %v", n, err)
	}
	if n, err := st.SweepSlots(k.ctx, k.db.DB, k.now, "d1", expired); err != nil || n != 0 {
		t.Errorf("second sweep: %d %v", n, err)
	}
	if n := k.count("SELECT COUNT(*) FROM slots"); n != 1 {
		t.Errorf("%d slots left, want the live one %d", n, live.ID)
	}
	if n := k.count("SELECT COUNT(*) FROM audit_events WHERE event = 'slot_lost' AND actor = 'd1'"); n != 4 {
		t.Errorf("%d lost audit rows", n)
	}
	if n := k.count("SELECT COUNT(*) FROM outbox"); n != 4 {
		t.Errorf("%d outbox rows, want a poke per tenant of a counted slot (a, b) per sweep", n)
	}
	if _, expired, err = store.ScanExpiredWithSlots(k.ctx, k.db.DB, store.ScanExpiredParams{Now: k.now}, 10); err != nil || len(expired) != 0 {
		t.Errorf("scan after the sweep: %v %v", expired, err)
	}
	// A sweep of uncounted slots only writes no poke at all.
	u := k.takeCounted(false, "c", "p", 60)
	k.expire(u.ID)
	if n, err := st.SweepSlots(k.ctx, k.db.DB, k.now, "d1", []store.ExpiredSlot{{ID: u.ID, Tenant: "c"}}); err != nil || n != 1 {
		t.Errorf("sweep of an uncounted slot: %d %v", n, err)
	}
	if n := k.count("SELECT COUNT(*) FROM outbox"); n != 4 {
		t.Errorf("%d outbox rows after sweeping an uncounted slot, want 4", n)
	}
}

// TestListSlots: newest first, by tenant, a page at a time.
func TestListSlots(t *testing.T) {
	k := newFixture(t)
	a1, b1, a2 := k.take("a", "p", 60), k.take("b", "p", 60), k.take("a", "p", 60)
	page, err := store.ListSlots(k.ctx, k.db, store.SlotFilter{Limit: 2})
	if err != nil || len(page) != 2 || page[0].ID != a2.ID || page[1].ID != b1.ID {
		t.Fatalf("first page %+v %v", page, err)
	}
	page, err = store.ListSlots(k.ctx, k.db, store.SlotFilter{Tenant: "a", Before: a2.ID, Limit: 2})
	if err != nil || len(page) != 1 || page[0].ID != a1.ID || page[0].Caller != "p" || !page[0].Counted {
		t.Errorf("tenant a after %d: %+v %v", a2.ID, page, err)
	}
}
