package integration_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/harness"
)

// waitersBench is the number of concurrent waiters BenchmarkWaiters holds (issue 34: 1,000).
const waitersBench = 1000

// BenchmarkWaiters: 1,000 producers wait on GET /v1/jobs/{id}?wait=60 for 1,000 jobs held
// queued; then the jobs run (no-op) and each waiter's answer is timed from the executor's
// receipt of its job, which answers at once. Reports the latency's p50/p99, and what the parked
// waiters cost over an idle window of a few seconds: the test process's CPU (sluice and the
// 1,000 clients) and mariadbd's per second, and the database's statements per second, beside
// the same window without waiters.
func BenchmarkWaiters(b *testing.B) {
	for range b.N {
		benchWaiters(b)
	}
}

func benchWaiters(b *testing.B) {
	b.StopTimer()
	var mu sync.Mutex
	received := map[int64]time.Time{}
	env := harness.Start(b, harness.Options{MaxConns: 4 * waitersBench, MaxConnsPerSource: 4 * waitersBench,
		OnReceive: func(id int64, _ string, at time.Time) {
			mu.Lock()
			received[id] = at
			mu.Unlock()
		}})
	ctx := context.Background()
	env.SetConfig(b, func(c *config.Config) { c.GlobalInFlight, c.TenantInFlight = 0, 64 })
	var jobs []map[string]any
	for i := range waitersBench {
		jobs = append(jobs, map[string]any{"tenant": fmt.Sprintf("t%02d", i%50), "payload": map[string]any{}})
	}
	r := env.Do(b, http.MethodPost, "/v1/jobs:batch", harness.ProducerToken, map[string]any{"jobs": jobs})
	if r.Status != http.StatusOK {
		b.Fatalf("batch: %d %s", r.Status, r.Raw)
	}
	var ids []int64
	for _, it := range r.Body["results"].([]any) {
		ids = append(ids, int64(it.(map[string]any)["job"].(map[string]any)["id"].(float64)))
	}
	if len(ids) != waitersBench {
		b.Fatalf("%d jobs admitted", len(ids))
	}
	var pidFile string
	if err := env.DB.QueryRowContext(ctx, "SELECT @@pid_file").Scan(&pidFile); err != nil {
		b.Fatal(err)
	}
	raw, err := os.ReadFile(pidFile)
	if err != nil {
		b.Fatalf("mariadbd's pid file: %v", err)
	}
	dbPid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		b.Fatalf("mariadbd's pid file: %v", err)
	}
	questions := func() int64 {
		var name string
		var n int64
		if err := env.DB.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Questions'").Scan(&name, &n); err != nil {
			b.Fatal(err)
		}
		return n
	}
	// idle measures a window of the running process: CPU per second of this process and of
	// mariadbd, and statements per second (the server's, which other tests' share when run
	// beside them: run the benchmark alone).
	idle := func() (self, db, stmts float64) {
		const window = 5 * time.Second
		// /proc/PID/stat (ticks of 10 ms, over a window of seconds) rather than the threads'
		// schedstat: a thread that exits in the window takes its time with it.
		c0, d0, q0 := pidCPU(os.Getpid()), pidCPU(dbPid), questions()
		<-time.After(window) // a measuring window, not a wait for anything
		c1, d1, q1 := pidCPU(os.Getpid()), pidCPU(dbPid), questions()
		per := window.Seconds() * 1000 // CPU in ms a second
		return round2(float64((c1 - c0).Microseconds()) / per), round2(float64((d1 - d0).Microseconds()) / per), round2(float64(q1-q0) / window.Seconds())
	}
	baseSelf, baseDB, baseStmts := idle()

	// The client retries a wait answered 503 busy: 1,000 requests at once pass MaxRequests while
	// they authenticate and read their job, before each becomes a waiter and gives its slot back.
	cl := client.New(env.URL, harness.ProducerToken)
	cl.HTTP = &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: waitersBench}}
	type answer struct {
		id     int64
		at     time.Time
		status string
		err    error
	}
	answers := make(chan answer, waitersBench)
	for _, id := range ids {
		go func() {
			j, err := cl.Wait(ctx, id)
			answers <- answer{id: id, at: time.Now(), status: string(j.Status), err: err}
		}()
	}
	untilWaiting(b, env.URL, waitersBench)
	self, db, stmts := idle()

	b.StartTimer()
	env.SetConfig(b, func(c *config.Config) { c.GlobalInFlight = 64 })
	var lat, toCommit, fromCommit []time.Duration
	answered := map[int64]time.Time{}
	for range waitersBench {
		a := <-answers
		if a.err != nil || a.status != "succeeded" {
			b.Fatalf("waiter of job %d: %q %v", a.id, a.status, a.err)
		}
		mu.Lock()
		got, ok := received[a.id]
		mu.Unlock()
		if !ok {
			b.Fatalf("job %d answered succeeded but its receipt was not recorded", a.id)
		}
		lat = append(lat, a.at.Sub(got))
		answered[a.id] = a.at
	}
	b.StopTimer()
	// Where the latency goes: to the outcome's commit (finished_at, the database's clock, which
	// the process follows), and from it to the answer.
	rows, err := env.DB.QueryContext(ctx, "SELECT id, finished_at FROM jobs")
	if err != nil {
		b.Fatal(err)
	}
	for rows.Next() {
		var id int64
		var fin time.Time
		if err := rows.Scan(&id, &fin); err != nil {
			b.Fatal(err)
		}
		toCommit = append(toCommit, fin.Sub(received[id]))
		fromCommit = append(fromCommit, answered[id].Sub(fin))
	}
	if err := rows.Close(); err != nil {
		b.Fatal(err)
	}
	p := harness.Percentiles(lat, 50, 99)
	pc, pa := harness.Percentiles(toCommit, 50, 99), harness.Percentiles(fromCommit, 50, 99)
	_, poke, backstop := waitersAt(b, env.URL)
	harness.Emit("waiters", map[string]any{
		"waiters": waitersBench, "answer_after_receipt_p50_ms": p[0], "answer_after_receipt_p99_ms": p[1],
		"idle_cpu_ms_per_s": map[string]any{"test_process_with_waiters": self, "mariadbd": db,
			"test_process_without": baseSelf, "mariadbd_without": baseDB},
		"idle_statements_per_s": stmts, "idle_statements_per_s_without": baseStmts,
		"wakes_poke": poke, "wakes_backstop": backstop,
		"outcome_after_receipt_p50_ms": pc[0], "outcome_after_receipt_p99_ms": pc[1],
		"answer_after_outcome_p50_ms": pa[0], "answer_after_outcome_p99_ms": pa[1],
	})
}
