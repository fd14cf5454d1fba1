package gate

import (
	"context"
	"database/sql"
	"sync"
)

// stmtCacheSize bounds the statements kept prepared: a batch's full 250-row chunks (the jobs
// INSERT and its pokes) fit many times over, while the shapes of odd-sized last chunks fall
// through to plain execution once it is full.
const stmtCacheSize = 32

// stmtCache keeps a batch's INSERTs prepared on the database so that a transaction reuses the
// connection's prepared statement instead of preparing (one more round trip) and closing it on
// every call (see admissionTx). Safe for concurrent use.
type stmtCache struct {
	db *sql.DB
	mu sync.Mutex
	m  map[string]*sql.Stmt
}

func newStmtCache(db *sql.DB) *stmtCache { return &stmtCache{db: db, m: map[string]*sql.Stmt{}} }

// stmt returns the cached statement for query, preparing it if there is room; nil means
// "execute it unprepared".
func (c *stmtCache) stmt(ctx context.Context, query string) *sql.Stmt {
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
	c  *stmtCache
	tx *sql.Tx
}

// ExecContext executes query in the transaction, prepared when the cache has it.
func (t txStmts) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if s := t.c.stmt(ctx, query); s != nil {
		return t.tx.StmtContext(ctx, s).ExecContext(ctx, args...)
	}
	return t.tx.ExecContext(ctx, query, args...)
}
