package integration_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/harness"
)

// startsPerJob is an executor that finishes every job at once and counts the dispatches of each.
type startsPerJob struct {
	mu     sync.Mutex
	starts map[int64]int
}

func (s *startsPerJob) Send(_ context.Context, d executor.Dispatch) executor.Answer {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.starts == nil {
		s.starts = map[int64]int{}
	}
	s.starts[d.JobID]++
	return executor.Answer{Kind: executor.Done, Status: "succeeded"}
}

func (s *startsPerJob) count() (jobs, twice int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.starts {
		if n > 1 {
			twice++
		}
	}
	return len(s.starts), twice
}

// TestFiftyThousandTenants admits one job for each of 50,000 tenants through POST /v1/jobs:batch
// and requires every job to finish, each dispatched once (issue 17: before, a pass sent one
// sub-select per tenant with work, and at 100,000 tenants the statement outgrew the server's
// packet limit and nothing was dispatched). It is a correctness test with no timing assertion;
// it also checks that no statement the drainer sent exceeds 64 KiB (SPEC §14) and that MariaDB's
// resident memory, when the server runs on this machine, grew by less than 1 GiB.
func TestFiftyThousandTenants(t *testing.T) {
	const tenants, perBatch = 50_000, 1_000
	ctx := context.Background()
	env := harness.Start(t, harness.Options{API: true, Relay: true})
	// Through the API, so that the admitting process sees the deeper global queue at once.
	if r := env.Do(t, http.MethodPatch, "/v1/config", harness.AdminToken, map[string]any{"changes": map[string]any{
		"global_in_flight": 64, "tenant_in_flight": 64, "global_queue_depth": tenants + 1}, "note": "50,000 tenants"}); r.Status != http.StatusOK {
		t.Fatalf("PATCH /v1/config: %d %v", r.Status, r.Body)
	}
	rssBefore := mariadbRSS(t)

	for b := 0; b < tenants/perBatch; b++ {
		jobs := make([]any, perBatch)
		for i := range jobs {
			jobs[i] = map[string]any{"tenant": fmt.Sprintf("t%05d", b*perBatch+i)}
		}
		r := env.Do(t, http.MethodPost, "/v1/jobs:batch", harness.ProducerToken, map[string]any{"jobs": jobs})
		if r.Status != http.StatusOK {
			t.Fatalf("batch %d: status %d: %s", b, r.Status, r.Body)
		}
		for i, it := range r.Body["results"].([]any) {
			if st := it.(map[string]any)["status"]; st != float64(http.StatusAccepted) {
				t.Fatalf("batch %d item %d: %v", b, i, it)
			}
		}
	}
	var withWork int
	if err := env.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM tenants WHERE queued > 0").Scan(&withWork); err != nil {
		t.Fatal(err)
	}
	if withWork != tenants {
		t.Fatalf("%d tenants have queued work after admission, want %d", withWork, tenants)
	}

	pool, stmts := drainertest.CountedPool(t, env.DB)
	stmts.OnlyLongest = true
	exec := &startsPerJob{}
	d, err := drainer.New(drainer.Config{DB: pool, Executor: exec, ID: "fifty-thousand"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Stop(ctx) }) // after Run has returned: cleanups run last first
	drainertest.Run(t, d)

	harness.WaitFor(t, 10*time.Minute, "every tenant's job to succeed", func() (bool, error) {
		var left int
		err := env.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE status <> 'succeeded'").Scan(&left)
		return left == 0, err
	})
	jobs, twice := exec.count()
	if jobs != tenants || twice != 0 {
		t.Fatalf("the executor saw %d jobs (want %d), %d of them more than once", jobs, tenants, twice)
	}
	if longest := stmts.LongestSent(); len(longest) > 64<<10 {
		t.Fatalf("the drainer sent a statement of %d bytes (limit 64 KiB): %.300s", len(longest), longest)
	}
	drainertest.CheckTenantQueueState(t, ctx, env.DB.DB, "after the drain")
	if rssBefore > 0 {
		grew := mariadbRSS(t) - rssBefore
		t.Logf("MariaDB resident memory grew by %d MiB", grew>>20)
		if grew > 1<<30 {
			t.Fatalf("MariaDB's resident memory grew by %d MiB draining %d tenants", grew>>20, tenants)
		}
	}
}

// mariadbRSS returns the resident memory of the MariaDB (or MySQL) server on this machine, or 0
// when none runs here (the test server is elsewhere) and memory cannot be watched.
func mariadbRSS(t *testing.T) int64 {
	t.Helper()
	comms, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, c := range comms {
		name, err := os.ReadFile(c)
		if err != nil {
			continue
		}
		switch strings.TrimSpace(string(name)) {
		case "mariadbd", "mysqld":
		default:
			continue
		}
		rss, err := vmRSS(filepath.Join(filepath.Dir(c), "status"))
		if os.IsNotExist(err) {
			continue // the process ended since the glob
		}
		if err != nil {
			t.Fatalf("read MariaDB's VmRSS: %v", err)
		}
		return rss
	}
	return 0
}

// vmRSS returns the resident memory (VmRSS) in a /proc/<pid>/status file, in bytes.
func vmRSS(status string) (int64, error) {
	raw, err := os.ReadFile(status)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if kb, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(kb), "kB")), 10, 64)
			return n << 10, err
		}
	}
	return 0, fmt.Errorf("%s: no VmRSS line", status)
}
