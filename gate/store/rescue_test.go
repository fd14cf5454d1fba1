package store_test

import (
	"database/sql"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// TestScanExpired: the in-flight jobs whose lease ran out, longest expired first, at most 100,
// read without locking them; with a heartbeat, the heartbeat row is written in the same call.
func TestScanExpired(t *testing.T) {
	k := newFixture(t)
	var want []int64
	for i := range 101 {
		status := []job.Status{job.Claimed, job.Dispatched, job.Running}[i%3]
		want = append(want, k.insert(jobSpec{status: status, lease: at(k.now.Add(-time.Duration(200-i) * time.Millisecond))}))
	}
	live := k.insert(jobSpec{status: job.Running, lease: at(k.now.Add(time.Second))})
	queued := k.insert(jobSpec{})
	tx := k.begin()
	hb := &store.Heartbeat{DrainerID: "d1", Host: "h", PID: 7, Version: "v", Now: k.now, InFlight: 3, PollInterval: time.Second}
	got, err := store.ScanExpired(k.ctx, tx, store.ScanExpiredParams{Now: k.now, Heartbeat: hb})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids(got), want[:100]) {
		t.Errorf("expired %v, want the first 100 of %v", ids(got), want)
	}
	if got[0].Status != job.Claimed || got[0].Version != 0 || got[0].Payload != nil {
		t.Errorf("first expired job read as %+v, want LockColumns of a claimed job", got[0])
	}
	k.wantLocked("after the scan", append(want[:3:3], live, queued))
	var beats int
	if err := tx.QueryRowContext(k.ctx, "SELECT COUNT(*) FROM drainers WHERE id = 'd1' AND in_flight = 3").Scan(&beats); err != nil || beats != 1 {
		t.Errorf("heartbeat rows %d (%v), want 1", beats, err)
	}
	if got, err := store.ScanExpired(k.ctx, k.db, store.ScanExpiredParams{Now: k.now.Add(-time.Second)}); err != nil || len(got) != 0 {
		t.Errorf("a scan before every lease ran out: %v (%v), want none", ids(got), err)
	}
}

// TestWriteHeartbeat: the first beat inserts the drainer's row, a later one of the same process
// updates it and clears a stop, and a new process under the same id restarts started_at.
func TestWriteHeartbeat(t *testing.T) {
	k := newFixture(t)
	type row struct {
		host      string
		pid       int
		started   time.Time
		beat      time.Time
		lastClaim sql.NullTime
		inFlight  int
		pollMS    int64
		stopped   bool
	}
	read := func() row {
		t.Helper()
		var r row
		if err := k.db.QueryRowContext(k.ctx, `SELECT host, pid, started_at, heartbeat_at, last_claim_at, in_flight,
			poll_interval_ms, stopped_at IS NOT NULL FROM drainers WHERE id = 'd1'`).Scan(&r.host, &r.pid, &r.started,
			&r.beat, &r.lastClaim, &r.inFlight, &r.pollMS, &r.stopped); err != nil {
			t.Fatal(err)
		}
		return r
	}
	beat := store.Heartbeat{DrainerID: "d1", Host: "h", PID: 7, Version: "v1", Now: k.now, InFlight: 2, PollInterval: 500 * time.Millisecond}
	if err := store.WriteHeartbeat(k.ctx, k.db, beat); err != nil {
		t.Fatal(err)
	}
	if r := read(); r.host != "h" || r.pid != 7 || !r.started.Equal(k.now) || r.lastClaim.Valid || r.inFlight != 2 || r.pollMS != 500 {
		t.Errorf("first beat: %+v", r)
	}
	if err := store.MarkStopped(k.ctx, k.db, "d1", 1); err != nil {
		t.Fatal(err)
	}
	if r := read(); !r.stopped || r.inFlight != 1 {
		t.Errorf("after a stop: %+v, want stopped with 1 in flight", r)
	}
	later := k.now.Add(time.Second)
	beat.Now, beat.LastClaim = later, k.now
	if err := store.WriteHeartbeat(k.ctx, k.db, beat); err != nil {
		t.Fatal(err)
	}
	if r := read(); !r.started.Equal(k.now) || !r.beat.Equal(later) || !r.lastClaim.Time.Equal(k.now) || r.stopped {
		t.Errorf("second beat of the same process: %+v", r)
	}
	beat.PID, beat.Now = 8, later.Add(time.Second)
	if err := store.WriteHeartbeat(k.ctx, k.db, beat); err != nil {
		t.Fatal(err)
	}
	if r := read(); r.pid != 8 || !r.started.Equal(beat.Now) {
		t.Errorf("a new process under the same id: %+v, want started_at %v", r, beat.Now)
	}
}

// TestLockJobs: the jobs named, as LockColumns, locked in the ConnTx it begins; others are not.
func TestLockJobs(t *testing.T) {
	k := newFixture(t)
	a := k.insert(jobSpec{status: job.Running, version: 3, payload: "big"})
	b := k.insert(jobSpec{status: job.Dispatched, version: 1})
	c := k.insert(jobSpec{status: job.Dispatched, version: 1})
	tx := k.beginConn()
	got, err := store.LockJobs(k.ctx, tx, []int64{b, a, c + 100})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids(got), []int64{a, b}) {
		t.Fatalf("locked %v, want %v in id order", ids(got), []int64{a, b})
	}
	if got[0].Version != 3 || got[0].Status != job.Running || got[0].Payload != nil {
		t.Errorf("job a read as %+v, want version 3, running, no payload", got[0])
	}
	k.wantLocked("inside the transaction", []int64{a, b, c}, a, b)
}
