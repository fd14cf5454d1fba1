package gate

import (
	"context"
	"errors"

	"github.com/sluicehq/sluice/gate/sqldb"
	"github.com/sluicehq/sluice/gate/store"
)

// Faults are deterministic fault-injection points for tests. A nil *Faults and nil fields do
// nothing; production code never sets them. They sit at the runner's boundaries and never
// change what it sends: a transaction with Faults makes the same round trips as one without.
type Faults struct {
	// AfterReserve runs after the rate-limit reservation, between the transaction's read and
	// its writes; an error aborts the admission there.
	AfterReserve func(ctx context.Context) error
	// AfterInsert runs after the round trip that inserted the job rows, before the COMMIT's own
	// round trip. Where the COMMIT goes in the inserts' round trip (see commitWithInsert), it
	// runs before that round trip instead, and its error stands for that round trip's: the
	// statements are not sent, and the runner answers as it would had the connection failed
	// during them with that error (outcome_unknown for a lost connection).
	AfterInsert func(ctx context.Context) error
	// Commit replaces the COMMIT: it may commit or roll back and then report any error, which
	// is how a test makes a COMMIT's outcome unknown. Where the COMMIT goes in the inserts'
	// round trip, tx.Commit sends that whole round trip and tx.Rollback ends the transaction
	// instead of sending it; an error then stands for that round trip's.
	Commit func(ctx context.Context, tx Tx) error
}

// Tx is what a test's Faults.Commit may do with an admission transaction.
type Tx interface {
	Commit() error
	Rollback() error
}

// txConn is the runner's database boundary: the round trips of one admission transaction
// (store.AdmissionTx), which a test's Faults wrap (faultyTx).
type txConn interface {
	Tx
	// DB is the transaction, for reads.
	DB() sqldb.DB
	// ReadAdmission begins the transaction, locks the tenants and reads the state, in one round
	// trip.
	ReadAdmission(ctx context.Context, p store.AdmissionRead) (store.AdmissionState, error)
	// CanCommitWithInsert says whether InsertJobs may commit in its round trip.
	CanCommitWithInsert() bool
	// InsertJobs writes the rows and returns their ids; with commit, the COMMIT goes in the same
	// round trip.
	InsertJobs(ctx context.Context, p store.NewJobs, commit bool) (store.InsertedJobs, error)
	// Close rolls back what did not commit and gives the connection back.
	Close()
}

// withFaults returns tx with a's Faults at its boundary, or tx itself when there are none. ctx is
// the transaction's, for the hooks of its COMMIT.
func (a *Admitter) withFaults(ctx context.Context, tx txConn) txConn {
	if f := a.cfg.Faults; f != nil && (f.AfterInsert != nil || f.Commit != nil) {
		return &faultyTx{txConn: tx, ctx: ctx, f: f}
	}
	return tx
}

// faultyTx runs a test's AfterInsert and Commit hooks around the round trips of the
// transaction it wraps, sending exactly the round trips that transaction would.
type faultyTx struct {
	txConn
	ctx         context.Context
	f           *Faults
	afterInsert bool // AfterInsert has run
}

func (t *faultyTx) InsertJobs(ctx context.Context, p store.NewJobs, commit bool) (store.InsertedJobs, error) {
	if !commit {
		got, err := t.txConn.InsertJobs(ctx, p, false)
		if err != nil {
			return got, err
		}
		return got, t.runAfterInsert(ctx)
	}
	// The inserts and the COMMIT are one round trip: the hooks go around it.
	if err := t.runAfterInsert(ctx); err != nil {
		return store.InsertedJobs{}, err
	}
	if t.f.Commit == nil {
		return t.txConn.InsertJobs(ctx, p, true)
	}
	c := &combinedCommit{ctx: ctx, tx: t.txConn, jobs: p}
	if err := t.f.Commit(ctx, c); err != nil {
		return store.InsertedJobs{}, err
	}
	if !c.sent {
		return store.InsertedJobs{}, errors.New("Faults.Commit rolled back and reported no error")
	}
	return c.got, c.err
}

func (t *faultyTx) Commit() error {
	if err := t.runAfterInsert(t.ctx); err != nil { // a transaction that inserted nothing
		return err
	}
	if t.f.Commit != nil {
		return t.f.Commit(t.ctx, t.txConn)
	}
	return t.txConn.Commit()
}

func (t *faultyTx) runAfterInsert(ctx context.Context) error {
	if t.afterInsert || t.f.AfterInsert == nil {
		return nil
	}
	t.afterInsert = true
	return t.f.AfterInsert(ctx)
}

// combinedCommit is the Tx a Faults.Commit hook gets where the COMMIT goes with the inserts:
// Commit sends that round trip.
type combinedCommit struct {
	ctx  context.Context
	tx   txConn
	jobs store.NewJobs

	sent bool
	got  store.InsertedJobs
	err  error
}

func (c *combinedCommit) Commit() error {
	c.sent = true
	c.got, c.err = c.tx.InsertJobs(c.ctx, c.jobs, true)
	return c.err
}

func (c *combinedCommit) Rollback() error { return c.tx.Rollback() }
