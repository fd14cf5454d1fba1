package integration_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/apitest"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/publishertest"
	"github.com/sluicehq/sluice/integration/testdb"
	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/outbox"
	"github.com/sluicehq/sluice/publisher"
)

// TestProducerEventsCommitWithTheProducersTransaction: a completion and a release written with
// gate.Completer and publisher.Producer roll back with the producer's own change, and commit with it.
func TestProducerEventsCommitWithTheProducersTransaction(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE TABLE sandboxes (id INT PRIMARY KEY, state VARCHAR(16))"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO sandboxes VALUES (1, 'running')"); err != nil {
		t.Fatal(err)
	}
	id, err := apitest.DispatchedJob(ctx, db.DB, "acme", "nonce-1")
	if err != nil {
		t.Fatal(err)
	}
	prod, err := publisher.NewProducer(publisher.ProducerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	comp, err := gate.NewCompleter(gate.CompleterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	write := func(tx *sql.Tx) {
		t.Helper()
		if _, err := tx.ExecContext(ctx, "UPDATE sandboxes SET state = 'stopped' WHERE id = 1"); err != nil {
			t.Fatal(err)
		}
		j, err := comp.Complete(ctx, tx, id, gate.Completion{Nonce: "nonce-1", Status: "succeeded"})
		if err != nil || j.Status != job.Succeeded {
			t.Fatalf("complete = %s, %v", j.Status, err)
		}
		if _, err := prod.Release(ctx, tx, "acme"); err != nil {
			t.Fatal(err)
		}
	}
	state := func() (string, string, int64) {
		t.Helper()
		var sandbox, status string
		if err := db.QueryRowContext(ctx, "SELECT state FROM sandboxes WHERE id = 1").Scan(&sandbox); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRowContext(ctx, "SELECT status FROM jobs WHERE id = ?", id).Scan(&status); err != nil {
			t.Fatal(err)
		}
		return sandbox, status, publishertest.CountOutbox(t, db, "subject = '"+outbox.Subject("sluice", outbox.Release, "acme")+"'")
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	write(tx)
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if s, st, n := state(); s != "running" || st != "dispatched" || n != 0 {
		t.Fatalf("after rollback: sandbox %s, job %s, %d release rows; want nothing changed", s, st, n)
	}

	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	write(tx)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if s, st, n := state(); s != "stopped" || st != "succeeded" || n != 2 {
		t.Fatalf("after commit: sandbox %s, job %s, %d release rows; want stopped, succeeded, 2 (completion + release)", s, st, n)
	}

	// A second report with another nonce is fenced off and writes nothing.
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := comp.Complete(ctx, tx, id, gate.Completion{Nonce: "other", Status: "failed"}); job.ErrorCode(err) != job.CodeDispatchVoid {
		t.Fatalf("a completion with another nonce = %v, want dispatch_void", err)
	}
	if _, err := prod.Release(ctx, tx, ""); job.ErrorCode(err) != job.CodeInvalidRequest {
		t.Fatalf("a release without tenant = %v, want invalid_request", err)
	}
}

// TestReleaseOverHTTP: POST /v1/releases writes a release event that the relay publishes; bad
// input is a 400 that writes nothing, and a producer token may not call it.
func TestReleaseOverHTTP(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{API: true, Relay: true})
	ctx := context.Background()
	c := client.New(env.URL, harness.ExecutorToken)
	id, err := c.Release(ctx, "initech.*> x")
	if err != nil {
		t.Fatal(err)
	}
	var subject string
	if err := env.DB.QueryRowContext(ctx, "SELECT subject FROM outbox WHERE id = ?", id).Scan(&subject); err != nil {
		t.Fatal(err)
	}
	if want := outbox.Subject("sluice", outbox.Release, "initech.*> x"); subject != want {
		t.Fatalf("release subject %q, want %q", subject, want)
	}
	harness.WaitFor(t, 10*time.Second, "the release to be published", func() (bool, error) {
		var published bool
		err := env.DB.QueryRowContext(ctx, "SELECT published_at > "+outbox.Unpublished+" FROM outbox WHERE id = ?", id).Scan(&published)
		return published, err
	})
	for _, body := range []any{[]byte(`{"tenant": 7}`), []byte(`{"tenant": ""}`), []byte(`{not json`), map[string]any{"tenant": "a\u0001b"}} {
		r := env.Do(t, http.MethodPost, "/v1/releases", harness.ExecutorToken, body)
		if r.Status != http.StatusBadRequest || r.Body["error_code"] != "invalid_request" {
			t.Errorf("POST /v1/releases %s = HTTP %d %s, want 400 invalid_request", body, r.Status, r.Raw)
		}
	}
	if r := env.Do(t, http.MethodPost, "/v1/releases", harness.ProducerToken, map[string]any{"tenant": "acme"}); r.Status != http.StatusForbidden {
		t.Errorf("a producer token got HTTP %d, want 403", r.Status)
	}
	if n := publishertest.CountOutbox(t, env.DB, "1"); n != 1 {
		t.Fatalf("%d outbox rows, want only the one valid release", n)
	}
	// The relay counts a publication just after its commit, so the counter may trail the row.
	harness.WaitFor(t, 10*time.Second, "/metrics to show the outbox drained and one publication", func() (bool, error) {
		m := env.Do(t, http.MethodGet, "/metrics", "", nil)
		for _, line := range []string{"sluice_outbox_unpublished 0", "sluice_outbox_oldest_unpublished_age_seconds 0",
			"sluice_outbox_set_aside 0", "sluice_relay_published_total 1"} {
			if !strings.Contains(string(m.Raw), "\n"+line+"\n") {
				return false, fmt.Errorf("/metrics lacks %q", line)
			}
		}
		return true, nil
	})
}

// Example_producer shows a producer that shares sluice's database (an executor that records
// outcomes itself) reporting a job's outcome and a freed sandbox inside its own transaction: the
// completion, the release events and its own change commit together or not at all, and the
// relay publishes the events after the commit.
func Example_producer() {
	ctx := context.Background()
	db, done, err := exampleDatabase(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer done()
	// What a drainer leaves behind: job dispatched to this executor with nonce "n-1".
	id, err := apitest.DispatchedJob(ctx, db, "acme", "n-1")
	if err != nil {
		fmt.Println(err)
		return
	}

	prod, err := publisher.NewProducer(publisher.ProducerConfig{})
	if err != nil {
		fmt.Println(err)
		return
	}
	comp, err := gate.NewCompleter(gate.CompleterConfig{})
	if err != nil {
		fmt.Println(err)
		return
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = tx.Rollback() }()
	// ... the producer's own writes in tx (its run record, its sandbox table) go here ...
	j, err := comp.Complete(ctx, tx, id, gate.Completion{Nonce: "n-1", Status: "succeeded"})
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := prod.Release(ctx, tx, "acme"); err != nil { // a sandbox of acme stopped
		fmt.Println(err)
		return
	}
	if err := tx.Commit(); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("job", j.Status)
	// Output: job succeeded
}

// exampleDatabase creates a migrated database of its own for an example (tests use testdb.New).
func exampleDatabase(ctx context.Context) (*sql.DB, func(), error) {
	cfg, err := mysql.ParseDSN(testdb.ServerDSN())
	if err != nil {
		return nil, nil, err
	}
	admin, err := store.Open(ctx, cfg.FormatDSN())
	if err != nil {
		return nil, nil, err
	}
	name := fmt.Sprintf("sluice_ex_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		admin.Close()
		return nil, nil, err
	}
	drop := func() {
		_, _ = admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name)
		admin.Close()
	}
	cfg.DBName = name
	db, err := store.Open(ctx, cfg.FormatDSN())
	if err != nil {
		drop()
		return nil, nil, err
	}
	if _, err := migrations.Up(ctx, db, nil); err != nil {
		db.Close()
		drop()
		return nil, nil, err
	}
	return db, func() { db.Close(); drop() }, nil
}
