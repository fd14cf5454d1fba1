package drainertest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/testdb"
)

// CountedPool opens a second pool on db whose connections log every statement they send, closed
// when the test ends: a test hands it to a drainer (or a store) and checks, in the log, the round
// trips a step costs.
func CountedPool(t *testing.T, db *testdb.DB) (*sql.DB, *StatementLog) {
	t.Helper()
	ctx := context.Background()
	connector, err := store.MultiConnector(ctx, db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	log := &StatementLog{}
	counted, err := store.OpenConnector(ctx, countingConnector{Connector: connector, log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { counted.Close() })
	return counted, log
}

// StatementLog records the statements sent over a CountedPool's connections, one entry a round
// trip, with runs of white space made one space.
type StatementLog struct {
	mu    sync.Mutex
	stmts []string
	// before, if set, sees each round trip's statements (as logged) before they are sent.
	before func(q string)
	// longest is the longest round trip's text sent so far, as sent; with OnlyLongest, it and
	// the sizes below are all that is kept.
	longest string
	// OnlyLongest, set before the pool sends anything, keeps only the longest round trip and the
	// sizes (LongestSent, Sizes), not every statement: for a test sending many statements.
	OnlyLongest bool
	// n counts round trips; maxSent is the largest round trip once the driver interpolated its
	// arguments (an estimate: a value counts its text and two quotes).
	n, maxSent int
}

func (l *StatementLog) add(q string) { l.addSent(q, nil) }

// addSent logs q, sent with args.
func (l *StatementLog) addSent(q string, args []driver.NamedValue) {
	raw := q
	sent := len(raw)
	for _, a := range args {
		switch v := a.Value.(type) {
		case string:
			sent += len(v) + 2
		case []byte:
			sent += len(v) + 2
		case nil:
			sent += len("NULL")
		default:
			sent += len(fmt.Sprint(v)) + 2
		}
	}
	q = strings.Join(strings.Fields(q), " ")
	l.mu.Lock()
	l.n++
	l.maxSent = max(l.maxSent, sent)
	if len(raw) > len(l.longest) {
		l.longest = raw
	}
	if !l.OnlyLongest {
		l.stmts = append(l.stmts, q)
	}
	before := l.before
	l.mu.Unlock()
	if before != nil {
		before(q)
	}
}

// BeforeSending sets the function that sees each round trip (as logged) before it is sent; nil
// removes it. A test uses it to act at the moment a given statement goes out.
func (l *StatementLog) BeforeSending(f func(q string)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.before = f
}

// Reset forgets the statements logged so far (Take, discarding them).
func (l *StatementLog) Reset() { l.Take() }

// LongestSent returns the longest round trip's text sent so far.
func (l *StatementLog) LongestSent() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.longest
}

// Sizes returns the round trips logged, the longest one's text length and the largest one sent
// with its arguments, and starts counting again.
func (l *StatementLog) Sizes() (n, maxText, maxSent int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, maxText, maxSent = l.n, len(l.longest), l.maxSent
	l.n, l.longest, l.maxSent = 0, "", 0
	return n, maxText, maxSent
}

// Take returns the statements logged since the last Take or Reset, in the order sent, and
// forgets them.
func (l *StatementLog) Take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.stmts
	l.stmts = nil
	return out
}

// countingConnector wraps a MySQL driver connector so that every query and exec is logged.
type countingConnector struct {
	driver.Connector
	log *StatementLog
}

func (c countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return countingConn{conn: conn, log: c.log}, nil
}

// countingConn passes everything to the MySQL connection it wraps, which implements every
// optional interface used here.
type countingConn struct {
	conn driver.Conn
	log  *StatementLog
}

func (c countingConn) Prepare(q string) (driver.Stmt, error) { return c.conn.Prepare(q) }
func (c countingConn) Close() error                          { return c.conn.Close() }
func (c countingConn) Begin() (driver.Tx, error) {
	return c.conn.(driver.ConnBeginTx).BeginTx(context.Background(), driver.TxOptions{})
}

func (c countingConn) BeginTx(ctx context.Context, o driver.TxOptions) (driver.Tx, error) {
	c.log.add("BEGIN")
	return c.conn.(driver.ConnBeginTx).BeginTx(ctx, o)
}

func (c countingConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	c.log.add("PREPARE " + q)
	return c.conn.(driver.ConnPrepareContext).PrepareContext(ctx, q)
}

func (c countingConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	c.log.addSent(q, args)
	return c.conn.(driver.QueryerContext).QueryContext(ctx, q, args)
}

func (c countingConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	c.log.addSent(q, args)
	return c.conn.(driver.ExecerContext).ExecContext(ctx, q, args)
}

func (c countingConn) Ping(ctx context.Context) error { return c.conn.(driver.Pinger).Ping(ctx) }
func (c countingConn) CheckNamedValue(v *driver.NamedValue) error {
	return c.conn.(driver.NamedValueChecker).CheckNamedValue(v)
}
func (c countingConn) ResetSession(ctx context.Context) error {
	return c.conn.(driver.SessionResetter).ResetSession(ctx)
}
func (c countingConn) IsValid() bool { return c.conn.(driver.Validator).IsValid() }
