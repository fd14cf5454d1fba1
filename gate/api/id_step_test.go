package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/apitest"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/testdb"
	"github.com/sluicehq/sluice/outbox"
)

// TestFrontDoorIDStep is issue 32's first finding on a Galera cluster: a server whose
// auto_increment_increment is above 1 (Galera sets it to the cluster size) gives one multi-row
// INSERT ids first, first+3, ..., and an admission that derived its ids with a step of 1 told
// producers the id of a job that did not exist, or of another job. Here every session has a step
// of 3 (testdb.WithIDStep). Single admissions from eight clients at once (the combiner writes
// several in one INSERT) and a batch of two INSERTs each answer ids whose rows are the jobs they
// admitted (tenant and idempotency key), whose audit rows name them, whose enqueue pokes name
// them, and whose tenants' queue state (count and head) is exact.
func TestFrontDoorIDStep(t *testing.T) {
	f := apitest.SetupOn(t, &apitest.Env{DB: testdb.New(t).WithIDStep(t, 3)}, apitest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	type answered struct {
		id              int64
		tenant, idem    string
		pokedSeparately bool
	}
	var mu sync.Mutex
	var got []answered
	tenants := []string{"acme", "globex"}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for c := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				tenant, idem := tenants[(c+i)%2], fmt.Sprintf("single-%d-%d", c, i)
				j, _, err := f.Alpha.Admit(ctx, client.AdmitRequest{Tenant: tenant, IdempotencyKey: idem})
				if err != nil {
					errs <- fmt.Errorf("admit %s: %w", idem, err)
					return
				}
				mu.Lock()
				got = append(got, answered{id: j.ID, tenant: tenant, idem: idem, pokedSeparately: true})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	batch := make([]client.AdmitRequest, 300) // more than one INSERT's 250 rows
	for i := range batch {
		batch[i] = client.AdmitRequest{Tenant: tenants[i%2], IdempotencyKey: fmt.Sprintf("batch-%d", i)}
	}
	items, err := f.Alpha.AdmitBatch(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	for i, it := range items {
		if it.Job == nil {
			t.Fatalf("batch item %d: %+v", i, it)
		}
		got = append(got, answered{id: it.Job.ID, tenant: batch[i].Tenant, idem: batch[i].IdempotencyKey})
	}

	seen := map[int64]string{}
	for _, a := range got {
		if other, dup := seen[a.id]; dup {
			t.Errorf("id %d answered to %s and to %s", a.id, other, a.idem)
		}
		seen[a.id] = a.idem
		j, err := f.Star.Job(ctx, a.id)
		if err != nil {
			t.Errorf("%s: GET its id %d: %v", a.idem, a.id, err)
			continue
		}
		var idem string
		if err := f.DB.QueryRowContext(ctx, "SELECT idempotency_key FROM jobs WHERE id = ?", a.id).Scan(&idem); err != nil {
			t.Fatal(err)
		}
		if j.Tenant != a.tenant || idem != a.idem {
			t.Errorf("%s of %s: answered id %d, which is %s's job %s", a.idem, a.tenant, a.id, j.Tenant, idem)
		}
		var events int
		if err := f.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM audit_events WHERE job_id = ? AND event = ?",
			a.id, store.EventAdmitted).Scan(&events); err != nil || events != 1 {
			t.Errorf("%s: job %d has %d admitted events (%v), want 1", a.idem, a.id, events, err)
		}
	}

	// Every enqueue poke names a job of its own tenant; each single admission has its own.
	rows, err := f.DB.QueryContext(ctx, "SELECT subject, payload FROM outbox")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	poked := map[int64]bool{}
	for rows.Next() {
		var subject string
		var body []byte
		if err := rows.Scan(&subject, &body); err != nil {
			t.Fatal(err)
		}
		var p outbox.Poke
		if err := json.Unmarshal(body, &p); err != nil {
			t.Fatalf("poke %s: %v", body, err)
		}
		if _, ok := seen[p.JobID]; !ok {
			t.Errorf("poke %s names job %d, which no admission answered", body, p.JobID)
			continue
		}
		var tenant string
		if err := f.DB.QueryRowContext(ctx, "SELECT tenant FROM jobs WHERE id = ?", p.JobID).Scan(&tenant); err != nil || tenant != p.Tenant {
			t.Errorf("poke %s: job %d is %q's (%v)", body, p.JobID, tenant, err)
		}
		poked[p.JobID] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, a := range got {
		if a.pokedSeparately && !poked[a.id] {
			t.Errorf("%s: no enqueue poke names job %d", a.idem, a.id)
		}
	}
	drainertest.CheckTenantQueueState(t, ctx, f.DB.DB, "after the admissions")
}
