package integration_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/outbox"
)

// TestAdmissionPokeBodies: the server builds each enqueue poke's body around the id its INSERT
// generated (gate/tx.go); every outbox row must be byte for byte the poke PokeMessage builds for
// its job, also when a batch's rejected rows sit between queued ones and spans insert chunks.
func TestAdmissionPokeBodies(t *testing.T) {
	t.Parallel()
	f := startFrontDoor(t, fdOptions{})
	ctx := context.Background()
	f.setConfig(t, map[string]any{"tenant_queue_depth": 450})
	full, open := uniqueTenant("full"), uniqueTenant(`open "q" ü`)
	f.fillQueued(t, full, 450, "queued")
	if _, _, err := f.star.Admit(ctx, client.AdmitRequest{Tenant: open}); err != nil {
		t.Fatal(err)
	}
	reqs := make([]client.AdmitRequest, 600) // three insert chunks
	for i := range reqs {
		reqs[i] = client.AdmitRequest{Tenant: open}
		if i%3 == 1 {
			reqs[i].Tenant = full // refused: a rejected row, no poke
		}
	}
	if _, err := f.star.AdmitBatch(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	rows, err := f.db.QueryContext(ctx, `SELECT o.subject, o.payload, j.id, j.tenant FROM outbox o
		JOIN jobs j ON j.id = CAST(JSON_VALUE(o.payload, '$.job_id') AS UNSIGNED) ORDER BY o.id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var subject, tenant string
		var payload []byte
		var id int64
		if err := rows.Scan(&subject, &payload, &id, &tenant); err != nil {
			t.Fatal(err)
		}
		want := outbox.PokeMessage("sluice", outbox.Enqueue, tenant, id)
		if subject != want.Subject || !bytes.Equal(payload, want.Payload) {
			t.Errorf("outbox row for job %d: %s %s, want %s %s", id, subject, payload, want.Subject, want.Payload)
		}
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var queued, boxed int
	if err := f.db.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM jobs WHERE tenant = ?), (SELECT COUNT(*) FROM outbox)", open).
		Scan(&queued, &boxed); err != nil {
		t.Fatal(err)
	}
	if queued != 401 || boxed != 401 || n != 401 {
		t.Errorf("%d queued jobs, %d outbox rows, %d matched; want 401 of each", queued, boxed, n)
	}
}

// TestAdmissionLeavesNoOpenTransaction: admission drives its transaction by hand on a pooled
// connection, so a failure at any point must still leave the connection without an open
// transaction and the tenant unlocked. The admission pool has one connection: the next use
// gets the very connection the failed admission used.
func TestAdmissionLeavesNoOpenTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	probe := startFrontDoor(t, fdOptions{})
	one, err := migrations.Open(ctx, probe.db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { one.Close() })
	one.SetMaxOpenConns(1)
	var failAt atomic.Value
	failAt.Store("")
	injected := errors.New("injected fault")
	faults := &gate.Faults{
		AfterReserve: func(context.Context) error {
			if failAt.Load() == "reserve" {
				return injected
			}
			return nil
		},
		AfterInsert: func(context.Context) error {
			if failAt.Load() == "insert" {
				return injected
			}
			return nil
		},
	}
	f := startFrontDoorOn(t, probe, fdOptions{admitDB: one, faults: faults})
	tenant := uniqueTenant("tx")
	for _, at := range []string{"reserve", "insert", "conflict"} {
		failAt.Store(at)
		body := map[string]any{"tenant": tenant, "idempotency_key": "k"}
		if at == "conflict" { // fails in the replay step, after the first round trip
			body["payload"] = "other"
		}
		r := f.do(t, http.MethodPost, "/v1/jobs", fdStarToken, body)
		failAt.Store("")
		if r.Status < 400 {
			t.Fatalf("%s: admission answered %d, want a failure", at, r.Status)
		}
		if at == "insert" {
			// The key is free again: nothing of the failed admission was committed.
			if r := f.do(t, http.MethodPost, "/v1/jobs", fdStarToken, map[string]any{"tenant": tenant, "idempotency_key": "k"}); r.Status != 202 {
				t.Fatalf("after the failed insert: %d %s", r.Status, r.Raw)
			}
		}
		var inTx int
		if err := one.QueryRowContext(ctx, "SELECT @@in_transaction").Scan(&inTx); err != nil {
			t.Fatal(err)
		}
		if inTx != 0 {
			t.Errorf("%s: the pooled connection is still in a transaction", at)
		}
		// Another connection takes the tenant's lock at once (the wait would time out in 1 s).
		conn, err := probe.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = conn.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 1")
		if err == nil {
			_, err = conn.ExecContext(ctx, fmt.Sprintf("SELECT 1 FROM tenants WHERE tenant = '%s' FOR UPDATE", tenant))
		}
		conn.Close()
		if err != nil {
			t.Errorf("%s: locking the tenant after the failed admission: %v", at, err)
		}
	}
}
