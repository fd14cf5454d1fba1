package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"

	"github.com/sluicehq/sluice/gate/sqldb"
)

// AdmissionTx is one admission transaction. Usually a ConnTx, so that it costs two round trips
// instead of six: the first begins the transaction, takes the tenant locks and reads the state
// (ReadAdmission), the second writes every row, learns all their ids and commits (InsertJobs;
// a third commits when the caller wants the COMMIT alone).
//
// A batch is the exception: it begins with database/sql and inserts through server-side
// prepared statements (a StmtCache), because the server parses a 250-row INSERT sent as text
// for much longer than it takes to bind the same rows to a prepared one. That costs its two
// more round trips and gains it about a fifth in throughput.
type AdmissionTx struct {
	hand *ConnTx

	tx    *sql.Tx // a batch's transaction
	stmts *StmtCache

	// idStep is the session's auto_increment_increment, read with the admission state (0 until
	// read): the step between the ids of one multi-row INSERT (idStepSQL).
	idStep int64
}

// BeginAdmission returns a transaction driven by hand; or, if stmts is not nil, a database/sql
// transaction that inserts through stmts.
func BeginAdmission(ctx context.Context, db *sql.DB, stmts *StmtCache) (*AdmissionTx, error) {
	if stmts != nil {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		return &AdmissionTx{tx: tx, stmts: stmts}, nil
	}
	hand, err := BeginConnTx(ctx, db)
	if err != nil {
		return nil, err
	}
	return &AdmissionTx{hand: hand}, nil
}

// DB is the transaction, for reads.
func (t *AdmissionTx) DB() sqldb.DB {
	if t.tx != nil {
		return t.tx
	}
	return t.hand.Conn()
}

// query runs stmts in one round trip (beginning the transaction if it is driven by hand).
func (t *AdmissionTx) query(ctx context.Context, stmts []string, args []any) (*Results, error) {
	if t.tx != nil {
		rows, err := t.tx.QueryContext(ctx, strings.Join(stmts, ";"), args...)
		if err != nil {
			return nil, err
		}
		return ResultsOf(rows), nil
	}
	return t.hand.Query(ctx, stmts, args...)
}

// idStepSQL reads the step between the ids one multi-row INSERT generates on this session. A
// "simple insert" (its row count known in advance) reserves its ids at once under every InnoDB
// auto-increment lock mode, first, first+step, ..., but the step is auto_increment_increment,
// not 1: Galera sets it to the cluster size (wsrep_auto_increment_control), as two-primary
// replication does by hand. A client session's own value is what InnoDB uses for its INSERTs
// (only Galera's appliers take the global one).
const idStepSQL = "@@SESSION.auto_increment_increment"

// readIDStep reads the session's id step where ReadAdmission has not.
func (t *AdmissionTx) readIDStep(ctx context.Context) (int64, error) {
	if t.idStep == 0 {
		if err := t.DB().QueryRowContext(ctx, "SELECT "+idStepSQL).Scan(&t.idStep); err != nil {
			return 0, fmt.Errorf("read auto_increment_increment: %w", err)
		}
	}
	return t.idStep, nil
}

// CanCommitWithInsert says whether InsertJobs may commit in its round trip (a transaction driven
// by hand).
func (t *AdmissionTx) CanCommitWithInsert() bool { return t.hand != nil }

// exec runs stmts (args[i] are the arguments of stmts[i]) and returns the first id each INSERT
// among them generated: in one round trip, or a batch's one statement at a time, prepared. With
// commit (only where CanCommitWithInsert), COMMIT goes in the same round trip.
func (t *AdmissionTx) exec(ctx context.Context, stmts []string, args [][]any, commit bool) ([]int64, error) {
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

// Commit commits the transaction in a round trip of its own.
func (t *AdmissionTx) Commit() error {
	if t.tx != nil {
		return t.tx.Commit()
	}
	return t.hand.Commit()
}

// Rollback rolls the transaction back.
func (t *AdmissionTx) Rollback() error {
	if t.tx != nil {
		return t.tx.Rollback()
	}
	return t.hand.Rollback()
}

// Close rolls back what did not commit and gives the connection back.
func (t *AdmissionTx) Close() {
	if t.tx != nil {
		_ = t.tx.Rollback() // after a Commit, a no-op
		return
	}
	t.hand.Close()
}

// stmtCacheSize bounds the statements kept prepared: a batch's full 250-row chunks (the jobs
// INSERT and its pokes) fit many times over, while the shapes of odd-sized last chunks fall
// through to plain execution once it is full.
const stmtCacheSize = 32

// StmtCache keeps a batch's INSERTs prepared on the database so that a transaction reuses the
// connection's prepared statement instead of preparing (one more round trip) and closing it on
// every call (see AdmissionTx). One per pool; safe for concurrent use.
type StmtCache struct {
	db *sql.DB
	mu sync.Mutex
	m  map[string]*sql.Stmt
}

// NewStmtCache returns an empty cache of statements prepared on db.
func NewStmtCache(db *sql.DB) *StmtCache { return &StmtCache{db: db, m: map[string]*sql.Stmt{}} }

// stmt returns the cached statement for query, preparing it if there is room; nil means
// "execute it unprepared".
func (c *StmtCache) stmt(ctx context.Context, query string) *sql.Stmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.m[query]; ok {
		return s
	}
	if len(c.m) >= stmtCacheSize {
		return nil
	}
	s, err := c.db.PrepareContext(ctx, query)
	if err != nil {
		return nil // the caller's own execution reports the error
	}
	c.m[query] = s
	return s
}

// txStmts runs statements of one transaction through the cache.
type txStmts struct {
	c  *StmtCache
	tx *sql.Tx
}

// ExecContext executes query in the transaction, prepared when the cache has it.
func (t txStmts) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if s := t.c.stmt(ctx, query); s != nil {
		return t.tx.StmtContext(ctx, s).ExecContext(ctx, args...)
	}
	return t.tx.ExecContext(ctx, query, args...)
}
