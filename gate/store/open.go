package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Open connects to the MySQL/MariaDB database named by dsn and adds the DSN parameters sluice
// relies on, whatever the operator wrote:
//
//   - parseTime and loc=UTC: DATETIME columns scan into time.Time, and are UTC;
//   - clientFoundRows: a fenced UPDATE reports rows matched, so "0 rows" means "lost the fence";
//   - READ COMMITTED isolation: claims and admissions take no gap locks (PITFALLS: MySQL);
//   - interpolateParams: one round trip per statement instead of prepare, execute, close;
//   - innodb_lock_wait_timeout 10 s instead of 50 s, and read/write timeouts, so that a stuck
//     server surfaces as an error instead of a hung request;
//   - on MariaDB, idle_transaction_timeout (IdleTransactionTimeout), so that a client that goes
//     silent inside a transaction does not hold its locks for hours.
//
// Its connections refuse several statements in one round trip (the driver's multiStatements is
// off, whatever the DSN says): a statement that ever took text from a request could not stack a
// second one after it. Only the transactions that truly send several go through OpenMulti's
// pool. Open pings the server and returns an error wrapping the driver's if it cannot be
// reached.
func Open(ctx context.Context, dsn string) (*sql.DB, error) {
	connector, err := Connector(ctx, dsn)
	if err != nil {
		return nil, err
	}
	db, err := OpenConnector(ctx, connector)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(PoolConns)
	db.SetMaxIdleConns(PoolConns)
	return db, nil
}

// OpenMulti is Open with multiStatements on: the pool of the transactions that send several
// statements in one round trip, and nothing else. An admission begins its transaction, locks
// and reads in one round trip and writes all its rows in a second (gate/tx.go); a claim locks,
// counts and probes in one and updates, reads back and commits in a second (drainer/claim_tx.go);
// a completion's updates and outbox row go in one (Store.FinishManyCommit); the lease scan carries
// the heartbeat. Every statement sent through it is built from constants and placeholders, never
// from a value received. Its size, MultiPoolConns, is what the single pool had: the hot paths
// keep their connections, and reads on Open's pool can no longer take them.
func OpenMulti(ctx context.Context, dsn string) (*sql.DB, error) {
	connector, err := MultiConnector(ctx, dsn)
	if err != nil {
		return nil, err
	}
	return OpenConnector(ctx, connector)
}

// PoolConns bounds Open's pool: API reads, status, configuration, the relay and the purgers.
// Reads reachable by producers are time-limited (max_statement_time), so they hold a connection
// briefly; with MultiPoolConns a process opens at most 96 connections.
const PoolConns = 32

// MultiPoolConns bounds OpenMulti's pool (OpenConnector's default).
const MultiPoolConns = 64

// Connector returns the driver connector that Open uses for dsn, with every parameter above and
// multiStatements off, for a caller that wraps the driver (a test counting statements);
// OpenConnector makes it a pool. It connects once, to learn the server's name for the isolation
// variable and whether it is a Galera node (then each connection begins with a causal wait:
// causalConnector).
func Connector(ctx context.Context, dsn string) (driver.Connector, error) {
	return connector(ctx, dsn, false)
}

// MultiConnector is OpenMulti's connector: Connector's with multiStatements on.
func MultiConnector(ctx context.Context, dsn string) (driver.Connector, error) {
	return connector(ctx, dsn, true)
}

func connector(ctx context.Context, dsn string, multi bool) (driver.Connector, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("invalid MySQL DSN: %w", err)
	}
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	cfg.ClientFoundRows = true
	// Client-side interpolation: a statement with arguments costs one round trip instead of a
	// server-side prepare, execute and close. Safe with the utf8mb4 connection charset; binary
	// values are sent as _binary literals.
	cfg.InterpolateParams = true
	// Several statements in one round trip only on the pool that needs them (OpenMulti); a DSN
	// asking for them elsewhere is overruled.
	cfg.MultiStatements = multi
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.ReadTimeout == 0 {
		cfg.ReadTimeout = 30 * time.Second
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = 30 * time.Second
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["innodb_lock_wait_timeout"] = "10"
	cfg.Params["time_zone"] = "'+00:00'"
	// MariaDB before 11.1 and MySQL 5.7 know the isolation variable as tx_isolation, MySQL 8 as
	// transaction_isolation. Try the modern name first.
	//
	// On MariaDB, a transaction left idle is also rolled back after IdleTransactionTimeout, so
	// that a process that stops talking inside one (its host cut off from the network, or
	// frozen) gives up its row locks within seconds instead of when the server notices the dead
	// connection, hours later with the default wait_timeout. It matters most for the claim lock:
	// while it is held every drainer's claim waits. No sluice transaction sits idle for more than
	// a few round trips. MySQL has no such variable and goes without.
	var lastErr error
	for _, idle := range []bool{true, false} {
		for _, name := range []string{"transaction_isolation", "tx_isolation"} {
			delete(cfg.Params, "transaction_isolation")
			delete(cfg.Params, "tx_isolation")
			delete(cfg.Params, "idle_transaction_timeout")
			cfg.Params[name] = "'READ-COMMITTED'"
			if idle {
				cfg.Params["idle_transaction_timeout"] = strconv.Itoa(int(IdleTransactionTimeout / time.Second))
			}
			connector, err := mysql.NewConnector(cfg)
			if err != nil {
				return nil, fmt.Errorf("MySQL connector: %w", err)
			}
			var galera bool
			if galera, err = tryConnect(ctx, connector); err == nil {
				if galera {
					return causalConnector{connector}, nil
				}
				return connector, nil
			}
			lastErr = fmt.Errorf("connect to MySQL at %s: %w", cfg.Addr, err)
			var me *mysql.MySQLError
			if !errors.As(err, &me) || me.Number != 1193 { // 1193: unknown system variable
				return nil, lastErr
			}
		}
	}
	return nil, lastErr
}

// IdleTransactionTimeout is how long MariaDB lets a sluice connection sit idle inside a
// transaction before it rolls the transaction back (see Connector). The longest a sluice
// transaction waits on something else is the relay's, open while JetStream acknowledges its
// batch (publisher's AckTimeout, 5 s); twice that. Not longer: a drainer frozen while it holds
// the claim lock stalls every drainer's claims until the rollback (TestDrainerFrozenPastLease).
const IdleTransactionTimeout = 10 * time.Second

// tryConnect opens one connection with connector's settings and says whether the server is a
// node of a Galera cluster (wsrep_on; MySQL, which has no such variable, is not).
func tryConnect(ctx context.Context, connector driver.Connector) (galera bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := connector.Connect(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	var v []driver.Value
	err = queryRow(ctx, conn, "SELECT @@GLOBAL.wsrep_on", &v)
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 1193 { // unknown system variable
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read wsrep_on: %w", err)
	}
	switch on := v[0].(type) {
	case []byte:
		return string(on) == "1", nil
	case int64:
		return on == 1, nil
	}
	return false, fmt.Errorf("read wsrep_on: unexpected %T", v[0])
}

// causalConnector makes each new connection to a Galera node wait, before its first statement,
// until the node has applied every transaction the cluster committed before it connected
// (wsrep_sync_wait for one statement). Galera certifies a transaction on every node before its
// COMMIT returns but applies it on the others a little later, so a node that the proxy has just
// made the writer (its predecessor killed, or back after a rejoin) can still lack the last
// transactions committed through the old one: a claim reading the jobs in flight there would
// see room that is taken, and a GET of a job just admitted would answer 404. Only new
// connections need the wait: the proxy cuts every connection to a node it takes out, and with
// one writer at a time nothing commits elsewhere once a connection has caught up. One causal
// read per connection, where wsrep_sync_wait on the session would make every read wait for a
// round of the cluster's messages; the session's own setting is put back after it. Plain SET
// statements rather than MariaDB's SET STATEMENT ... FOR, which MySQL-based Galera builds
// (Percona XtraDB Cluster) would refuse at every connection.
//
// The same statement that puts the setting back turns wsrep_retry_autocommit off on the session.
// While two nodes take writes (a proxy moving its writer cuts the old node's connections, but a
// COMMIT in flight there still lands), a transaction holding a row that another node's
// transaction changed is aborted by the applier (a brute-force abort). One aborted in the middle of
// a multi-statement round trip is rolled back, the round trip's remaining statements run without
// it, and the abort is reported at the end; with the retry on, the server ran a statement again
// instead and answered the round trip as a success: admissions answered 2xx whose jobs were never
// written (TestGaleraWriterKilled, session 29). With it off the round trip fails with a deadlock
// (1213), which every caller treats as a transaction to try again; store.ConnTx also keeps the
// statements that ran after the abort from committing (its doc, galeraTx), where in a database/sql
// transaction, which runs with autocommit, they commit one by one (TestGaleraAbortMidRoundTrip).
type causalConnector struct{ driver.Connector }

// Driver marks the pool as one of a Galera node's (db.Driver() of a *sql.DB is its connector's):
// store.ConnTx guards its transactions there (galeraTx).
func (c causalConnector) Driver() driver.Driver { return galeraDriver{c.Connector.Driver()} }

// galeraDriver is the driver of a pool whose connections go to a Galera node.
type galeraDriver struct{ driver.Driver }

// causalWaitSQL is the read that waits; its alias names it in the processlist.
const causalWaitSQL = "SELECT 1 AS sluice_caught_up"

func (c causalConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	var v []driver.Value
	for _, q := range []string{
		"SET @sluice_sync_wait = @@SESSION.wsrep_sync_wait, SESSION wsrep_sync_wait = 1",
		causalWaitSQL,
		"SET SESSION wsrep_sync_wait = @sluice_sync_wait, SESSION wsrep_retry_autocommit = 0",
	} {
		if err := queryRow(ctx, conn, q, &v); err != nil {
			conn.Close()
			return nil, fmt.Errorf("wait for the Galera node to catch up: %w", err)
		}
	}
	return conn, nil
}

// queryRow runs q on a driver connection and reads its first row, if it returns rows, into v.
func queryRow(ctx context.Context, conn driver.Conn, q string, v *[]driver.Value) error {
	qc, ok := conn.(driver.QueryerContext)
	if !ok {
		return errors.New("the MySQL driver's connection cannot query")
	}
	rows, err := qc.QueryContext(ctx, q, nil)
	if err != nil {
		return err
	}
	defer rows.Close()
	*v = make([]driver.Value, len(rows.Columns()))
	if len(*v) == 0 {
		return nil // a SET
	}
	if err := rows.Next(*v); err != nil {
		return fmt.Errorf("%s: %w", q, err)
	}
	return nil
}

// OpenConnector returns a pool of connector's connections, sized (MultiPoolConns) and aged as
// sluice runs them, after a ping.
func OpenConnector(ctx context.Context, connector driver.Connector) (*sql.DB, error) {
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(MultiPoolConns)
	db.SetMaxIdleConns(MultiPoolConns)
	db.SetConnMaxLifetime(5 * time.Minute) // below any sane wait_timeout
	db.SetConnMaxIdleTime(time.Minute)
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		db.Close()
		return nil, fmt.Errorf("connect to MySQL: %w", err)
	}
	return db, nil
}
