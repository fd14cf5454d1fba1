package store_test

import (
	"bytes"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/outbox"
)

// TestGetAndPosition: a job read whole, locked only when asked; a queued job's position among
// its tenant's queued jobs in (queued_at, id) order; a missing job is ErrNotFound.
func TestGetAndPosition(t *testing.T) {
	k := newFixture(t)
	second := k.insert(jobSpec{payload: `{"x":1}`})
	first := k.insert(jobSpec{queuedAt: k.now.Add(-time.Second)})
	running := k.insert(jobSpec{status: job.Running})
	tx := k.begin()
	r, err := store.Get(k.ctx, tx, second, false)
	if err != nil || string(r.Payload) != `{"x":1}` || r.Status != job.Queued {
		t.Fatalf("get: %+v (%v)", r, err)
	}
	k.wantLocked("after a plain read", []int64{second})
	if _, err := store.Get(k.ctx, tx, second, true); err != nil {
		t.Fatal(err)
	}
	k.wantLocked("after a locking read", []int64{second, first}, second)
	if _, err := store.Get(k.ctx, tx, second+100, false); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a missing job: %v, want ErrNotFound", err)
	}
	j, err := store.WithPosition(k.ctx, tx, r.Job)
	if err != nil || j.Position == nil || *j.Position != 2 {
		t.Errorf("position of the second job: %v (%v), want 2", j.Position, err)
	}
	if j, err := store.WithPosition(k.ctx, tx, k.row(running).Job); err != nil || j.Position != nil {
		t.Errorf("a running job's position: %v (%v), want none", j.Position, err)
	}
}

// TestCancel: a queued job moves to canceled, fenced on its version, and stays locked; a job
// already canceled is returned as it is, unmoved; one in flight is not cancelable.
func TestCancel(t *testing.T) {
	k := newFixture(t)
	var log bytes.Buffer
	st := &store.Store{Log: slog.New(slog.NewTextHandler(&log, nil))}
	queued := k.insert(jobSpec{version: 2})
	running := k.insert(jobSpec{status: job.Running})
	tx := k.begin()
	r, moved, err := st.Cancel(k.ctx, tx, k.now, queued)
	if err != nil || !moved || r.Status != job.Canceled || r.Version != 3 {
		t.Fatalf("cancel: %+v moved %v (%v)", r, moved, err)
	}
	k.wantLocked("inside the cancel", []int64{queued, running}, queued)
	if _, moved, err := st.Cancel(k.ctx, tx, k.now, queued); err != nil || moved {
		t.Errorf("a second cancel: moved %v (%v), want unmoved", moved, err)
	}
	if _, _, err := st.Cancel(k.ctx, tx, k.now, running); !errors.Is(err, store.ErrNotCancelable) {
		t.Errorf("cancel of a running job: %v, want ErrNotCancelable", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if r := k.row(queued); r.Status != job.Canceled || r.FinishedAt == nil {
		t.Errorf("after commit: %+v", r)
	}
	if !strings.Contains(log.String(), "to=canceled") {
		t.Errorf("no transition logged: %s", log.String())
	}
	wantQueueState(t, k, "acme")
}

// TestExpire: the queued jobs queued before the cutoff move to expired, at most the limit, and
// stay locked with their tenants' rows; jobs another transaction holds are skipped, not waited
// for.
func TestExpire(t *testing.T) {
	k := newFixture(t)
	old := k.now.Add(-time.Hour)
	a := k.insert(jobSpec{tenant: "a", queuedAt: old})
	b := k.insert(jobSpec{tenant: "b", queuedAt: old})
	held := k.insert(jobSpec{tenant: "c", queuedAt: old})
	young := k.insert(jobSpec{tenant: "d"})
	extra := k.insert(jobSpec{tenant: "a", queuedAt: old.Add(time.Second)})
	hold := k.begin()
	if _, err := store.Get(k.ctx, hold, held, true); err != nil {
		t.Fatal(err)
	}
	tx := k.begin()
	st := &store.Store{}
	gone, err := st.Expire(k.ctx, tx, k.now, k.now.Add(-time.Minute), 3)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{a, extra, b}; !slices.Equal(ids(gone), want) { // in the claim index's order
		t.Fatalf("expired %v, want %v", ids(gone), want)
	}
	k.wantLocked("inside the expiry", []int64{a, b, young, extra}, a, b, extra)
	k.wantTenantsLocked("inside the expiry", []string{"a", "b", "d"}, "a", "b")
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if r := k.row(a); r.Status != job.Expired || r.ErrorCode == nil || *r.ErrorCode != store.ExpiredCode || r.Version != 1 {
		t.Errorf("expired job: %+v", r)
	}
	if none, err := st.Expire(k.ctx, k.db, k.now, k.now.Add(-time.Minute), 3); err != nil || len(none) != 0 {
		t.Errorf("a second expiry with the last old job held elsewhere: %v (%v)", ids(none), err)
	}
	_ = hold.Rollback()
	wantQueueState(t, k, "a", "b", "c", "d")
}

// TestConfirmStart: a dispatched job's start moves it to running, the version unchanged so the
// drainer's outcome write still matches, and locks it; the same start attempt repeated is
// accepted, any other confirmation of the started dispatch is nonce_used (SPEC §4: a dispatch
// starts at most once); a wrong or late nonce is refused with its code.
func TestConfirmStart(t *testing.T) {
	k := newFixture(t)
	st := &store.Store{}
	r := dispatched(t, k.db, k.now, "acme", "n1")
	tx := k.begin()
	got, err := st.ConfirmStart(k.ctx, tx, k.now, r.ID, "n1", "attempt-1")
	if err != nil || got.Status != job.Running || got.Version != r.Version {
		t.Fatalf("confirm: %+v (%v)", got, err)
	}
	k.wantLocked("inside the confirmation", []int64{r.ID}, r.ID)
	if _, err := st.ConfirmStart(k.ctx, tx, k.now, r.ID, "n1", "attempt-1"); err != nil {
		t.Errorf("the same start attempt repeated: %v", err)
	}
	var je *job.Error
	for _, other := range []string{"attempt-2", ""} {
		_, err := st.ConfirmStart(k.ctx, tx, k.now, r.ID, "n1", other)
		if !errors.As(err, &je) || je.Code != job.CodeNonceUsed || je.Detail["status"] != job.Running {
			t.Errorf("another start attempt %q on the started dispatch: %v, want nonce_used", other, err)
		}
	}
	if _, err := st.ConfirmStart(k.ctx, tx, k.now, r.ID, "other", "attempt-1"); !errors.As(err, &je) || je.Code != job.CodeNonceInvalid {
		t.Errorf("another nonce: %v, want nonce_invalid", err)
	}
	late := dispatched(t, k.db, k.now.Add(-time.Hour), "acme", "n2")
	if _, err := st.ConfirmStart(k.ctx, tx, k.now, late.ID, "n2", "attempt-1"); !errors.As(err, &je) || je.Code != job.CodeNonceExpired {
		t.Errorf("a late confirmation: %v, want nonce_expired", err)
	}
	// A start without a start id can never be repeated, not even by an empty one.
	anon := dispatched(t, k.db, k.now, "acme", "n3")
	if _, err := st.ConfirmStart(k.ctx, tx, k.now, anon.ID, "n3", ""); err != nil {
		t.Fatalf("a start without a start id: %v", err)
	}
	if _, err := st.ConfirmStart(k.ctx, tx, k.now, anon.ID, "n3", ""); !errors.As(err, &je) || je.Code != job.CodeNonceUsed {
		t.Errorf("that start again: %v, want nonce_used", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if row := k.row(r.ID); !bytes.Equal(row.StartSHA256, store.HashNonce("attempt-1")) || row.StartedAt == nil {
		t.Errorf("after commit: start %x at %v, want the first attempt's hash", row.StartSHA256, row.StartedAt)
	}
	if row := k.row(anon.ID); row.StartSHA256 != nil {
		t.Errorf("a start without a start id stored %x", row.StartSHA256)
	}
}

// TestConfirmStarts: a group of confirmations shares one transaction and is decided in order,
// a later one seeing an earlier one's start of the same job; each refusal is its own member's;
// the audit names each member's actor. Told not to wait, it leaves a job another transaction
// holds undecided (Locked) and does not wait for it; told to wait, an id that does not exist is
// ErrNotFound. Both forms: in the caller's transaction, and in two round trips of its own.
func TestConfirmStarts(t *testing.T) {
	for _, form := range []string{"in a transaction", "committing"} {
		t.Run(form, func(t *testing.T) {
			k := newFixture(t)
			st := &store.Store{Actor: "drainer-x"}
			confirm := func(group []*store.Start, skipLocked bool) {
				t.Helper()
				if form == "committing" {
					if err := st.ConfirmStartsCommit(k.ctx, k.db.DB, k.now, group, skipLocked); err != nil {
						t.Fatal(err)
					}
					return
				}
				tx := k.begin()
				if err := st.ConfirmStarts(k.ctx, tx, k.now, group, skipLocked); err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
			}
			a := dispatched(t, k.db, k.now, "acme", "na")
			b := dispatched(t, k.db, k.now, "acme", "nb")
			held := dispatched(t, k.db, k.now, "acme", "nh")
			hold := k.begin()
			if _, err := store.Get(k.ctx, hold, held.ID, true); err != nil {
				t.Fatal(err)
			}
			group := []*store.Start{
				{ID: b.ID, Nonce: "nb", StartID: "s1", Actor: "exec-1"},
				{ID: a.ID, Nonce: "na", StartID: "s2"},
				{ID: b.ID, Nonce: "nb", StartID: "s1", Actor: "exec-1"},
				{ID: b.ID, Nonce: "nb", StartID: "s3", Actor: "exec-2"},
				{ID: a.ID, Nonce: "wrong", StartID: "s4"},
				{ID: held.ID, Nonce: "nh", StartID: "s5"},
				{ID: 1 << 40, Nonce: "nx"},
			}
			confirm(group, true)
			var je *job.Error
			for i, want := range []job.Code{"", "", "", job.CodeNonceUsed, job.CodeNonceInvalid} {
				m := group[i]
				switch {
				case want == "" && (m.Err != nil || m.Row.Status != job.Running || m.Locked):
					t.Errorf("member %d (job %d, start %s): %+v %v, want running", i, m.ID, m.StartID, m.Row.Status, m.Err)
				case want != "" && (!errors.As(m.Err, &je) || je.Code != want):
					t.Errorf("member %d (job %d, start %s): %v, want %s", i, m.ID, m.StartID, m.Err, want)
				}
			}
			for _, m := range group[5:] {
				if !m.Locked || m.Err != nil {
					t.Errorf("job %d, held elsewhere or missing, without waiting: locked %v, %v; want undecided", m.ID, m.Locked, m.Err)
				}
			}
			if got := k.count("SELECT COUNT(*) FROM audit_events WHERE to_status = 'running'"); got != 2 {
				t.Errorf("%d start events, want 2", got)
			}
			if got := k.count("SELECT COUNT(*) FROM audit_events WHERE to_status = 'running' AND job_id = ? AND actor = 'exec-1'", b.ID) +
				k.count("SELECT COUNT(*) FROM audit_events WHERE to_status = 'running' AND job_id = ? AND actor = 'drainer-x'", a.ID); got != 2 {
				t.Errorf("the start events do not name each member's actor (or the store's for none)")
			}
			for id, hash := range map[int64]string{a.ID: "s2", b.ID: "s1"} {
				if row := k.row(id); row.Status != job.Running || !bytes.Equal(row.StartSHA256, store.HashNonce(hash)) {
					t.Errorf("job %d after commit: %s, start %x, want running with %s's hash", id, row.Status, row.StartSHA256, hash)
				}
			}
			_ = hold.Rollback()
			waited := []*store.Start{{ID: held.ID, Nonce: "nh", StartID: "s5"}, {ID: 1 << 40, Nonce: "nx"}}
			confirm(waited, false)
			if m := waited[0]; m.Err != nil || m.Row.Status != job.Running {
				t.Errorf("the job no longer held: %s %v, want running", m.Row.Status, m.Err)
			}
			if m := waited[1]; !errors.Is(m.Err, store.ErrNotFound) {
				t.Errorf("a job that does not exist: %v, want ErrNotFound", m.Err)
			}
			// A group that starts nothing writes nothing.
			refused := []*store.Start{{ID: a.ID, Nonce: "na", StartID: "other"}}
			confirm(refused, true)
			if !errors.As(refused[0].Err, &je) || je.Code != job.CodeNonceUsed {
				t.Errorf("another attempt on a started job: %v, want nonce_used", refused[0].Err)
			}
			if got := k.count("SELECT COUNT(*) FROM audit_events WHERE to_status = 'running'"); got != 3 {
				t.Errorf("%d start events, want 3", got)
			}
		})
	}
}

// TestRelease: a capacity-release poke in the caller's transaction, naming the tenant, and no
// job touched.
func TestRelease(t *testing.T) {
	k := newFixture(t)
	a := k.insert(jobSpec{status: job.Running})
	tx := k.begin()
	id, err := (&store.Store{Prefix: "px"}).Release(k.ctx, tx, k.now, "acme")
	if err != nil || id == 0 {
		t.Fatalf("release: %d (%v)", id, err)
	}
	k.wantLocked("inside the release", []int64{a})
	var subject string
	if err := tx.QueryRowContext(k.ctx, "SELECT subject FROM outbox WHERE id = ?", id).Scan(&subject); err != nil {
		t.Fatal(err)
	}
	if want := outbox.Subject("px", outbox.Release, "acme"); subject != want {
		t.Errorf("subject %q, want %q", subject, want)
	}
}

// TestLogTransition: one line per transition, with the wait and run times a dispatch gives it.
func TestLogTransition(t *testing.T) {
	var log bytes.Buffer
	st := &store.Store{Log: slog.New(slog.NewTextHandler(&log, nil))}
	now := time.Now()
	queued := now.Add(-3 * time.Second)
	dispatchedAt := now.Add(-time.Second)
	r := store.Row{Job: job.Job{ID: 7, Tenant: "acme", Status: job.Running, QueuedAt: queued, DispatchedAt: &dispatchedAt}}
	st.LogTransition(t.Context(), r, job.Failed, 3, now, "boom")
	st.LogTransition(t.Context(), store.Row{Job: job.Job{ID: 8, Status: job.Queued, QueuedAt: queued}}, job.Dispatched, 1, now, "")
	out := log.String()
	for _, want := range []string{"job_id=7", "from=running", "to=failed", "waited_ms=2000", "ran_ms=1000", "error_code=boom", "job_id=8", "to=dispatched", "waited_ms=3000"} {
		if !strings.Contains(out, want) {
			t.Errorf("log %q lacks %q", out, want)
		}
	}
	(&store.Store{}).LogTransition(t.Context(), r, job.Failed, 3, now, "") // no log: nothing to do
}
