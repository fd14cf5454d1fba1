// Package sqldb names the one database interface every sluice package takes: what *sql.DB,
// *sql.Tx and *sql.Conn have in common. A function that reads or writes through a DB runs in
// its caller's transaction when given one, or on the pool, and cannot tell which: that is what
// lets an outbox row, a job transition and a config read join whatever transaction their caller
// holds. It sits with the shared vocabulary, below every package that touches the database, and
// so also tells a lost connection from a refused statement (ConnectionLost) for all of them.
package sqldb

import (
	"context"
	"database/sql"
)

// DB is a pool, a transaction or a connection of database/sql.
type DB interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var (
	_ DB = (*sql.DB)(nil)
	_ DB = (*sql.Tx)(nil)
	_ DB = (*sql.Conn)(nil)
)
