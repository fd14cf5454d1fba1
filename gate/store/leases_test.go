package store_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// TestRenewLeases: a renewal extends the leases of the jobs the drainer holds at the versions it
// names, and only those: not a stale version, another drainer's job, a job past its wall or one
// that left flight; it never shortens a lease (a 202's, at the wall), and it locks the rows it
// changes, no others.
func TestRenewLeases(t *testing.T) {
	k := newFixture(t)
	lease := k.now.Add(5 * time.Second)
	old := k.now.Add(-time.Hour)
	held := k.insert(jobSpec{status: job.Dispatched, version: 1, lease: at(lease)})
	running := k.insert(jobSpec{status: job.Running, version: 2, lease: at(lease)})
	atWall := k.insert(jobSpec{status: job.Running, version: 1, lease: at(k.now.Add(time.Hour))})
	stale := k.insert(jobSpec{status: job.Dispatched, version: 3, lease: at(lease)})
	other := k.insert(jobSpec{status: job.Dispatched, version: 1, lease: at(lease), drainer: "d2"})
	pastWall := k.insert(jobSpec{status: job.Dispatched, version: 1, lease: at(lease), dispatched: at(old)})
	done := k.insert(jobSpec{status: job.Succeeded, version: 1})
	queued := k.insert(jobSpec{status: job.Queued, version: 1})
	all := []int64{held, running, atWall, stale, other, pastWall, done, queued}

	tx := k.begin()
	until := k.now.Add(10 * time.Second)
	n, err := store.RenewLeases(k.ctx, tx, store.RenewLeasesParams{DrainerID: "d1", Now: k.now, Until: until,
		DispatchedAfter: k.now.Add(-time.Minute), Jobs: []store.JobVersion{
			{ID: held, Version: 1}, {ID: running, Version: 2}, {ID: atWall, Version: 1}, {ID: stale, Version: 2},
			{ID: other, Version: 1}, {ID: pastWall, Version: 1}, {ID: done, Version: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Errorf("renewed %d leases, want 3 (held, running, at its wall)", n)
	}
	k.wantLocked("inside the renewal", all, held, running, atWall)
	// Nor any range: another drainer's job leaving flight, or a job entering it, goes on while
	// the renewal's transaction is open (on a status index's next-key locks it waited, and the
	// outcome writer deadlocked with the renewal).
	for _, q := range []string{"UPDATE jobs SET status = 'succeeded', lease_until = NULL WHERE id = ?",
		"UPDATE jobs SET status = 'dispatched', drainer_id = 'd2', lease_until = UTC_TIMESTAMP(6) WHERE id = ?"} {
		id := other
		if strings.Contains(q, "'dispatched'") {
			id = queued
		}
		if _, err := k.db.ExecContext(k.ctx, "SET STATEMENT innodb_lock_wait_timeout = 1 FOR "+q, id); err != nil {
			t.Errorf("job %d moved while the renewal's transaction is open: %v", id, err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id   int64
		want time.Time
	}{{held, until}, {running, until}, {atWall, k.now.Add(time.Hour)}, {stale, lease}, {pastWall, lease}} {
		if got := k.row(c.id).LeaseUntil; got == nil || !got.Equal(c.want) {
			t.Errorf("job %d: lease_until %v, want %v", c.id, got, c.want)
		}
	}
}

// TestReadLeases: the lease columns of the jobs that exist, unlocked.
func TestReadLeases(t *testing.T) {
	k := newFixture(t)
	a := k.insert(jobSpec{status: job.Running, version: 4, drainer: "d7"})
	b := k.insert(jobSpec{status: job.Queued, version: 2})
	tx := k.begin()
	got, err := store.ReadLeases(k.ctx, tx, []int64{a, b, b + 100})
	if err != nil {
		t.Fatal(err)
	}
	k.wantLocked("after the read", []int64{a, b})
	if len(got) != 2 {
		t.Fatalf("read %d leases, want 2: %+v", len(got), got)
	}
	byID := map[int64]store.Lease{got[0].ID: got[0], got[1].ID: got[1]}
	if l := byID[a]; l.Version != 4 || l.Status != job.Running || l.DrainerID != "d7" || l.DispatchedAt == nil || !l.DispatchedAt.Equal(k.now) {
		t.Errorf("job a: %+v", l)
	}
	if l := byID[b]; l.Version != 2 || l.Status != job.Queued || l.DrainerID != "" || l.DispatchedAt != nil {
		t.Errorf("job b: %+v", l)
	}
}

// TestLeaseToWall: a 202 moves the lease of the job at its claimed version to its wall and locks
// that row; a stale version, or a job no longer dispatched or running, is left as it is.
func TestLeaseToWall(t *testing.T) {
	k := newFixture(t)
	lease, wall := k.now.Add(5*time.Second), k.now.Add(time.Hour)
	accepted := k.insert(jobSpec{status: job.Dispatched, version: 1, lease: at(lease)})
	stale := k.insert(jobSpec{status: job.Dispatched, version: 2, lease: at(lease)})
	claimed := k.insert(jobSpec{status: job.Claimed, version: 1, lease: at(lease)})
	tx := k.begin()
	for _, c := range []struct {
		id    int64
		moved bool
	}{{accepted, true}, {stale, false}, {claimed, false}} {
		moved, err := store.LeaseToWall(k.ctx, tx, store.LeaseToWallParams{Job: store.JobVersion{ID: c.id, Version: 1}, Wall: wall})
		if err != nil {
			t.Fatal(err)
		}
		if moved != c.moved {
			t.Errorf("job %d: moved %v, want %v", c.id, moved, c.moved)
		}
	}
	k.wantLocked("inside the transaction", []int64{accepted, stale, claimed}, accepted)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[int64]time.Time{accepted: wall, stale: lease, claimed: lease} {
		if got := k.row(id).LeaseUntil; got == nil || !got.Equal(want) {
			t.Errorf("job %d: lease_until %v, want %v", id, got, want)
		}
	}
}
