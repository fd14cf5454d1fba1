package store_test

import (
	"context"
	"database/sql"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/testdb"
)

// The conformance tests of the store's operations (River's driver tests are the model): for
// each operation, what it returns, what it fences (a stale version or state changes nothing)
// and what it locks, seen from a second connection with FOR UPDATE NOWAIT (testdb.HeldElsewhere)
// while the operation's transaction is still open. This file is their fixture.

// fixture is one test's database and clock.
type fixture struct {
	t   *testing.T
	ctx context.Context
	db  *testdb.DB
	now time.Time // the database's time when the fixture was made, at the columns' precision
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	db := testdb.New(t)
	now, err := clock.DB{DB: db.DB}.Now(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, ctx: context.Background(), db: db, now: clock.Trunc(now)}
}

// idSteps are the auto_increment_increment values the admission tests run under: one server's,
// and a 3-node Galera cluster's (testdb.WithIDStep).
var idSteps = []int{1, 3}

// newFixtureStep is newFixture whose pool's sessions ask for an auto_increment_increment of step,
// whatever the server's default, and the step they have: on a Galera cluster
// (wsrep_auto_increment_control) the cluster's size overrides what a session asks for.
func newFixtureStep(t *testing.T, step int) (*fixture, int) {
	k := newFixture(t)
	k.db = k.db.WithIDStep(t, step)
	if err := k.db.QueryRowContext(k.ctx, "SELECT @@SESSION.auto_increment_increment").Scan(&step); err != nil {
		t.Fatal(err)
	}
	return k, step
}

// jobSpec is a job row to insert; zero fields take the defaults of insert.
type jobSpec struct {
	tenant      string     // default "acme"
	status      job.Status // default queued
	version     int64
	queuedAt    time.Time // default fixture.now
	rateKey     string
	notBefore   *time.Time
	payload     string
	drainer     string     // in flight: default "d1"
	dispatched  *time.Time // in flight: default queuedAt
	lease       *time.Time // in flight: default queuedAt + 1 h
	idemKey     string
	retryOf     int64
	result      string
	finished    *time.Time // terminal: default queuedAt
	lanes       string     // stored form: sorted, comma-joined
	interactive bool
	startBy     *time.Time
	priority    *int // default job.DefaultPriority; another one is recorded in job_priorities
}

// insert writes spec as a job row (and its tenant's row if missing), recounts its tenant's
// queue state, and returns the job's id.
func (k *fixture) insert(spec jobSpec) int64 {
	k.t.Helper()
	if spec.tenant == "" {
		spec.tenant = "acme"
	}
	if spec.status == "" {
		spec.status = job.Queued
	}
	if spec.queuedAt.IsZero() {
		spec.queuedAt = k.now
	}
	var drainer, dispatched, lease, finished, rateKey, payload, idem, retryOf, result any
	if spec.status.InFlight() {
		drainer, dispatched, lease = "d1", spec.queuedAt, spec.queuedAt.Add(time.Hour)
		if spec.drainer != "" {
			drainer = spec.drainer
		}
		if spec.dispatched != nil {
			dispatched = *spec.dispatched
		}
		if spec.lease != nil {
			lease = *spec.lease
		}
	}
	if spec.status.Terminal() {
		finished = spec.queuedAt
		if spec.finished != nil {
			finished = *spec.finished
		}
	}
	if spec.rateKey != "" {
		rateKey = spec.rateKey
	}
	if spec.payload != "" {
		payload = spec.payload
	}
	if spec.idemKey != "" {
		idem = spec.idemKey
	}
	if spec.retryOf != 0 {
		retryOf = spec.retryOf
	}
	if spec.result != "" {
		result = spec.result
	}
	k.exec("INSERT IGNORE INTO tenants (tenant, created_at) VALUES (?, ?)", spec.tenant, spec.queuedAt)
	res, err := k.db.ExecContext(k.ctx, `INSERT INTO jobs (tenant, status, version, queued_at, rate_key_sha256, not_before,
		payload, drainer_id, claimed_at, dispatched_at, lease_until, finished_at, idempotency_key, retry_of, result, caller,
		lanes, interactive)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'test', ?, ?)`,
		spec.tenant, string(spec.status), spec.version, spec.queuedAt, rateKey, spec.notBefore,
		payload, drainer, dispatched, dispatched, lease, finished, idem, retryOf, result, spec.lanes, spec.interactive)
	if err != nil {
		k.t.Fatalf("insert %+v: %v", spec, err)
	}
	id, _ := res.LastInsertId()
	if spec.retryOf != 0 {
		// As an admission links a redrive (store.RecordJobKeys).
		k.exec("INSERT INTO job_redrives (retry_of, job_id) VALUES (?, ?)", spec.retryOf, id)
	}
	if spec.priority != nil {
		k.exec("UPDATE jobs SET priority = ? WHERE id = ?", *spec.priority, id)
		if *spec.priority != job.DefaultPriority {
			k.exec("INSERT INTO job_priorities (job_id, tenant, priority, queued_at) VALUES (?, ?, ?, ?)", id, spec.tenant, *spec.priority, spec.queuedAt)
		}
	}
	if spec.startBy != nil {
		k.exec("UPDATE jobs SET start_by = ? WHERE id = ?", *spec.startBy, id)
		k.exec("INSERT INTO job_deadlines (job_id, start_by) VALUES (?, ?)", id, *spec.startBy)
	}
	if err := store.RecountQueues(k.ctx, k.db, spec.tenant); err != nil {
		k.t.Fatal(err)
	}
	return id
}

func (k *fixture) exec(q string, args ...any) sql.Result {
	k.t.Helper()
	res, err := k.db.ExecContext(k.ctx, q, args...)
	if err != nil {
		k.t.Fatalf("%s: %v", q, err)
	}
	return res
}

// count runs q, a SELECT of one integer.
func (k *fixture) count(q string, args ...any) int64 {
	k.t.Helper()
	var n int64
	if err := k.db.QueryRowContext(k.ctx, q, args...).Scan(&n); err != nil {
		k.t.Fatalf("%s: %v", q, err)
	}
	return n
}

// row reads job id.
func (k *fixture) row(id int64) store.Row {
	k.t.Helper()
	r, err := store.Get(k.ctx, k.db, id, false)
	if err != nil {
		k.t.Fatal(err)
	}
	return r
}

// begin opens a database/sql transaction, rolled back when the test ends.
func (k *fixture) begin() *sql.Tx {
	k.t.Helper()
	tx, err := k.db.BeginTx(k.ctx, nil)
	if err != nil {
		k.t.Fatal(err)
	}
	k.t.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

// beginConn opens a ConnTx, closed when the test ends.
func (k *fixture) beginConn() *store.ConnTx {
	k.t.Helper()
	return beginConn(k.ctx, k.t, k.db)
}

// jobLocked reports whether another transaction holds job id's row.
func (k *fixture) jobLocked(id int64) bool {
	k.t.Helper()
	held, err := k.db.HeldElsewhere(k.ctx, "SELECT 1 FROM jobs WHERE id = ?", id)
	if err != nil {
		k.t.Fatal(err)
	}
	return held
}

// tenantLocked reports whether another transaction holds tenant's row.
func (k *fixture) tenantLocked(tenant string) bool {
	k.t.Helper()
	held, err := k.db.HeldElsewhere(k.ctx, "SELECT 1 FROM tenants WHERE tenant = ?", tenant)
	if err != nil {
		k.t.Fatal(err)
	}
	return held
}

// claimLockHeld reports whether another transaction holds the claim lock.
func (k *fixture) claimLockHeld() bool {
	k.t.Helper()
	held, err := k.db.HeldElsewhere(k.ctx, "SELECT 1 FROM claim_lock WHERE id = 1")
	if err != nil {
		k.t.Fatal(err)
	}
	return held
}

// wantLocked fails unless exactly the jobs of want among ids are held by another transaction.
func (k *fixture) wantLocked(what string, ids []int64, want ...int64) {
	k.t.Helper()
	if got := heldAmong(ids, k.jobLocked); !slices.Equal(got, want) {
		k.t.Errorf("%s: jobs locked %v, want %v (of %v)", what, got, want, ids)
	}
}

// wantTenantsLocked fails unless exactly the tenants of want among tenants are held elsewhere.
func (k *fixture) wantTenantsLocked(what string, tenants []string, want ...string) {
	k.t.Helper()
	if got := heldAmong(tenants, k.tenantLocked); !slices.Equal(got, want) {
		k.t.Errorf("%s: tenants locked %v, want %v (of %v)", what, got, want, tenants)
	}
}

// heldAmong returns the keys of all, in order, that held reports locked.
func heldAmong[K any](all []K, held func(K) bool) []K {
	var out []K
	for _, k := range all {
		if held(k) {
			out = append(out, k)
		}
	}
	return out
}

func ids(rows []store.Row) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

func at(t time.Time) *time.Time { return &t }
