package integration_test

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice/gate/store"
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
