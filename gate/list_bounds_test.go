package gate_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/testdb"
)

// TestListBounds: a listing (which producers can run) reads only the columns a job shows, never
// the payload; each of its statements carries a server-side time limit; a page ends early,
// with a cursor, before its results pass gate.MaxListResultBytes; and a cancelled context stops
// it.
func TestListBounds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	counted, log := drainertest.CountedPool(t, db)
	adm, err := gate.New(gate.Config{DB: counted, Limits: config.NewCache(counted, nil)})
	if err != nil {
		t.Fatal(err)
	}
	const mib = 1 << 20
	result := `"` + strings.Repeat("r", mib-2) + `"` // 1 MiB of JSON
	payload := `"` + strings.Repeat("p", 200<<10) + `"`
	const n = 12
	if _, err := db.ExecContext(ctx, "INSERT INTO tenants (tenant, created_at) VALUES ('big', UTC_TIMESTAMP(6))"); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := db.ExecContext(ctx, `INSERT INTO jobs (tenant, status, queued_at, finished_at, payload, result)
			VALUES ('big', 'succeeded', ?, ?, ?, ?)`, time.Now().UTC(), time.Now().UTC(), payload, result); err != nil {
			t.Fatalf("insert %d: %v", i, err)
		}
	}
	log.Reset()
	page, next, err := adm.List(ctx, gate.ListFilter{Tenants: []string{"big"}, Limit: n})
	if err != nil {
		t.Fatal(err)
	}
	if want := gate.MaxListResultBytes / mib; len(page) != want || next != page[len(page)-1].ID {
		t.Fatalf("first page: %d jobs, cursor %d; want %d jobs (%d MiB of results) and a cursor at the last", len(page), next, want, want)
	}
	for _, j := range page {
		if string(j.Result) != result {
			t.Fatalf("job %d: result of %d bytes, want it whole", j.ID, len(j.Result))
		}
	}
	stmts := log.Take()
	if len(stmts) == 0 {
		t.Fatal("no statement logged")
	}
	for _, q := range stmts {
		if !strings.HasPrefix(q, "SET STATEMENT max_statement_time = ") {
			t.Errorf("a listing statement without a server-side time limit: %.200s", q)
		}
		if strings.Contains(q, "payload") || strings.Contains(q, "nonce_sha256") || strings.Contains(q, "idempotency_key") {
			t.Errorf("a listing statement reads columns a job does not show: %.300s", q)
		}
	}
	rest, next2, err := adm.List(ctx, gate.ListFilter{Tenants: []string{"big"}, Limit: n, Before: next})
	if err != nil {
		t.Fatal(err)
	}
	if len(rest) != n-len(page) || next2 != 0 {
		t.Errorf("second page: %d jobs, cursor %d; want the %d others and no cursor", len(rest), next2, n-len(page))
	}
	// A page is never empty for a large result: the first job always comes.
	one, _, err := adm.List(ctx, gate.ListFilter{Tenants: []string{"big"}, Limit: 1})
	if err != nil || len(one) != 1 {
		t.Errorf("a page of one: %d jobs, %v", len(one), err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := adm.List(cctx, gate.ListFilter{Tenants: []string{"big"}}); !errors.Is(err, context.Canceled) && job.ErrorCode(err) != job.CodeUnavailable {
		t.Errorf("a listing whose caller went away: %v, want it stopped", err)
	}
}
