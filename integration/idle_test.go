package integration_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/testdb"
)

// TestIdleDrainerRoundTrips pins what an idle drainer asks of the database, which is most of
// its CPU (SPEC §14: under 0.1 % of a core with the 1 Hz poll): each poll of an empty queue is
// two round trips, the lone-job probe and the heartbeat sent with the expired-lease scan, and
// no runtime config read. Passes are driven one at a time on a fake clock a poll period apart.
func TestIdleDrainerRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	counted, log := countedPool(t, db)
	clk := clock.NewFake(time.Now())
	d, err := drainer.New(drainer.Config{DB: counted, Executor: refusingSender{}, Clock: clk, ID: "idle"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop(ctx)
	// The first pass reads the runtime config (nothing has yet); the later ones need not.
	if _, err := d.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		clk.Advance(time.Second)
		log.reset()
		if _, err := d.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		got := log.take()
		if len(got) != 2 || !strings.Contains(got[0], "FORCE INDEX (claim) WHERE status = 'queued' LIMIT 2") ||
			!strings.HasPrefix(got[1], "INSERT INTO drainers") || !strings.Contains(got[1], "lease_until < ") {
			t.Errorf("idle pass %d sent %d round trips, want the lone-job probe and the heartbeat with the lease scan:\n%s",
				i+1, len(got), strings.Join(got, "\n---\n"))
		}
		// The heartbeat in that round trip was written.
		var beat time.Time
		if err := db.QueryRowContext(ctx, "SELECT heartbeat_at FROM drainers WHERE id = 'idle'").Scan(&beat); err != nil {
			t.Fatal(err)
		}
		if now, _ := clk.Now(ctx); !beat.Equal(now) {
			t.Errorf("idle pass %d: heartbeat at %s, want the pass's time %s", i+1, beat, now)
		}
	}
}

// refusingSender fails the test if anything is dispatched.
type refusingSender struct{}

func (refusingSender) Send(context.Context, executor.Dispatch) executor.Answer {
	panic("an idle drainer dispatched a job")
}

// countedPool opens a second pool on db whose connections log every statement they send, closed
// when the test ends.
func countedPool(t *testing.T, db *testdb.DB) (*sql.DB, *statementLog) {
	t.Helper()
	ctx := context.Background()
	connector, err := store.MultiConnector(ctx, db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	log := &statementLog{}
	counted, err := store.OpenConnector(ctx, countingConnector{Connector: connector, log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { counted.Close() })
	return counted, log
}

// statementLog records the statements sent over a countingConnector's connections, one entry a
// round trip.
type statementLog struct {
	mu    sync.Mutex
	stmts []string
	// before, if set, sees each round trip's statements (as logged) before they are sent.
	before func(q string)
	// longest is the longest round trip's text sent so far, as sent; with onlyLongest, it and
	// the sizes below are all that is kept (a test sending many statements).
	longest     string
	onlyLongest bool
	// n counts round trips; maxSent is the largest round trip once the driver interpolated its
	// arguments (an estimate: a value counts its text and two quotes).
	n, maxSent int
}

func (l *statementLog) add(q string) { l.addSent(q, nil) }

// addSent logs q, sent with args.
func (l *statementLog) addSent(q string, args []driver.NamedValue) {
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
	if !l.onlyLongest {
		l.stmts = append(l.stmts, q)
	}
	before := l.before
	l.mu.Unlock()
	if before != nil {
		before(q)
	}
}

// beforeSending sets the function that sees each round trip before it is sent.
func (l *statementLog) beforeSending(f func(q string)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.before = f
}

func (l *statementLog) reset() { l.take() }

// longestSent returns the longest round trip's text sent so far.
func (l *statementLog) longestSent() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.longest
}

// sizes returns the round trips logged, the longest one's text length and the largest one sent
// with its arguments, and starts counting again.
func (l *statementLog) sizes() (n, maxText, maxSent int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, maxText, maxSent = l.n, len(l.longest), l.maxSent
	l.n, l.longest, l.maxSent = 0, "", 0
	return n, maxText, maxSent
}

func (l *statementLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.stmts
	l.stmts = nil
	return out
}

// countingConnector wraps a MySQL driver connector so that every query and exec is logged.
type countingConnector struct {
	driver.Connector
	log *statementLog
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
	log  *statementLog
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
