package gate

import (
	"context"
	"database/sql"
	"strings"

	"github.com/sluicehq/sluice/gate/admitrate"
	"github.com/sluicehq/sluice/gate/sqldb"
	"github.com/sluicehq/sluice/gate/store"
)

// admissionTx is one admission transaction. Usually a store.ConnTx, so that it costs two round
// trips instead of six: the first begins the transaction, takes the tenant locks and reads the
// state, the second writes every row, learns all their ids and commits (a third commits when
// Admitter.commitWithInsert says the COMMIT must go alone). It is the runner's txConn.
//
// A batch is the exception: it begins with database/sql and inserts through server-side
// prepared statements (stmts), because the server parses a 250-row INSERT sent as text for
// much longer than it takes to bind the same rows to a prepared one. That costs its two more
// round trips and gains it about a fifth in throughput.
type admissionTx struct {
	hand *store.ConnTx

	tx    *sql.Tx // a batch's transaction
	stmts *stmtCache
}

// beginAdmission returns a transaction driven by hand; or, if stmts is not nil, a database/sql
// transaction that inserts through stmts.
func beginAdmission(ctx context.Context, db *sql.DB, stmts *stmtCache) (*admissionTx, error) {
	if stmts != nil {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		return &admissionTx{tx: tx, stmts: stmts}, nil
	}
	hand, err := store.BeginConnTx(ctx, db)
	if err != nil {
		return nil, err
	}
	return &admissionTx{hand: hand}, nil
}

// db is the transaction, for reads.
func (t *admissionTx) db() sqldb.DB {
	if t.tx != nil {
		return t.tx
	}
	return t.hand.Conn()
}

// query runs stmts in one round trip (beginning the transaction if it is driven by hand).
func (t *admissionTx) query(ctx context.Context, stmts []string, args []any) (*store.Results, error) {
	if t.tx != nil {
		rows, err := t.tx.QueryContext(ctx, strings.Join(stmts, ";"), args...)
		if err != nil {
			return nil, err
		}
		return store.ResultsOf(rows), nil
	}
	return t.hand.Query(ctx, stmts, args...)
}

// canCommitWithExec says whether exec may commit in its round trip (a transaction driven by
// hand).
func (t *admissionTx) canCommitWithExec() bool { return t.hand != nil }

// exec runs stmts (args[i] are the arguments of stmts[i]) and returns the first id each INSERT
// among them generated: in one round trip, or a batch's one statement at a time, prepared. With
// commit (only where canCommitWithExec), COMMIT goes in the same round trip.
func (t *admissionTx) exec(ctx context.Context, stmts []string, args [][]any, commit bool) ([]int64, error) {
	if t.tx != nil {
		ids := make([]int64, len(stmts))
		for i, q := range stmts {
			res, err := txStmts{c: t.stmts, tx: t.tx}.ExecContext(ctx, q, args[i]...)
			if err != nil {
				return nil, err
			}
			if ids[i], err = res.LastInsertId(); err != nil {
				return nil, err
			}
		}
		return ids, nil
	}
	var flat []any
	for _, as := range args {
		flat = append(flat, as...)
	}
	run := t.hand.Exec
	if commit {
		run = t.hand.ExecCommit
	}
	res, err := run(ctx, stmts, flat...)
	if err != nil {
		return nil, err
	}
	return res.AllLastInsertIds(), nil
}

func (t *admissionTx) commit(context.Context) error { return t.Commit() }

// Commit commits the transaction.
func (t *admissionTx) Commit() error {
	if t.tx != nil {
		return t.tx.Commit()
	}
	return t.hand.Commit()
}

// Rollback rolls the transaction back.
func (t *admissionTx) Rollback() error {
	if t.tx != nil {
		return t.tx.Rollback()
	}
	return t.hand.Rollback()
}

// close rolls back what did not commit and gives the connection back.
func (t *admissionTx) close() {
	if t.tx != nil {
		_ = t.tx.Rollback() // after a Commit, a no-op
		return
	}
	t.hand.Close()
}

// commitWithInsert says whether the COMMIT goes in the inserts' round trip, which saves an
// admission one of its three (about a tenth of single-admission throughput at 4 clients, and
// some pickup latency). The price: if the connection breaks in that round trip, the new rows'
// ids are unknown as well as the outcome. Only a rate-limit reservation needs them then (SPEC
// §5: the row is re-read by its id to keep or refund the charge), so a transaction holding one
// commits in a round trip of its own, as does a batch (see admissionTx). A test's Faults do
// not change this (see faultyTx).
func (a *Admitter) commitWithInsert(tx txConn, reservations map[string]*admitrate.Reservation) bool {
	return len(reservations) == 0 && tx.canCommitWithExec()
}
