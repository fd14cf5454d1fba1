package gate

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/sluicehq/sluice/drainer/store"
)

// Tx is what a test's Faults.Commit may do with an admission transaction.
type Tx interface {
	Commit() error
	Rollback() error
}

// admissionTx is one admission transaction on a connection of its own, driven by hand rather
// than through database/sql's Tx so that it costs three round trips instead of six: the first
// begins the transaction, takes the tenant locks and reads the state (one multi-statement
// query, migrations.Open enables them), the second writes every row and learns all their ids,
// the third commits. database/sql does not know a transaction is open on the connection, so
// close rolls back whatever did not commit, and a connection whose rollback failed is thrown
// away rather than returned to the pool with a transaction still open.
//
// A batch is the exception: it begins with database/sql and inserts through server-side
// prepared statements (stmts), because the server parses a 250-row INSERT sent as text for
// much longer than it takes to bind the same rows to a prepared one. That costs its two more
// round trips and gains it about a fifth in throughput.
type admissionTx struct {
	ctx  context.Context
	conn *sql.Conn // the by-hand transaction's connection
	open bool

	tx    *sql.Tx // a batch's transaction
	stmts *stmtCache
}

// beginAdmission returns a transaction on a connection of its own, begun by hand in its first
// round trip; or, if stmts is not nil, a database/sql transaction that inserts through stmts.
func beginAdmission(ctx context.Context, db *sql.DB, stmts *stmtCache) (*admissionTx, error) {
	if stmts != nil {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		return &admissionTx{ctx: ctx, tx: tx, stmts: stmts, open: true}, nil
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	return &admissionTx{ctx: ctx, conn: conn}, nil
}

// db is the transaction, for reads.
func (t *admissionTx) db() store.DB {
	if t.tx != nil {
		return t.tx
	}
	return t.conn
}

// query begins the transaction and runs stmts (each one statement, its arguments bound by the
// driver) in one round trip. The returned results holds the result sets of stmts' SELECTs in
// order; the caller reads each with next and closes it.
func (t *admissionTx) query(ctx context.Context, stmts []string, args []any) (*results, error) {
	if t.tx != nil {
		rows, err := t.tx.QueryContext(ctx, strings.Join(stmts, ";"), args...)
		if err != nil {
			return nil, err
		}
		return &results{rows: rows}, nil
	}
	t.open = true
	rows, err := t.conn.QueryContext(ctx, "START TRANSACTION;"+strings.Join(stmts, ";"), args...)
	if err != nil {
		return nil, err
	}
	return &results{rows: rows}, nil
}

// exec runs stmts (args[i] are the arguments of stmts[i]) and returns the first id each INSERT
// among them generated: in one round trip, or a batch's one statement at a time, prepared.
func (t *admissionTx) exec(ctx context.Context, stmts []string, args [][]any) ([]int64, error) {
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
	var named []driver.NamedValue
	for _, as := range args {
		for _, a := range as {
			named = append(named, driver.NamedValue{Ordinal: len(named) + 1, Value: a})
		}
	}
	var ids []int64
	err := t.conn.Raw(func(dc any) error {
		ex, ok := dc.(driver.ExecerContext)
		if !ok {
			return errors.New("admission: the MySQL driver connection cannot execute")
		}
		res, err := ex.ExecContext(ctx, strings.Join(stmts, ";"), named)
		if err != nil {
			return err
		}
		mr, ok := res.(mysql.Result)
		if !ok {
			return errors.New("admission: the MySQL driver did not report every insert id")
		}
		ids = mr.AllLastInsertIds()
		return nil
	})
	return ids, err
}

// Commit commits the transaction.
func (t *admissionTx) Commit() error {
	if t.tx != nil {
		err := t.tx.Commit()
		t.open = false // database/sql ends the transaction either way
		return err
	}
	_, err := t.conn.ExecContext(t.ctx, "COMMIT")
	if err == nil {
		t.open = false
	}
	return err
}

// Rollback rolls the transaction back.
func (t *admissionTx) Rollback() error {
	if !t.open {
		return nil
	}
	if t.tx != nil {
		t.open = false
		return t.tx.Rollback()
	}
	_, err := t.conn.ExecContext(context.WithoutCancel(t.ctx), "ROLLBACK")
	if err == nil {
		t.open = false
	}
	return err
}

// close rolls back what did not commit (after a failed COMMIT too, where it is harmless) and
// gives the connection back, or discards it when the rollback failed.
func (t *admissionTx) close() {
	if t.tx != nil {
		_ = t.Rollback()
		return
	}
	if t.open {
		if err := t.Rollback(); err != nil {
			_ = t.conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}
	_ = t.conn.Close()
}

// results walks the result sets of a multi-statement query, skipping those of statements that
// return no rows (START TRANSACTION, the tenant lock).
type results struct {
	rows    *sql.Rows
	started bool
}

// next positions rows at the next result set that has columns.
func (r *results) next() (*sql.Rows, error) {
	for {
		if r.started && !r.rows.NextResultSet() {
			if err := r.rows.Err(); err != nil {
				return nil, err
			}
			return nil, errors.New("admission: fewer result sets than statements")
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

// scanOne reads the one row of the next result set.
func (r *results) scanOne(dest ...any) error {
	rows, err := r.next()
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

// eachRow calls f with each job row of the next result set.
func (r *results) eachRow(f func(store.Row)) error {
	rows, err := r.next()
	if err != nil {
		return err
	}
	for rows.Next() {
		row, err := store.ScanRow(rows)
		if err != nil {
			return err
		}
		f(row)
	}
	return rows.Err()
}

func (r *results) close() error {
	if err := r.rows.Close(); err != nil {
		return fmt.Errorf("admission: %w", err)
	}
	return r.rows.Err()
}
