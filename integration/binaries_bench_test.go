package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/integration/testdb"
)

// BenchmarkDrainThroughBinaries drains the drain benchmark's queue (caps 64, 64 tenants, no-op
// jobs) through the real binaries as separate processes: `sluice serve` (API, relay and
// drainer) dispatching over HTTP to `sluice simexec`, an executor built on the kit that confirms
// each start through the API. It reports the rate, from the first dispatch to the last outcome
// by the database's clock, beside the in-process drain of the same run (SPEC §14: at least
// 0.5x; that drain sends to a no-op sender in process, which confirms no start), and the CPU
// each process spent per job over the drain: sluice, the executor, mariadbd (shared with
// anything else on it) and this test process, which holds the embedded NATS server and polls
// for the end every 50 ms (issue 31, item 6). The same drain with starts unconfirmed
// (SLUICE_EXECUTOR_CONFIRM_START=false on both) says what the /start round trip costs.
//
//	go test -run '^$' -bench DrainThroughBinaries -benchtime 1x ./integration/
func BenchmarkDrainThroughBinaries(b *testing.B) {
	const tenants, jobs = 64, 6400
	bin := harness.BuildSluice(b)
	confirmed, confirmedCPU := drainBinaries(b, bin, tenants, jobs, true)
	unconfirmed, unconfirmedCPU := drainBinaries(b, bin, tenants, jobs, false)
	inProcess, _ := drainThroughput(b, tenants, jobs, 0, false)
	inRate := float64(jobs) / inProcess.el.Seconds()
	harness.Emit("drain_binaries", map[string]any{"jobs": jobs, "tenants": tenants, "caps": binariesCaps,
		"jobs_per_s": int(confirmed), "in_process_jobs_per_s": int(inRate), "ratio_to_in_process": benchRound3(confirmed / inRate),
		"target_ratio": 0.5, "cpu_us_per_job": confirmedCPU,
		"unconfirmed_starts_jobs_per_s": int(unconfirmed), "unconfirmed_starts_cpu_us_per_job": unconfirmedCPU})
}

// drainBinaries runs one drain of jobs no-op jobs over tenants through `sluice serve` and `sluice
// simexec`, starts confirmed or not (SLUICE_EXECUTOR_CONFIRM_START for both), and returns its
// rate and the CPU each process spent per job.
// binariesCaps is the global and per-tenant cap of the drain through the binaries: its units.
const binariesCaps = 64

func drainBinaries(b *testing.B, bin string, tenants, jobs int, confirm bool) (float64, map[string]any) {
	ctx := context.Background()
	db := testdb.New(b)
	testdb.SetLimits(b, db.DB, func(c *config.Config) { c.GlobalInFlight, c.TenantInFlight = binariesCaps, binariesCaps })
	drainertest.QueueJobs(b, db, tenants, jobs)
	ns := natstest.Start(b)
	apiPort := natstest.FreePort(b)
	apiURL := fmt.Sprintf("http://127.0.0.1:%d", apiPort)
	tokens, err := json.Marshal([]map[string]any{
		{"name": "executor", "token": harness.ExecutorToken, "role": "executor"},
		{"name": "admin", "token": harness.AdminToken, "role": "admin"},
	})
	if err != nil {
		b.Fatal(err)
	}
	confirmStart := "SLUICE_EXECUTOR_CONFIRM_START=" + strconv.FormatBool(confirm)
	// Listening before sluice serve starts: a dispatch refused at connect would end as unknown.
	exec := startSimexec(b, bin, apiURL, "executor", confirmStart)
	executor := exec.proc
	var pidFile string
	if err := db.QueryRowContext(ctx, "SELECT @@pid_file").Scan(&pidFile); err != nil {
		b.Fatal(err)
	}
	cpuOf := func() []time.Duration {
		return []time.Duration{processCPU(pidFile), pidCPU(os.Getpid()), pidCPU(executor.Pid())}
	}
	starts, before := cpuOf(), snapshotWork(b, db.DB)
	serve := harness.StartProc(b, "sluice serve", bin, []string{
		"SLUICE_MYSQL_DSN=" + db.DSN, "SLUICE_NATS_URL=" + ns.URL(), fmt.Sprintf("SLUICE_LISTEN=127.0.0.1:%d", apiPort),
		"SLUICE_EXECUTOR_URL=" + exec.url, "SLUICE_EXECUTOR_SECRET=" + harness.Secret,
		confirmStart, "SLUICE_TOKENS=" + string(tokens), "SLUICE_METRICS_TOKEN=" + harness.AdminToken,
		"SLUICE_MEMCACHED=127.0.0.1:11211", "SLUICE_LOG_LEVEL=warn",
	}, "serve")
	var asked time.Time
	harness.WaitFor(b, 5*time.Minute, "every job to succeed through the binaries", func() (bool, error) {
		if serve.Exited() || executor.Exited() {
			return false, fmt.Errorf("a process exited: serve %v, executor %v", serve.Output(), executor.Output())
		}
		// The rate is read from the jobs' timestamps, so asking less often costs no precision:
		// every 50 ms, not WaitFor's 5, and whether any job is left, not how many succeeded (a
		// count of the finished jobs every 5 ms read 2.1 million rows over the drain, a third
		// of the database's time).
		if time.Since(asked) < 50*time.Millisecond {
			return false, nil
		}
		asked = time.Now()
		var left bool
		err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM jobs FORCE INDEX (claim)
			WHERE status IN ('queued','claimed','dispatched','running'))`).Scan(&left)
		return !left, err
	})
	var done int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE status = 'succeeded'").Scan(&done); err != nil || done != jobs {
		b.Fatalf("%d of %d jobs succeeded (%v)", done, jobs, err)
	}
	ends, after := append(cpuOf(), pidCPU(serve.Pid())), snapshotWork(b, db.DB)
	var span float64
	if err := db.QueryRowContext(ctx, `SELECT TIMESTAMPDIFF(MICROSECOND, MIN(dispatched_at), MAX(finished_at)) / 1e6
		FROM jobs`).Scan(&span); err != nil {
		b.Fatal(err)
	}
	phases := unitPhases(b, db, jobs)
	serve.Kill()
	executor.Kill()
	// -1: a process whose CPU time could not be read (mariadbd's pid file unreadable here).
	perJob := func(d time.Duration) float64 {
		if d < 0 {
			return -1
		}
		return round2(float64(d.Microseconds()) / float64(jobs))
	}
	spent := func(i int) time.Duration {
		if ends[i] < 0 || starts[i] < 0 {
			return -1
		}
		return ends[i] - starts[i]
	}
	cpu := map[string]any{
		"sluice_serve": perJob(ends[3]), "executor": perJob(spent(2)),
		"mariadbd": perJob(spent(0)), "test_process_with_nats": perJob(spent(1)),
	}
	total := 0.0
	for _, v := range cpu {
		total += max(v.(float64), 0)
	}
	cpu["total"] = round2(total)
	cpu["unit_ms"] = phases
	cpu["db_work"] = after.perJob(before, jobs)
	return float64(jobs) / span, cpu
}

// unitPhases says where a unit of capacity spends its time over the drain of jobs jobs, as mean
// milliseconds a job by the database's clock: from its claim to its dispatch's commit, from that
// to its confirmed start (the HTTP dispatch, the executor and /start), from there to its
// outcome's commit, and idle: the rest of the unit's cycle (binariesCaps units over the span),
// between an outcome's commit and the next claim that takes the unit.
func unitPhases(b *testing.B, db *testdb.DB, jobs int) map[string]any {
	var claim, start, outcome, cycle float64
	if err := db.QueryRowContext(context.Background(), `SELECT
		AVG(TIMESTAMPDIFF(MICROSECOND, claimed_at, dispatched_at)) / 1e3,
		AVG(TIMESTAMPDIFF(MICROSECOND, dispatched_at, COALESCE(started_at, dispatched_at))) / 1e3,
		AVG(TIMESTAMPDIFF(MICROSECOND, COALESCE(started_at, dispatched_at), finished_at)) / 1e3,
		TIMESTAMPDIFF(MICROSECOND, MIN(claimed_at), MAX(finished_at)) / 1e3 * ? / COUNT(*)
		FROM jobs`, binariesCaps).Scan(&claim, &start, &outcome, &cycle); err != nil {
		b.Fatal(err)
	}
	return map[string]any{"claim_to_dispatched": round2(claim), "dispatched_to_started": round2(start),
		"started_to_outcome": round2(outcome), "idle": round2(cycle - claim - start - outcome), "cycle": round2(cycle)}
}
