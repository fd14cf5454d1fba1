package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// ConnTx is a transaction driven by hand on a connection of its own, so that it can begin
// inside its first round trip and commit inside its last: several statements go in one
// multi-statement round trip, where database/sql's Tx costs a round trip for BEGIN, one per
// statement and one for COMMIT. database/sql does not know a
// transaction is open on the connection, so Close rolls back whatever did not commit and throws
// the connection away if that rollback fails, rather than return it to the pool with a
// transaction still open. Not safe for concurrent use.
//
// On a Galera node (a pool store.Open made for one: its driver is a galeraDriver) the transaction
// runs with autocommit off and a savepoint taken at its start, which its COMMIT releases first,
// then puts autocommit back on for the next user of the connection (galeraTx). There another node's
// commit can abort the transaction in the middle of a round trip (a brute-force abort, while two
// nodes take writes); the server rolls it back and runs the round trip's remaining statements
// without it, the COMMIT too, and reports the abort only at the end. Autocommit off keeps those
// statements in a new transaction, whose RELEASE of a savepoint it does not have fails, and the
// round trip stops there, before the COMMIT: nothing of an aborted transaction commits
// (TestGaleraAbortMidRoundTrip), and Close rolls the new one back. The statements take the place
// of START TRANSACTION and join the COMMIT and ROLLBACK, so no round trip is added; elsewhere, where
// nothing aborts a transaction between two statements, they would cost about 6 us a transaction
// for nothing (integration/BENCHMARKS.md, session 29).
type ConnTx struct {
	ctx  context.Context
	conn *sql.Conn
	open bool
	sql  *txSQL
}

// BeginConnTx takes a connection from db for a transaction that its first Query or Exec begins.
// db must be an OpenMulti pool: Open's refuses several statements in one round trip.
func BeginConnTx(ctx context.Context, db *sql.DB) (*ConnTx, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	ts := &plainTx
	if _, galera := db.Driver().(galeraDriver); galera {
		ts = &galeraTx
	}
	return &ConnTx{ctx: ctx, conn: conn, sql: ts}, nil
}

// Conn is the transaction's connection, for reads inside it.
func (t *ConnTx) Conn() *sql.Conn { return t.conn }

// txSQL is how a ConnTx begins, commits and rolls back: begin's statements' results come first
// in the round trip that begins, commit's last in the one that commits.
type txSQL struct {
	begin, commit, rollback string
	beginN, commitN         int // statements in begin and commit
}

func newTxSQL(begin, commit, rollback string) txSQL {
	return txSQL{begin: begin, commit: commit, rollback: rollback,
		beginN: strings.Count(begin, ";") + 1, commitN: strings.Count(commit, ";") + 1}
}

var (
	plainTx  = newTxSQL("START TRANSACTION", "COMMIT", "ROLLBACK")
	galeraTx = newTxSQL("SET autocommit = 0;SAVEPOINT sluice_tx", "RELEASE SAVEPOINT sluice_tx;COMMIT;SET autocommit = 1",
		"ROLLBACK;SET autocommit = 1")
)

// EndsWithCommit reports whether q, a round trip a ConnTx sent, is one that commits: for the
// tests that look for it.
func EndsWithCommit(q string) bool {
	return strings.HasSuffix(q, plainTx.commit) || strings.HasSuffix(q, galeraTx.commit)
}

// begin joins stmts into a round trip, preceded by the statements that begin t if it is not open
// yet, and returns how many of those there are (their results come first).
func (t *ConnTx) begin(stmts []string) (string, int) {
	q := strings.Join(stmts, ";")
	if t.open {
		return q, 0
	}
	t.open = true
	return t.sql.begin + ";" + q, t.sql.beginN
}

// Query runs stmts (each one statement, args bound by the driver) in one round trip, the first
// call beginning the transaction. The Results hold the result sets of the statements that return
// rows, in order; the caller reads them with Next and closes them.
func (t *ConnTx) Query(ctx context.Context, stmts []string, args ...any) (*Results, error) {
	q, _ := t.begin(stmts)
	rows, err := t.conn.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return &Results{rows: rows}, nil
}

// Exec runs stmts in one round trip (the first call beginning the transaction) and returns the
// driver's result for stmts, which reports each one's rows affected and first insert id (those of
// the statements that began the transaction are dropped).
func (t *ConnTx) Exec(ctx context.Context, stmts []string, args ...any) (mysql.Result, error) {
	q, began := t.begin(stmts)
	res, err := t.exec(ctx, q, args)
	if err != nil {
		return nil, err
	}
	return only{res, began, 0}, nil
}

// ExecCommit runs stmts (none: COMMIT alone) and COMMIT in one round trip and returns the driver's
// result for stmts (as Exec; COMMIT's own is dropped too). An error means the transaction did not
// commit (the server stops at a failing statement, and Close rolls back), unless the connection
// broke, when the outcome is unknown.
func (t *ConnTx) ExecCommit(ctx context.Context, stmts []string, args ...any) (mysql.Result, error) {
	q, began := t.begin(stmts)
	if len(stmts) > 0 {
		q += ";"
	}
	res, err := t.exec(ctx, q+t.sql.commit, args)
	if err != nil {
		return nil, err
	}
	t.open = false
	return only{res, began, t.sql.commitN}, nil
}

// only is a multi-statement result without the results of its first `before` and last `after`
// statements (those that began and committed the transaction): LastInsertId and RowsAffected
// report the last statement left.
type only struct {
	mysql.Result
	before, after int
}

func (r only) AllRowsAffected() []int64 { return r.trim(r.Result.AllRowsAffected()) }

func (r only) AllLastInsertIds() []int64 { return r.trim(r.Result.AllLastInsertIds()) }

func (r only) LastInsertId() (int64, error) { return lastOf(r.AllLastInsertIds()), nil }

func (r only) RowsAffected() (int64, error) { return lastOf(r.AllRowsAffected()), nil }

func (r only) trim(v []int64) []int64 {
	if len(v) < r.before+r.after {
		return nil
	}
	return v[r.before : len(v)-r.after]
}

func lastOf(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	return v[len(v)-1]
}

// QueryCommit runs stmts and COMMIT in one round trip. The transaction has committed once the
// Results are closed without error; an error before that means it did not (the server stops at
// a failing statement, and Close rolls back), unless the connection broke after the COMMIT was
// sent, when the outcome is unknown.
func (t *ConnTx) QueryCommit(ctx context.Context, stmts []string, args ...any) (*Results, error) {
	q, _ := t.begin(stmts)
	rows, err := t.conn.QueryContext(ctx, q+";"+t.sql.commit, args...)
	if err != nil {
		return nil, err
	}
	return &Results{rows: rows, closed: func(err error) {
		if err == nil {
			t.open = false
		}
	}}, nil
}

func (t *ConnTx) exec(ctx context.Context, q string, args []any) (mysql.Result, error) {
	var out mysql.Result
	err := t.conn.Raw(func(dc any) error {
		ex, ok := dc.(driver.ExecerContext)
		if !ok {
			return errors.New("the MySQL driver connection cannot execute")
		}
		// Arguments are converted as database/sql would (a nil *time.Time becomes NULL); the
		// driver's interpolation takes only driver values.
		checker, _ := dc.(driver.NamedValueChecker)
		named := make([]driver.NamedValue, len(args))
		for i, a := range args {
			named[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
			var err error
			if checker != nil {
				err = checker.CheckNamedValue(&named[i])
			} else {
				named[i].Value, err = driver.DefaultParameterConverter.ConvertValue(a)
			}
			if err != nil {
				return fmt.Errorf("argument %d: %w", i+1, err)
			}
		}
		res, err := ex.ExecContext(ctx, q, named)
		if err != nil {
			return err
		}
		if out, ok = res.(mysql.Result); !ok {
			return errors.New("the MySQL driver did not report each statement's result")
		}
		return nil
	})
	return out, err
}

// Commit commits the transaction.
func (t *ConnTx) Commit() error {
	_, err := t.conn.ExecContext(t.ctx, t.sql.commit)
	if err == nil {
		t.open = false
	}
	return err
}

// Rollback rolls the transaction back.
func (t *ConnTx) Rollback() error {
	if !t.open {
		return nil
	}
	_, err := t.conn.ExecContext(context.WithoutCancel(t.ctx), t.sql.rollback)
	if err == nil {
		t.open = false
	}
	return err
}

// Close rolls back what did not commit (after a failed COMMIT too, where it is harmless) and
// gives the connection back, or discards it when the rollback failed.
func (t *ConnTx) Close() {
	if t.open {
		if err := t.Rollback(); err != nil {
			_ = t.conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}
	_ = t.conn.Close()
}

// Results walks the result sets of a multi-statement query, skipping those of statements that
// return no rows (the statements that begin, a lock).
type Results struct {
	rows    *sql.Rows
	started bool
	closed  func(error) // told how Close went
}

// Next positions the rows at the next result set that has columns.
func (r *Results) Next() (*sql.Rows, error) {
	for {
		if r.started && !r.rows.NextResultSet() {
			if err := r.rows.Err(); err != nil {
				return nil, err
			}
			return nil, errors.New("fewer result sets than statements")
		}
		r.started = true
		cols, err := r.rows.Columns()
		if err != nil {
			return nil, err
		}
		if len(cols) > 0 {
			return r.rows, nil
		}
	}
}

// ScanOne reads the one row of the next result set.
func (r *Results) ScanOne(dest ...any) error {
	rows, err := r.Next()
	if err != nil {
		return err
	}
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return sql.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	for rows.Next() {
	}
	return rows.Err()
}

// EachRow calls f with each job row of the next result set (selected as Columns).
func (r *Results) EachRow(f func(Row)) error {
	rows, err := r.Next()
	if err != nil {
		return err
	}
	for rows.Next() {
		row, err := ScanRow(rows)
		if err != nil {
			return err
		}
		f(row)
	}
	return rows.Err()
}

// Close reads what is left of every result set and reports the first statement that failed.
func (r *Results) Close() error {
	err := r.rows.Close()
	if err != nil {
		err = fmt.Errorf("close results: %w", err)
	} else {
		err = r.rows.Err()
	}
	if r.closed != nil {
		r.closed(err)
		r.closed = nil
	}
	return err
}

// ResultsOf walks the result sets of rows, from a multi-statement query run another way.
func ResultsOf(rows *sql.Rows) *Results { return &Results{rows: rows} }
