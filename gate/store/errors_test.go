package store_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// TestOperationsReportDatabaseErrors: every operation whose statement the database does not
// run returns an error wrapping the cause (here the caller's context, cancelled), so that its
// caller can tell a lost connection or a deadline from its own refusals (errors.Is), and reports
// nothing as done.
func TestOperationsReportDatabaseErrors(t *testing.T) {
	k := newFixture(t)
	queued := k.insert(jobSpec{})
	running := k.insert(jobSpec{status: job.Running, version: 1})
	st := &store.Store{}
	done, cancel := context.WithCancel(k.ctx)
	cancel()
	conn := func() *store.ConnTx { return k.beginConn() }
	adm := func() *store.AdmissionTx { return k.beginAdmission(t, nil) }
	r := k.row(running)
	fin := []store.Finishing{{Row: r, Outcome: store.Outcome{Status: job.Succeeded}}}
	ops := map[string]func(ctx context.Context) error{
		"Get": func(ctx context.Context) error { _, err := store.Get(ctx, k.db, queued, false); return err },
		"WithPosition": func(ctx context.Context) error {
			_, err := store.WithPosition(ctx, k.db, k.row(queued).Job)
			return err
		},
		"PurgeSettled":  func(ctx context.Context) error { _, err := store.PurgeSettled(ctx, k.db, k.now, 10); return err },
		"RecountQueues": func(ctx context.Context) error { return store.RecountQueues(ctx, k.db) },
		"Release":       func(ctx context.Context) error { _, err := st.Release(ctx, k.db, k.now, "acme"); return err },
		"Cancel":        func(ctx context.Context) error { _, _, err := st.Cancel(ctx, k.db, k.now, queued); return err },
		"Expire":        func(ctx context.Context) error { _, err := st.Expire(ctx, k.db, k.now, k.now, 10); return err },
		"ExpireStartDeadlines": func(ctx context.Context) error {
			_, err := st.ExpireStartDeadlines(ctx, k.db, k.now, 10)
			return err
		},
		"StartDeadlinesPassed": func(ctx context.Context) error { _, err := store.StartDeadlinesPassed(ctx, k.db, k.now); return err },
		"LockReplaceable": func(ctx context.Context) error {
			_, err := store.LockReplaceable(ctx, k.db, []store.TenantKey{{Tenant: "acme", Key: "k"}})
			return err
		},
		"RecordJobKeys": func(ctx context.Context) error {
			key := "k"
			return store.RecordJobKeys(ctx, k.db, []store.JobKeys{{ID: queued, Tenant: "acme", StartBy: &k.now, ReplaceKey: &key}})
		},
		"Replace": func(ctx context.Context) error {
			return st.Replace(ctx, k.db, k.now, []store.Replacement{{Old: k.row(queued), By: running}})
		},
		"States": func(ctx context.Context) error { _, err := store.States(ctx, k.db, []int64{queued}); return err },
		"RecentServiceTime": func(ctx context.Context) error {
			_, _, err := store.RecentServiceTime(ctx, k.db, "acme")
			return err
		},
		"ConfirmStart": func(ctx context.Context) error {
			_, err := st.ConfirmStart(ctx, k.db, k.now, running, "n", "")
			return err
		},
		"Complete": func(ctx context.Context) error {
			_, _, err := st.Complete(ctx, k.db, k.now, running, store.Completion{Nonce: "n", Status: "succeeded"})
			return err
		},
		"FinishMany": func(ctx context.Context) error { _, err := st.FinishMany(ctx, k.db, k.now, fin); return err },
		"FinishManyConn": func(ctx context.Context) error {
			_, err := st.FinishManyConn(ctx, conn(), k.now, fin)
			return err
		},
		"FinishManyCommit": func(ctx context.Context) error {
			_, err := st.FinishManyCommit(ctx, conn(), k.now, fin)
			return err
		},
		"RenewLeases": func(ctx context.Context) error {
			_, err := store.RenewLeases(ctx, k.db, store.RenewLeasesParams{Jobs: []store.JobVersion{{ID: running}}})
			return err
		},
		"ReadLeases": func(ctx context.Context) error { _, err := store.ReadLeases(ctx, k.db, []int64{running}); return err },
		"LeaseToWall": func(ctx context.Context) error {
			_, err := store.LeaseToWall(ctx, k.db, store.LeaseToWallParams{Job: store.JobVersion{ID: running}})
			return err
		},
		"ScanExpired": func(ctx context.Context) error {
			_, err := store.ScanExpired(ctx, k.db, store.ScanExpiredParams{})
			return err
		},
		"WriteHeartbeat": func(ctx context.Context) error {
			return store.WriteHeartbeat(ctx, k.db, store.Heartbeat{DrainerID: "d"})
		},
		"MarkStopped":  func(ctx context.Context) error { return store.MarkStopped(ctx, k.db, "d", 0) },
		"ReadDrainers": func(ctx context.Context) error { _, err := store.ReadDrainers(ctx, k.db, k.now); return err },
		"LockJobs":     func(ctx context.Context) error { _, err := store.LockJobs(ctx, conn(), []int64{running}); return err },
		"ReadTenantQueues": func(ctx context.Context) error {
			_, err := store.ReadTenantQueues(ctx, k.db, store.TenantQueuesParams{Limit: 1})
			return err
		},
		"ReadInFlight": func(ctx context.Context) error { _, err := store.ReadInFlight(ctx, k.db); return err },
		"ReadInFlightUsage": func(ctx context.Context) error {
			_, err := store.ReadInFlightUsage(ctx, k.db, config.Default())
			return err
		},
		"ReadQueueTotals": func(ctx context.Context) error { _, err := store.ReadQueueTotals(ctx, k.db); return err },
		"TenantsByHead":   func(ctx context.Context) error { _, err := store.TenantsByHead(ctx, k.db, 1); return err },
		"HeadsRead": func(ctx context.Context) error {
			_, err := store.NewHeadsRead(2).Read(ctx, k.db, []string{"acme"}, 1)
			return err
		},
		"QueuedRateKeys": func(ctx context.Context) error { _, err := store.QueuedRateKeys(ctx, k.db, 0); return err },
		"ListJobs": func(ctx context.Context) error {
			_, err := store.ListJobs(ctx, k.db, store.ListJobsParams{Limit: 1, StatementTimeout: time.Second})
			return err
		},
		"BeginConnTx":    func(ctx context.Context) error { _, err := store.BeginConnTx(ctx, k.db.DB); return err },
		"BeginAdmission": func(ctx context.Context) error { _, err := store.BeginAdmission(ctx, k.db.DB, nil); return err },
		"BeginAdmission, a batch": func(ctx context.Context) error {
			_, err := store.BeginAdmission(ctx, k.db.DB, store.NewStmtCache(k.db.DB))
			return err
		},
		"ReadAdmission": func(ctx context.Context) error {
			_, err := adm().ReadAdmission(ctx, store.AdmissionRead{Tenants: []string{"acme"}})
			return err
		},
		"InsertJobs": func(ctx context.Context) error {
			_, err := adm().InsertJobs(ctx, store.NewJobs{Now: k.now, Jobs: []store.NewJob{{Tenant: "acme"}}}, false)
			return err
		},
		"LockClaims": func(ctx context.Context) error { _, err := store.LockClaims(ctx, conn(), true); return err },
		"OpenClaim": func(ctx context.Context) error {
			_, err := (&store.Store{}).OpenClaim(ctx, conn(), store.ClaimParams{Jobs: []store.ClaimJob{{ID: queued, Tenant: "acme"}}})
			return err
		},
		"CommitClaim": func(ctx context.Context) error {
			return (&store.Store{}).CommitClaim(ctx, conn(), store.ClaimParams{Jobs: []store.ClaimJob{{ID: queued, Tenant: "acme"}}})
		},
		"ClaimJobs": func(ctx context.Context) error {
			_, err := (&store.Store{}).ClaimJobs(ctx, conn(), store.ClaimParams{Jobs: []store.ClaimJob{{ID: queued, Tenant: "acme"}}})
			return err
		},
		"AdvanceHeads": func(ctx context.Context) error {
			_, err := store.AdvanceHeads(ctx, k.db.DB, []string{"acme"})
			return err
		},
		"ProbeQueue": func(ctx context.Context) error { _, err := store.ProbeQueue(ctx, k.db); return err },
		"ReadTenantPage": func(ctx context.Context) error {
			_, err := store.ReadTenantPage(ctx, k.db, store.TenantPageParams{FromStart: true, Limit: 1, WithInFlight: true})
			return err
		},
		"ReadHeads": func(ctx context.Context) error {
			_, err := store.ReadHeads(ctx, k.db, store.HeadsParams{Tenants: []store.HeadsWant{{Tenant: "acme", N: 1}}})
			return err
		},
		"TakeSlot": func(ctx context.Context) error {
			_, _, err := store.TakeSlot(ctx, k.db.DB, store.TakeSlotParams{Tenant: "acme", LeaseSeconds: 60, WaitingLimit: 1,
				Decide: func(store.SlotState) store.SlotGrant { return store.SlotGrant{Grant: true, Counted: true} }})
			return err
		},
		"RenewSlot": func(ctx context.Context) error { _, err := store.RenewSlot(ctx, k.db.DB, 1, "p", false); return err },
		"ReleaseSlot": func(ctx context.Context) error {
			_, err := st.ReleaseSlot(ctx, k.db.DB, k.now, 1, "p", false)
			return err
		},
		"SweepSlots": func(ctx context.Context) error {
			_, err := st.SweepSlots(ctx, k.db.DB, k.now, "d", []store.ExpiredSlot{{ID: 1, Tenant: "acme"}})
			return err
		},
		"LiveSlots": func(ctx context.Context) error { _, err := store.LiveSlots(ctx, k.db, config.Default()); return err },
		"ListSlots": func(ctx context.Context) error {
			_, err := store.ListSlots(ctx, k.db, store.SlotFilter{Limit: 1})
			return err
		},
		"ScanExpiredWithSlots": func(ctx context.Context) error {
			_, _, err := store.ScanExpiredWithSlots(ctx, k.db.DB, store.ScanExpiredParams{}, 10)
			return err
		},
	}
	for name, op := range ops {
		if err := op(done); !errors.Is(err, context.Canceled) {
			t.Errorf("%s with its context cancelled: %v, want an error wrapping context.Canceled", name, err)
		}
	}
	if r := k.row(running); r.Status != job.Running || r.Version != 1 {
		t.Errorf("the running job changed: %+v", r)
	}
	if r := k.row(queued); r.Status != job.Queued {
		t.Errorf("the queued job changed: %+v", r)
	}
}

// TestRefusedWritesFailTheOperation: an operation whose write the database refuses (here a
// read-only transaction, after its reads went through) returns the error rather than report
// the write done.
func TestRefusedWritesFailTheOperation(t *testing.T) {
	k := newFixture(t)
	st := &store.Store{}
	queued := k.insert(jobSpec{queuedAt: k.now.Add(-time.Hour)})
	k.insert(jobSpec{status: job.Succeeded, queuedAt: k.now.Add(-time.Hour)})
	r := dispatched(t, k.db, k.now, "acme", "n1")
	readOnly := func() *sql.Tx {
		tx, err := k.db.BeginTx(k.ctx, &sql.TxOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback() })
		return tx
	}
	ops := map[string]func(tx *sql.Tx) error{
		"Cancel":       func(tx *sql.Tx) error { _, _, err := st.Cancel(k.ctx, tx, k.now, queued); return err },
		"Expire":       func(tx *sql.Tx) error { _, err := st.Expire(k.ctx, tx, k.now, k.now, 10); return err },
		"ConfirmStart": func(tx *sql.Tx) error { _, err := st.ConfirmStart(k.ctx, tx, k.now, r.ID, "n1", "s1"); return err },
		"FinishMany": func(tx *sql.Tx) error {
			_, err := st.FinishMany(k.ctx, tx, k.now, []store.Finishing{{Row: r, Outcome: store.Outcome{Status: job.Queued}}})
			return err
		},
		"PurgeSettled": func(tx *sql.Tx) error { _, err := store.PurgeSettled(k.ctx, tx, k.now, 10); return err },
	}
	for name, op := range ops {
		if err := op(readOnly()); err == nil {
			t.Errorf("%s in a read-only transaction: no error", name)
		}
	}
	if got := store.Placeholders(0); got != "" {
		t.Errorf("no placeholders: %q", got)
	}
}
