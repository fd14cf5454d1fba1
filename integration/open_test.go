package integration_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/testdb"
)

// TestOpenSetsSessionLimits: every connection store.Open makes runs at READ COMMITTED with
// a 10 s lock wait and, on MariaDB, rolls back a transaction left idle for a minute, so that a
// process gone silent inside one (a claim holding the claim lock) frees its locks soon.
func TestOpenSetsSessionLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base := testdb.New(t)
	db, err := store.Open(ctx, base.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var isolation string
	var lockWait, idle int
	err = db.QueryRowContext(ctx, "SELECT @@tx_isolation, @@innodb_lock_wait_timeout, @@idle_transaction_timeout").
		Scan(&isolation, &lockWait, &idle)
	if err != nil {
		t.Fatal(err)
	}
	if isolation != "READ-COMMITTED" || lockWait != 10 || idle != int(store.IdleTransactionTimeout.Seconds()) {
		t.Errorf("session: isolation %s, lock wait %d s, idle transaction timeout %d s; want READ-COMMITTED, 10, %d",
			isolation, lockWait, idle, int(store.IdleTransactionTimeout.Seconds()))
	}
}

// TestOpenRefusesStackedStatements: the pool every statement but the multi-statement
// transactions runs on (store.Open) refuses a second statement stacked after the first, even
// when the DSN asks for them, so a statement that ever took text from a request could not run
// another; store.OpenMulti's pool, the transactions', takes them (issue 20, item 13).
func TestOpenRefusesStackedStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base := testdb.New(t)
	cfg, err := mysql.ParseDSN(base.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MultiStatements = true
	for _, dsn := range []string{base.DSN, cfg.FormatDSN()} {
		db, err := store.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := stacked(ctx, db); err == nil {
			t.Errorf("store.Open(%q) ran two stacked statements", dsn)
		} else if me := (*mysql.MySQLError)(nil); !errors.As(err, &me) || me.Number != 1064 {
			t.Errorf("store.Open(%q): stacked statements: %v, want the server's syntax error 1064", dsn, err)
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO tenants (tenant, created_at) VALUES ('t', UTC_TIMESTAMP(6)); DELETE FROM tenants"); err == nil {
			t.Errorf("store.Open(%q) ran a stacked write", dsn)
		}
		var n int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM tenants WHERE tenant = 't'").Scan(&n); err != nil || n != 0 {
			t.Errorf("after the refused stacked write: %d rows, %v; want none", n, err)
		}
	}
	multi, err := store.OpenMulti(ctx, base.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer multi.Close()
	if err := stacked(ctx, multi); err != nil {
		t.Errorf("store.OpenMulti: stacked statements: %v", err)
	}
}

// stacked runs SELECT 1; SELECT 2 on db and reads both result sets.
func stacked(ctx context.Context, db *sql.DB) error {
	rows, err := db.QueryContext(ctx, "SELECT 1; SELECT 2")
	if err != nil {
		return err
	}
	res := store.ResultsOf(rows)
	var a, b int
	if err := errors.Join(res.ScanOne(&a), res.ScanOne(&b), res.Close()); err != nil {
		return err
	}
	if a != 1 || b != 2 {
		return fmt.Errorf("read %d and %d, want 1 and 2", a, b)
	}
	return nil
}

// TestAppConfinesStackedStatements: a process's own pool (App.DB: API reads, status, config,
// relay) refuses stacked statements, and its hot paths, which send several statements in a
// round trip on the other pool, still work: single admissions, a combined group, a batch larger
// than a group (prepared inserts), claims and completions, every job ending succeeded.
func TestAppConfinesStackedStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := harness.Start(t, harness.Options{})
	if err := stacked(ctx, env.App.DB()); err == nil {
		t.Error("the App's pool ran two stacked statements")
	}
	for i := range 3 {
		env.Admit(t, "stack-single", map[string]any{"n": i})
	}
	jobs := make([]any, 70) // above a combiner group (64): the batch's prepared inserts
	for i := range jobs {
		jobs[i] = map[string]any{"tenant": fmt.Sprintf("stack-batch-%d", i%5), "payload": map[string]any{"n": i}}
	}
	if r := env.Do(t, http.MethodPost, "/v1/jobs:batch", harness.ProducerToken, map[string]any{"jobs": jobs}); r.Status != http.StatusOK {
		t.Fatalf("batch: HTTP %d %s", r.Status, r.Raw)
	}
	harness.WaitFor(t, 60*time.Second, "every job to succeed", func() (bool, error) {
		n, err := env.CountJobs(ctx)
		return n["succeeded"] == 73 && len(n) == 1, err
	})
}
