package store

import (
	"testing"
	"time"
)

// TestListStatement: each listing statement carries its timeout, in MariaDB's form or MySQL's
// (which only a SELECT takes, as a hint).
func TestListStatement(t *testing.T) {
	q := "SELECT id FROM jobs WHERE id < ? ORDER BY id DESC LIMIT ?"
	if got, want := listStatement(q, true, 5*time.Second), "SET STATEMENT max_statement_time = 5 FOR "+q; got != want {
		t.Errorf("MariaDB: %q, want %q", got, want)
	}
	if got, want := listStatement(q, false, 5*time.Second), "SELECT /*+ MAX_EXECUTION_TIME(5000) */ id FROM jobs WHERE id < ? ORDER BY id DESC LIMIT ?"; got != want {
		t.Errorf("MySQL: %q, want %q", got, want)
	}
}
