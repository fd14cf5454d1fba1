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
// (admissionTx), which a test's Faults wrap (faultyTx).
type txConn interface {
	Tx
	// db is the transaction, for reads.
	db() sqldb.DB
	// query runs stmts in one round trip (the first beginning the transaction).
	query(ctx context.Context, stmts []string, args []any) (*store.Results, error)
	// canCommitWithExec says whether exec may commit in its round trip.
	canCommitWithExec() bool
	// exec runs the INSERTs stmts and returns the first id each generated; with commit, the
	// COMMIT goes in the same round trip.
	exec(ctx context.Context, stmts []string, args [][]any, commit bool) ([]int64, error)
	// commit commits in a round trip of its own.
	commit(ctx context.Context) error
	// close rolls back what did not commit and gives the connection back.
	close()
}

// withFaults returns tx with a's Faults at its boundary, or tx itself when there are none.
func (a *Admitter) withFaults(tx txConn) txConn {
	if f := a.cfg.Faults; f != nil && (f.AfterInsert != nil || f.Commit != nil) {
		return &faultyTx{txConn: tx, f: f}
	}
	return tx
}

// faultyTx runs a test's AfterInsert and Commit hooks around the round trips of the
// transaction it wraps, sending exactly the round trips that transaction would.
type faultyTx struct {
	txConn
	f           *Faults
	afterInsert bool // AfterInsert has run
}

func (t *faultyTx) exec(ctx context.Context, stmts []string, args [][]any, commit bool) ([]int64, error) {
	if !commit {
		ids, err := t.txConn.exec(ctx, stmts, args, false)
		if err != nil {
			return nil, err
		}
		return ids, t.runAfterInsert(ctx)
	}
	// The inserts and the COMMIT are one round trip: the hooks go around it.
	if err := t.runAfterInsert(ctx); err != nil {
		return nil, err
	}
	if t.f.Commit == nil {
		return t.txConn.exec(ctx, stmts, args, true)
	}
	c := &combinedCommit{ctx: ctx, tx: t.txConn, stmts: stmts, args: args}
	if err := t.f.Commit(ctx, c); err != nil {
		return nil, err
	}
	if !c.sent {
		return nil, errors.New("Faults.Commit rolled back and reported no error")
	}
	return c.ids, c.err
}

func (t *faultyTx) commit(ctx context.Context) error {
	if err := t.runAfterInsert(ctx); err != nil { // a transaction that inserted nothing
		return err
	}
	if t.f.Commit != nil {
		return t.f.Commit(ctx, t.txConn)
	}
	return t.txConn.commit(ctx)
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
	ctx   context.Context
	tx    txConn
	stmts []string
	args  [][]any

	sent bool
	ids  []int64
	err  error
}

func (c *combinedCommit) Commit() error {
	c.sent = true
	c.ids, c.err = c.tx.exec(c.ctx, c.stmts, c.args, true)
	return c.err
}

func (c *combinedCommit) Rollback() error { return c.tx.Rollback() }
