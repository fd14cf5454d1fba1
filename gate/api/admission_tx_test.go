package api_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/apitest"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/outbox"
)

// TestAdmissionPokeBodies: the server builds each enqueue poke's body around the id its INSERT
// generated (store.AdmissionTx.InsertJobs); every outbox row must be byte for byte the poke
// PokeMessage builds for its job. A batch writes one poke per tenant, on the tenant's last queued job, wherever that
// job falls among the insert chunks and the rejected rows between queued ones.
func TestAdmissionPokeBodies(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	ctx := context.Background()
	f.SetConfig(t, map[string]any{"tenant_queue_depth": 450})
	full, open := apitest.UniqueTenant("full"), apitest.UniqueTenant(`open "q" ü`)
	early, middle := apitest.UniqueTenant("early"), apitest.UniqueTenant("middle")
	f.FillQueued(t, full, 450, "queued")
	single, _, err := f.Star.Admit(ctx, client.AdmitRequest{Tenant: open})
	if err != nil {
		t.Fatal(err)
	}
	reqs := make([]client.AdmitRequest, 600) // three insert chunks of 250
	for i := range reqs {
		switch {
		case i%3 == 1:
			reqs[i].Tenant = full // refused: a rejected row, no poke
		case i < 100 && i%3 == 2:
			reqs[i].Tenant = early // last job in the first chunk
		case i >= 240 && i < 300 && i%3 == 2:
			reqs[i].Tenant = middle // last job in the second chunk
		default:
			reqs[i].Tenant = open
		}
	}
	res, err := f.Star.AdmitBatch(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	lastJob := map[string]int64{open: single.ID} // each tenant's newest queued job
	for i, r := range res {
		if r.Status == 202 {
			lastJob[reqs[i].Tenant] = r.Job.ID
		}
	}
	if len(lastJob) != 3 {
		t.Fatalf("batch queued jobs of %d tenants, want 3: %v", len(lastJob), lastJob)
	}
	rows, err := f.DB.QueryContext(ctx, `SELECT o.subject, o.payload, j.id, j.tenant FROM outbox o
		JOIN jobs j ON j.id = CAST(JSON_VALUE(o.payload, '$.job_id') AS UNSIGNED) ORDER BY o.id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var poked []int64
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
		poked = append(poked, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// The single admission's poke, then the batch's: early, middle and open, in insert order.
	want := []int64{single.ID, lastJob[early], lastJob[middle], lastJob[open]}
	var boxed int
	if err := f.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox").Scan(&boxed); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(poked) != fmt.Sprint(want) || boxed != len(want) {
		t.Errorf("%d outbox rows poke jobs %v, want %v", boxed, poked, want)
	}
}

// TestAdmissionRoundTrips: a single admission takes two database round trips, the COMMIT going
// with the inserts (gate's commitWithInsert); one holding an admission rate-limit reservation
// takes three, so that an unknown COMMIT outcome can still be settled by re-reading the new row
// by its id (SPEC §5).
func TestAdmissionRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	probe := apitest.Setup(t, apitest.Options{}) // only for its database
	counted, log := drainertest.CountedPool(t, probe.DB)
	f := apitest.SetupOn(t, probe, apitest.Options{AdmitDB: counted, Memcached: "127.0.0.1:11211"})
	limited := apitest.UniqueTenant("limited")
	for _, c := range []struct {
		tenant string
		trips  int
	}{
		{apitest.UniqueTenant("free"), 2}, // the inserts and COMMIT in one
		{limited, 3},                      // COMMIT alone
	} {
		if c.tenant == limited {
			f.SetConfig(t, map[string]any{"admission_rate_per_minute": 100})
		}
		log.Reset()
		if _, _, err := f.Star.Admit(ctx, client.AdmitRequest{Tenant: c.tenant}); err != nil {
			t.Fatal(err)
		}
		trips := log.Take()
		if len(trips) != c.trips || !store.EndsWithCommit(trips[len(trips)-1]) ||
			!strings.Contains(trips[len(trips)-1-(c.trips-2)], "INSERT INTO jobs") {
			t.Errorf("admission for %s: %d round trips, want %d ending with the inserts' and then COMMIT:\n%s",
				c.tenant, len(trips), c.trips, strings.Join(trips, "\n---\n"))
		}
	}
	if n, err := f.Limiter.Count(limited, f.Time()); err != nil || n != 1 {
		t.Errorf("the limited tenant's admission was charged %d times (%v), want 1", n, err)
	}
}

// TestAdmissionFaultsKeepRoundTrips: fault hooks sit around the runner's round trips and never
// change them: an admission with Faults set takes the same two round trips as in production,
// the inserts and COMMIT in one, and a fault in that round trip answers as production would
// when the connection breaks there: outcome_unknown, not retryable for an unkeyed request, the
// job committed or not as the server left it.
func TestAdmissionFaultsKeepRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	probe := apitest.Setup(t, apitest.Options{}) // only for its database
	counted, log := drainertest.CountedPool(t, probe.DB)
	var fault atomic.Value
	fault.Store("")
	var afterInsert atomic.Int32
	faults := &gate.Faults{
		AfterInsert: func(context.Context) error {
			afterInsert.Add(1)
			return nil
		},
		Commit: func(_ context.Context, tx gate.Tx) error {
			name, _ := fault.Load().(string)
			return apitest.CommitWithFault(tx, name)
		},
	}
	f := apitest.SetupOn(t, probe, apitest.Options{AdmitDB: counted, Faults: faults})
	for _, c := range []struct {
		fault  string
		status int
		jobs   int
	}{
		{"", 202, 1},
		{"commit-lost", 503, 1},
		{"commit-rolled-back", 503, 0},
	} {
		fault.Store(c.fault)
		tenant := apitest.UniqueTenant("faulted")
		log.Reset()
		afterInsert.Store(0)
		r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": tenant})
		trips := log.Take()
		fault.Store("")
		if r.Status != c.status || (c.status == 503 && (r.Body["error_code"] != "outcome_unknown" || r.Body["retryable"] != false)) {
			t.Errorf("fault %q: HTTP %d %s, want %d (outcome_unknown, not retryable, on 503)", c.fault, r.Status, r.Raw, c.status)
		}
		if afterInsert.Load() != 1 {
			t.Errorf("fault %q: AfterInsert ran %d times, want 1", c.fault, afterInsert.Load())
		}
		// The read, then the inserts with COMMIT; where the fault rolls back instead, the
		// ROLLBACK goes in place of that round trip.
		last, what := "INSERT INTO jobs", "the inserts' ending with COMMIT"
		if c.fault == "commit-rolled-back" {
			last, what = "ROLLBACK", "ROLLBACK"
		}
		if len(trips) != 2 || !strings.HasPrefix(trips[1], last) || (c.fault != "commit-rolled-back" && !store.EndsWithCommit(trips[1])) {
			t.Errorf("fault %q: %d round trips, want 2, the second %s:\n%s",
				c.fault, len(trips), what, strings.Join(trips, "\n---\n"))
		}
		var jobs int
		if err := f.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE tenant = ?", tenant).Scan(&jobs); err != nil {
			t.Fatal(err)
		}
		if jobs != c.jobs {
			t.Errorf("fault %q: %d jobs, want %d", c.fault, jobs, c.jobs)
		}
	}
}

// TestAdmissionLeavesNoOpenTransaction: admission drives its transaction by hand on a pooled
// connection, so a failure at any point must still leave the connection without an open
// transaction and the tenant unlocked. The admission pool has one connection: the next use
// gets the very connection the failed admission used.
func TestAdmissionLeavesNoOpenTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	probe := apitest.Setup(t, apitest.Options{})
	one, err := store.OpenMulti(ctx, probe.DB.DSN)
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
	f := apitest.SetupOn(t, probe, apitest.Options{AdmitDB: one, Faults: faults})
	tenant := apitest.UniqueTenant("tx")
	for _, at := range []string{"reserve", "insert", "conflict"} {
		failAt.Store(at)
		body := map[string]any{"tenant": tenant, "idempotency_key": "k"}
		if at == "conflict" { // fails in the replay step, after the first round trip
			body["payload"] = "other"
		}
		r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, body)
		failAt.Store("")
		if r.Status < 400 {
			t.Fatalf("%s: admission answered %d, want a failure", at, r.Status)
		}
		if at == "insert" {
			// The key is free again: nothing of the failed admission was committed.
			if r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": tenant, "idempotency_key": "k"}); r.Status != 202 {
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
		conn, err := probe.DB.Conn(ctx)
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
