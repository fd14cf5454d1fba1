package integration_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/testdb"
)

// The tests in this file need the 3-node Galera cluster of deploy/galera/cluster.sh, reached
// through its proxy: `make test-galera` starts it, points SLUICE_TEST_MYSQL_DSN at the proxy and
// sets SLUICE_TEST_GALERA=1. Without it they say so and skip: the rest of the suite runs them
// against whatever server SLUICE_TEST_MYSQL_DSN names.

// galeraCluster drives deploy/galera/cluster.sh.
type galeraCluster struct{ script string }

func needGalera(t *testing.T) galeraCluster {
	t.Helper()
	if os.Getenv("SLUICE_TEST_GALERA") != "1" {
		t.Skip("needs the Galera cluster: make test-galera")
	}
	script, err := filepath.Abs("../deploy/galera/cluster.sh")
	if err != nil {
		t.Fatal(err)
	}
	return galeraCluster{script: script}
}

func (g galeraCluster) run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("bash", append([]string{g.script}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("cluster.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// awaitWhole waits until every node is synced and the proxy sends connections to node 1, its
// server (the others are its backups). A node synced again is marked up by the proxy a second
// or two later, and marking node 1 up cuts every connection to the backups: a test that
// disturbed the cluster waits for this before it ends, so that the tests after it do not lose
// their connections to it.
func (g galeraCluster) awaitWhole(t *testing.T) {
	t.Helper()
	harness.WaitFor(t, 2*time.Minute, "the cluster whole, node 1 the proxy's writer", func() (bool, error) {
		st := g.run(t, "status")
		return strings.Count(st, "Synced, cluster size 3") == 3 && strings.Contains(st, "writer through the proxy: node1"), nil
	})
}

// nodesRSS returns the resident memory of each Galera node's mariadbd on this machine, by node
// directory.
func nodesRSS(t *testing.T) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		raw, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(raw), "\x00", " ")
		i := strings.Index(cmd, "sluice-galera/node")
		if !strings.Contains(cmd, "mariadbd") || i < 0 {
			continue
		}
		node := cmd[i+len("sluice-galera/") : i+len("sluice-galera/node1")]
		if rss, err := vmRSS(filepath.Join(filepath.Dir(p), "status")); err == nil {
			out[node] = rss
		}
	}
	return out
}

// watchGaleraMemory, under make test-galera, fails t if a Galera node's resident memory grew by
// a gigabyte between now and t's end. Without its four indexed generated columns stored
// (migration 0024), three claiming drainers grew a node by gigabytes within seconds in half the
// runs (deploy/RUNBOOK.md, "The database on a Galera cluster"); the tests that run several
// processes against the cluster watch for its return.
func watchGaleraMemory(t *testing.T) {
	t.Helper()
	if os.Getenv("SLUICE_TEST_GALERA") != "1" {
		return
	}
	before := nodesRSS(t)
	t.Cleanup(func() {
		for node, after := range nodesRSS(t) {
			if grew := after - before[node]; grew > 1<<30 {
				t.Errorf("Galera %s's resident memory grew by %d MiB (from %d MiB)", node, grew>>20, before[node]>>20)
			}
		}
	})
}

// admission is one producer request of TestGaleraWriterKilled: its idempotency key, and the id
// and time of its first 2xx answer.
type admission struct {
	key      string
	id       int64
	answered time.Time
}

// TestGaleraWriterKilled is issue 32's failover: under steady admissions and draining, SIGKILL
// the node that takes the writes (the proxy's choice), then start it again and let it rejoin. Every admission that
// was answered 2xx exists afterwards, under the id it was given, and ends once; a producer that
// got an error retries with its idempotency key and gets one job; no job starts twice at the
// executor, whose caps hold throughout; sluice admits and dispatches again within 10 s of the
// kill; no node's memory grows by a gigabyte.
func TestGaleraWriterKilled(t *testing.T) {
	g := needGalera(t)
	t.Cleanup(func() { g.awaitWhole(t) })
	st := g.run(t, "status")
	_, writer, _ := strings.Cut(st, "writer through the proxy: node")
	writer = strings.TrimSpace(writer)
	if strings.Count(st, "Synced, cluster size 3") != 3 || len(writer) != 1 {
		t.Fatalf("the cluster is not whole, or has no writer:\n%s", st)
	}
	watchGaleraMemory(t)
	ctx := context.Background()
	env := harness.Start(t, harness.Options{})
	const globalCap, tenantCap = 8, 3
	env.SetConfig(t, func(c *config.Config) { c.GlobalInFlight, c.TenantInFlight = globalCap, tenantCap })

	// Producers: each admits with a new key until told to stop, and retries a key whose
	// admission failed (a 5xx or a broken connection) until it is answered. Each starts a new key
	// at most every producerPace: the four together ask about 100 jobs a second, half what the
	// drain runs at these caps (8 in flight of 20 ms jobs, about 200 a second), so the queue
	// stays short and a depth cap's 429 means the drain stood still for many seconds. Unpaced,
	// they admitted 500 a second after the kill's outage, and the 2,000-job queue filled in
	// about seven seconds whatever the drain did (session 29: a run failed so with no stall).
	const producerPace = 40 * time.Millisecond
	stop := make(chan struct{})
	var mu sync.Mutex
	var done []admission
	var failures int
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 5 * time.Second}
	for p := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pace := time.NewTicker(producerPace)
			defer pace.Stop()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-pace.C: // the producer's rate, not a wait on the test's state
				}
				a := admission{key: fmt.Sprintf("p%d-%d", p, i)}
				for a.id == 0 {
					select {
					case <-stop:
						return
					default:
					}
					status, id := admitOnce(client, env.URL, fmt.Sprintf("tenant-%d", (p+i)%5), a.key)
					switch {
					case status == http.StatusAccepted || status == http.StatusOK:
						a.id, a.answered = id, time.Now()
					case status == 0 || status >= 500:
						mu.Lock()
						failures++
						mu.Unlock()
						time.Sleep(100 * time.Millisecond) // a producer's pause before its retry, not a wait on the test's state
					default:
						t.Errorf("%s: HTTP %d", a.key, status)
						return
					}
				}
				mu.Lock()
				done = append(done, a)
				mu.Unlock()
			}
		}()
	}
	answered := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(done)
	}
	harness.WaitFor(t, 30*time.Second, "200 admissions before the kill", func() (bool, error) { return answered() >= 200, nil })
	harness.WaitFor(t, 30*time.Second, "jobs to run before the kill", func() (bool, error) {
		c, err := env.CountJobs(ctx)
		return c["succeeded"] >= 50, err
	})

	killed := time.Now()
	g.run(t, "kill", writer)
	harness.WaitFor(t, 60*time.Second, "admissions and jobs finishing 5 s after the kill", func() (bool, error) {
		var n int
		err := env.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE finished_at > ?", killed.Add(5*time.Second).UTC()).Scan(&n)
		mu.Lock()
		last := done[len(done)-1].answered
		mu.Unlock()
		return err == nil && n > 0 && last.After(killed.Add(5*time.Second)), nil
	})
	// The outage is the longest time without an answered admission (a finished job) around the
	// kill.
	var answers []time.Time
	mu.Lock()
	for _, a := range done {
		answers = append(answers, a.answered)
	}
	mu.Unlock()
	admitOutage := longestGap(answers, killed)
	finishes := finishedAfter(t, env.DB.DB, time.Time{})
	dispatchOutage := longestGap(finishes, killed)
	t.Logf("the writer's kill: no admission answered for %s, no job finished for %s (%d failed attempts so far)",
		admitOutage.Round(time.Millisecond), dispatchOutage.Round(time.Millisecond), failures)
	if admitOutage > 10*time.Second || dispatchOutage > 10*time.Second {
		t.Errorf("sluice stopped admitting for %s and finishing jobs for %s, want both under 10 s", admitOutage, dispatchOutage)
	}

	// The killed node rejoins while the work goes on, and the proxy moves the writer back to it.
	rejoin := time.Now()
	g.run(t, "start", writer)
	harness.WaitFor(t, time.Minute, "the proxy to take the rejoined node back as its writer", func() (bool, error) {
		return strings.Contains(g.run(t, "status"), "writer through the proxy: node"+writer), nil
	})
	mid := answered()
	harness.WaitFor(t, 60*time.Second, "100 more admissions after the rejoin", func() (bool, error) { return answered() >= mid+100, nil })
	close(stop)
	wg.Wait()
	// The writer's move back cuts every connection again: a claim cut in its COMMIT used to hold
	// its jobs' room until their leases expired, stopping the drain at a global cap of a few.
	rejoinFinishes := finishedAfter(t, env.DB.DB, rejoin)
	rejoinOutage := longestGap(append([]time.Time{rejoin}, rejoinFinishes...), rejoin)
	t.Logf("the rejoin: no job finished for %s of the %s after it", rejoinOutage.Round(time.Millisecond), time.Since(rejoin).Round(time.Millisecond))
	if rejoinOutage > 10*time.Second {
		t.Errorf("sluice stopped finishing jobs for %s around the rejoin, want under 10 s", rejoinOutage)
	}

	harness.WaitFor(t, 2*time.Minute, "every job to finish", func() (bool, error) {
		c, err := env.CountJobs(ctx)
		return err == nil && c["queued"]+c["claimed"]+c["dispatched"]+c["running"] == 0, err
	})
	// Every answered admission is the job it was told, once; every key has one job.
	for _, a := range done {
		var key, status string
		err := env.DB.QueryRowContext(ctx, "SELECT idempotency_key, status FROM jobs WHERE id = ?", a.id).Scan(&key, &status)
		if err == nil && key == a.key && status == "succeeded" {
			continue
		}
		var real int64
		_ = env.DB.QueryRowContext(ctx, "SELECT id FROM jobs WHERE idempotency_key = ?", a.key).Scan(&real)
		t.Errorf("%s: answered job %d at %s (%s after the kill), which is %q, %s (%v); its job is %d",
			a.key, a.id, a.answered.Format("15:04:05.000"), a.answered.Sub(killed), key, status, err, real)
	}
	var dupKeys int
	if err := env.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM (SELECT idempotency_key FROM jobs
		GROUP BY tenant, idempotency_key HAVING COUNT(*) > 1) d`).Scan(&dupKeys); err != nil || dupKeys != 0 {
		t.Errorf("%d idempotency keys with more than one job (%v)", dupKeys, err)
	}
	stats := env.Exec.Stats()
	if stats.DuplicateStarts != 0 || stats.MaxInFlight > globalCap {
		t.Errorf("executor: %d duplicate starts, %d in flight at most (cap %d)", stats.DuplicateStarts, stats.MaxInFlight, globalCap)
	}
	for tenant, n := range stats.MaxInFlightByTenant {
		if n > tenantCap {
			t.Errorf("executor: tenant %s had %d in flight (cap %d)", tenant, n, tenantCap)
		}
	}
	var unpublished int
	harness.WaitFor(t, 30*time.Second, "the outbox to be published", func() (bool, error) {
		err := env.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox WHERE published_at = '1000-01-01 00:00:00'").Scan(&unpublished)
		return unpublished == 0, err
	})
	t.Logf("%d admissions answered, %d failed attempts retried, %d jobs started at the executor", len(done), failures, stats.TotalStarts)
}

// admitOnce posts one admission and returns its HTTP status (0 when the request failed) and the
// job id of a 2xx answer.
func admitOnce(c *http.Client, base, tenant, key string) (int, int64) {
	body := fmt.Sprintf(`{"tenant":%q,"idempotency_key":%q,"payload":{"sleep_ms":20}}`, tenant, key)
	req, err := http.NewRequest(http.MethodPost, base+"/v1/jobs", strings.NewReader(body))
	if err != nil {
		return 0, 0
	}
	req.Header.Set("Authorization", "Bearer "+harness.ProducerToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, 0
	}
	defer resp.Body.Close()
	var j struct{ ID int64 }
	if resp.StatusCode/100 == 2 {
		if err := json.NewDecoder(resp.Body).Decode(&j); err != nil {
			return 0, 0
		}
	}
	return resp.StatusCode, j.ID
}

// finishedAfter returns, oldest first, the instants of the jobs that finished after since (every
// job that finished, for a zero since).
func finishedAfter(t *testing.T, db *sql.DB, since time.Time) []time.Time {
	t.Helper()
	if since.IsZero() {
		since = time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC) // DATETIME's first day
	}
	rows, err := db.QueryContext(context.Background(), "SELECT finished_at FROM jobs WHERE finished_at > ? ORDER BY finished_at", since.UTC())
	if err != nil {
		t.Fatal(err)
	}
	var out []time.Time
	for rows.Next() {
		var at time.Time
		if err := rows.Scan(&at); err != nil {
			t.Fatal(err)
		}
		out = append(out, at)
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	return out
}

// longestGap returns the longest time between two consecutive instants of sorted times (sorted
// here) that ends after from, or from's distance to the first one after it.
func longestGap(times []time.Time, from time.Time) time.Duration {
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	var longest time.Duration
	for i := 1; i < len(times); i++ {
		if times[i].After(from) {
			longest = max(longest, times[i].Sub(times[i-1]))
		}
	}
	return longest
}

// TestGaleraCausalReadOnANewWriter: a connection sluice opens to a node that has not yet applied
// the last transaction committed through another (as on a writer the proxy has just moved to)
// waits until it has, so its first read sees that transaction (store's causalConnector). The
// node's applier is held back with FLUSH TABLES WITH READ LOCK, which pauses it while reads go
// on.
func TestGaleraCausalReadOnANewWriter(t *testing.T) {
	g := needGalera(t)
	ctx := context.Background()
	g.awaitWhole(t)
	t.Cleanup(func() { g.awaitWhole(t) }) // node 2, desynced below, is synced and marked up again
	reader := "2"                         // node 1 is the writer (awaitWhole)
	w := testdb.New(t)                    // through the proxy: on node 1
	if _, err := w.ExecContext(ctx, "CREATE TABLE t (id INT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.ExecContext(ctx, "INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	node := fmt.Sprintf("root@tcp(127.0.0.1:331%s)/%s", reader, w.Name)
	r, err := sql.Open("mysql", node)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	harness.WaitFor(t, 30*time.Second, "the first row on node "+reader, func() (bool, error) {
		var n int
		err := r.QueryRowContext(ctx, "SELECT COUNT(*) FROM t").Scan(&n)
		return err == nil && n == 1, nil
	})

	lock, err := r.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if _, err := lock.ExecContext(ctx, "FLUSH TABLES WITH READ LOCK"); err != nil {
		t.Fatal(err)
	}
	// Called below and again at the end: UNLOCK TABLES with nothing locked does nothing.
	unlock := func() {
		if _, err := lock.ExecContext(context.Background(), "UNLOCK TABLES"); err != nil {
			t.Errorf("unlock node %s: %v", reader, err)
		}
	}
	defer unlock()
	if _, err := w.ExecContext(ctx, "INSERT INTO t VALUES (2)"); err != nil {
		t.Fatal(err)
	}
	var stale int
	if err := r.QueryRowContext(ctx, "SELECT COUNT(*) FROM t").Scan(&stale); err != nil {
		t.Fatal(err)
	}
	if stale != 1 {
		t.Fatalf("node %s already has %d rows: its applier is not held back, and this test would prove nothing", reader, stale)
	}

	type result struct {
		n   int
		err error
	}
	got := make(chan result, 1)
	go func() {
		db, err := store.Open(ctx, node)
		if err != nil {
			got <- result{err: err}
			return
		}
		defer db.Close()
		var n, syncWait int
		err = db.QueryRowContext(ctx, "SELECT COUNT(*) FROM t").Scan(&n)
		if err == nil {
			// The wait was for the connection's first read only: its session is as it was.
			err = db.QueryRowContext(ctx, "SELECT @@SESSION.wsrep_sync_wait").Scan(&syncWait)
		}
		if err == nil && syncWait != 0 {
			err = fmt.Errorf("the connection kept wsrep_sync_wait = %d", syncWait)
		}
		got <- result{n, err}
	}()
	harness.WaitFor(t, 10*time.Second, "sluice's new connection to wait for node "+reader+" to catch up", func() (bool, error) {
		select {
		case res := <-got:
			t.Fatalf("sluice read %d rows (%v) on node %s before it applied the second: its first read was not causal", res.n, res.err, reader)
		default:
		}
		var waiting int
		err := r.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.PROCESSLIST
			WHERE INFO LIKE 'SELECT 1 AS sluice_caught_up%'`).Scan(&waiting)
		return waiting > 0, err
	})
	unlock()
	select {
	case res := <-got:
		if res.err != nil || res.n != 2 {
			t.Errorf("sluice read %d rows (%v) on node %s after it caught up, want 2", res.n, res.err, reader)
		}
	case <-time.After(30 * time.Second): // a deadline on the condition, not a wait for it
		t.Fatal("sluice's read did not end within 30 s of the node's applier going on")
	}
}

// TestGaleraAbortMidRoundTrip: a transaction that another node's commit aborts (Galera's
// brute-force abort, when two nodes take writes at once, as while a proxy moves its writer) in the
// middle of a multi-statement round trip must fail that round trip, and none of the round trip's
// statements may commit. With the server's defaults the statements after the abort ran with
// autocommit, one of them twice, and the round trip, COMMIT and all, answered as a success:
// TestGaleraWriterKilled's producers got 2xx for jobs that were never written (session 29). Both
// kinds of transaction sluice runs are tried: store.ConnTx's (autocommit off while it runs) and
// database/sql's (wsrep_retry_autocommit off, which the causal connector sets). Each round trip's
// first statement sleeps, so that the abort lands inside it.
func TestGaleraAbortMidRoundTrip(t *testing.T) {
	g := needGalera(t)
	g.awaitWhole(t)
	ctx := context.Background()
	w := testdb.New(t) // through the proxy: on node 1
	for _, q := range []string{"CREATE TABLE t (id INT PRIMARY KEY, v INT NOT NULL)", "CREATE TABLE after_abort (x INT NOT NULL)",
		"INSERT INTO t VALUES (1, 0)"} {
		if _, err := w.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	other, err := sql.Open("mysql", fmt.Sprintf("root@tcp(127.0.0.1:3312)/%s", w.Name)) // node 2, a second writer
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	harness.WaitFor(t, 30*time.Second, "the row on node 2", func() (bool, error) {
		var n int
		err := other.QueryRowContext(ctx, "SELECT COUNT(*) FROM t").Scan(&n)
		return err == nil && n == 1, nil
	})
	pool, err := store.OpenMulti(ctx, w.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	const sleepThenWrite = "DO SLEEP(5);INSERT INTO after_abort VALUES (1)"

	// abort runs begin (which must take row 1's lock), then, in a goroutine, the round trip that
	// sleeps; commits a change of row 1 on node 2 while it sleeps; and returns the rows written
	// after the abort and the round trip's error.
	abort := func(name string, begin func() error, roundTrip func() error) (int, error) {
		if _, err := w.ExecContext(ctx, "UPDATE t SET v = 0 WHERE id = 1"); err != nil {
			t.Fatal(err)
		}
		if _, err := w.ExecContext(ctx, "DELETE FROM after_abort"); err != nil {
			t.Fatal(err)
		}
		if err := begin(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		done := make(chan error, 1)
		go func() { done <- roundTrip() }()
		harness.WaitFor(t, 10*time.Second, name+": the round trip to be inside its sleep", func() (bool, error) {
			var n int
			err := w.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.PROCESSLIST
				WHERE DB = ? AND STATE = 'User sleep'`, w.Name).Scan(&n)
			return n > 0, err
		})
		if _, err := other.ExecContext(ctx, "UPDATE t SET v = v + 100 WHERE id = 1"); err != nil {
			t.Fatal(err)
		}
		var rtErr error
		select {
		case rtErr = <-done:
		case <-time.After(30 * time.Second): // a deadline on the condition, not a wait for it
			t.Fatalf("%s: the aborted round trip did not end within 30 s", name)
		}
		var v, after int
		if err := w.QueryRowContext(ctx, "SELECT v, (SELECT COUNT(*) FROM after_abort) FROM t WHERE id = 1").Scan(&v, &after); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: round trip %v; v = %d, %d row(s) written after the abort", name, rtErr, v, after)
		if v != 100 {
			t.Fatalf("%s: v = %d, want 100: the transaction was not aborted, and this test proves nothing", name, v)
		}
		return after, rtErr
	}

	tx, err := store.BeginConnTx(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	after, rtErr := abort("store.ConnTx", func() error {
		_, err := tx.Exec(ctx, []string{"UPDATE t SET v = v + 1 WHERE id = 1"})
		return err
	}, func() error {
		_, err := tx.ExecCommit(ctx, strings.Split(sleepThenWrite, ";"))
		return err
	})
	if rtErr == nil || after != 0 {
		t.Errorf("store.ConnTx: the round trip of an aborted transaction answered %v with %d row(s) committed after the abort; want an error and none", rtErr, after)
	}
	tx.Close() // rolls back what the round trip ran after the abort, and frees its locks

	sqlTx, err := pool.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sqlTx.Rollback()
	after, rtErr = abort("database/sql Tx", func() error {
		_, err := sqlTx.ExecContext(ctx, "UPDATE t SET v = v + 1 WHERE id = 1")
		return err
	}, func() error {
		_, err := sqlTx.ExecContext(ctx, sleepThenWrite)
		return err
	})
	// Here the first statement after the abort commits on its own before the round trip fails:
	// autocommit is on in a database/sql transaction. What must not happen is a success.
	if rtErr == nil {
		t.Errorf("database/sql Tx: the round trip of an aborted transaction answered as a success (%d row(s) written after the abort)", after)
	}
}

// TestGaleraNoWriter: while no node of the cluster may take writes (each one desynced, so the
// proxy's check takes all three out), sluice says so: /readyz answers 503 with the reason
// "database", an admission and /v1/status answer 503 unavailable and retryable, and nothing is
// written; once the nodes are synced again it admits within seconds, with no restart.
func TestGaleraNoWriter(t *testing.T) {
	g := needGalera(t)
	g.awaitWhole(t)
	ctx := context.Background()
	env := harness.Start(t, harness.Options{})
	admit := func(key string) harness.Response {
		return env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken,
			map[string]any{"tenant": "t", "idempotency_key": key, "payload": map[string]any{}})
	}
	if r := admit("before"); r.Status != http.StatusAccepted {
		t.Fatalf("admission with the cluster whole: HTTP %d %s", r.Status, r.Raw)
	}
	desync := func(on string) error {
		for _, n := range []string{"1", "2", "3"} {
			db, err := sql.Open("mysql", fmt.Sprintf("root@tcp(127.0.0.1:331%s)/", n))
			if err != nil {
				return err
			}
			_, err = db.ExecContext(ctx, "SET GLOBAL wsrep_desync = "+on)
			db.Close()
			if err != nil {
				return fmt.Errorf("node %s: %w", n, err)
			}
		}
		return nil
	}
	t.Cleanup(func() {
		if err := desync("OFF"); err != nil {
			t.Errorf("sync the nodes again: %v", err)
		}
		g.awaitWhole(t)
	})
	if err := desync("ON"); err != nil {
		t.Fatal(err)
	}
	var ready harness.Response
	harness.WaitFor(t, 30*time.Second, "/readyz to say the database is gone", func() (bool, error) {
		ready = env.Do(t, http.MethodGet, "/readyz", "", nil)
		return ready.Status == http.StatusServiceUnavailable, nil
	})
	if ready.Body["reason"] != "database" {
		t.Errorf("/readyz with no writer: %s, want the reason database", ready.Raw)
	}
	if r := admit("during"); r.Status != http.StatusServiceUnavailable || r.Body["error_code"] != "unavailable" || r.Body["retryable"] != true {
		t.Errorf("admission with no writer: HTTP %d %s, want 503 unavailable retryable", r.Status, r.Raw)
	}
	if r := env.Do(t, http.MethodGet, "/v1/status", harness.AdminToken, nil); r.Status != http.StatusServiceUnavailable || r.Body["error_code"] != "unavailable" {
		t.Errorf("/v1/status with no writer: HTTP %d %s, want 503 unavailable", r.Status, r.Raw)
	}

	synced := time.Now()
	if err := desync("OFF"); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 30*time.Second, "an admission answered once the nodes are synced", func() (bool, error) {
		r := admit("after")
		return r.Status == http.StatusAccepted || r.Status == http.StatusOK, nil
	})
	t.Logf("admitting again %s after the nodes were synced", time.Since(synced).Round(time.Millisecond))
	harness.WaitFor(t, 10*time.Second, "/readyz ready again", func() (bool, error) {
		return env.Do(t, http.MethodGet, "/readyz", "", nil).Status == http.StatusOK, nil
	})
	var during int
	if err := env.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE idempotency_key = 'during'").Scan(&during); err != nil || during != 0 {
		t.Errorf("the admission refused while there was no writer left %d jobs (%v)", during, err)
	}
}
