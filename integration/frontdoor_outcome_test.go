package integration_test

import (
	"bytes"
	"context"
	"database/sql"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/testdb"
)

// commitCutter is a TCP proxy in front of MariaDB that, when armed, forwards the next COMMIT to
// the server and then cuts the connection before the server's answer reaches the client: the
// client cannot know whether its transaction committed. While down (setDown) it plays an
// unreachable database: it cuts every open connection and closes new ones at once.
type commitCutter struct {
	l     net.Listener
	armed atomic.Bool
	cuts  atomic.Int32
	wg    sync.WaitGroup

	mu   sync.Mutex
	down bool
	open map[net.Conn]bool // client connections being served
}

// setDown takes the database away (down) or gives it back.
func (p *commitCutter) setDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for c := range p.open {
			c.Close()
		}
	}
}

// track registers a client connection, or reports false (and closes it) while down.
func (p *commitCutter) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		c.Close()
		return false
	}
	p.open[c] = true
	return true
}

func (p *commitCutter) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.open, c)
}

// carriesCommit says whether a chunk the client sent holds a COMMIT: a MySQL COM_QUERY packet
// body "COMMIT" (the driver's tx.Commit), or one whose statements end with it (a transaction
// that commits in its last round trip, store.ConnTx's ExecCommit and QueryCommit).
func carriesCommit(chunk []byte) bool {
	return bytes.Contains(chunk, []byte("\x03COMMIT")) || bytes.HasSuffix(chunk, []byte(";COMMIT"))
}

// dbThroughCutter starts a commitCutter in front of database base and returns it with a pool
// that connects through it, closed when the test ends.
func dbThroughCutter(t *testing.T, base *testdb.DB) (*commitCutter, *sql.DB) {
	t.Helper()
	cfg, err := mysql.ParseDSN(base.DSN)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startCommitCutter(t, cfg.Addr)
	cfg.Addr = proxy.l.Addr().String()
	db, err := store.OpenMulti(context.Background(), cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return proxy, db
}

func startCommitCutter(t *testing.T, server string) *commitCutter {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &commitCutter{l: l, open: map[net.Conn]bool{}}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.serve(c, server)
			}()
		}
	}()
	t.Cleanup(func() { l.Close(); p.wg.Wait() })
	return p
}

func (p *commitCutter) serve(client net.Conn, server string) {
	if !p.track(client) {
		return
	}
	defer p.untrack(client)
	defer client.Close()
	up, err := net.Dial("tcp", server)
	if err != nil {
		return
	}
	defer up.Close()
	var cut atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := up.Read(buf)
			if n > 0 && !cut.Load() {
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			if carriesCommit(buf[:n]) && p.armed.CompareAndSwap(true, false) {
				cut.Store(true)
				_, _ = up.Write(buf[:n])
				p.cuts.Add(1)
				client.Close()
				up.Close()
				<-done
				return
			}
			if _, werr := up.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	up.Close()
	<-done
	_, _ = io.Copy(io.Discard, client)
}

// TestFrontDoorOutcomeUnknown cuts the database connection at COMMIT: an unkeyed admission
// answers 503 outcome_unknown retryable:false; a keyed one retryable:true, and its replay
// returns the one job that exists.
func TestFrontDoorOutcomeUnknown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	probe := startFrontDoor(t, fdOptions{}) // only for its database
	proxy, viaProxy := dbThroughCutter(t, probe.db)
	f := startFrontDoorOn(t, probe, fdOptions{admitDB: viaProxy})

	proxy.armed.Store(true)
	r := f.do(t, http.MethodPost, "/v1/jobs", fdStarToken, map[string]any{"tenant": "cut", "payload": 1})
	if proxy.cuts.Load() != 1 {
		t.Fatalf("the proxy cut %d connections, want 1", proxy.cuts.Load())
	}
	if r.Status != 503 || r.Body["error_code"] != "outcome_unknown" || r.Body["retryable"] != false {
		t.Errorf("unkeyed admission cut at COMMIT: %d %s, want 503 outcome_unknown retryable false", r.Status, r.Raw)
	}
	var n int
	if err := f.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs WHERE tenant = 'cut'").Scan(&n); err != nil || n > 1 {
		t.Errorf("%d jobs after one cut admission (%v)", n, err)
	}

	keyed := map[string]any{"tenant": "cut-keyed", "payload": 2, "idempotency_key": "once"}
	proxy.armed.Store(true)
	r = f.do(t, http.MethodPost, "/v1/jobs", fdStarToken, keyed)
	if r.Status != 503 || r.Body["error_code"] != "outcome_unknown" || r.Body["retryable"] != true {
		t.Errorf("keyed admission cut at COMMIT: %d %s, want 503 outcome_unknown retryable true", r.Status, r.Raw)
	}
	replay := f.do(t, http.MethodPost, "/v1/jobs", fdStarToken, keyed)
	if replay.Status != 200 && replay.Status != 202 {
		t.Fatalf("replay: %d %s", replay.Status, replay.Raw)
	}
	var id int64
	if err := f.db.QueryRowContext(ctx, "SELECT COUNT(*), MAX(id) FROM jobs WHERE tenant = 'cut-keyed'").Scan(&n, &id); err != nil {
		t.Fatal(err)
	}
	if n != 1 || jobID(t, replay.Body) != id {
		t.Errorf("after the replay: %d jobs (want 1), replay answered job %v, the row is %d", n, replay.Body["id"], id)
	}
	if replay.Status == 200 && replay.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("a replay of the committed job without Idempotent-Replayed")
	}
	t.Logf("keyed cut: the server had %s the transaction", map[int]string{200: "committed", 202: "not committed"}[replay.Status])
}

// TestFrontDoorExecutorCallsDatabaseDown: the API's own transactions (/start, /complete, the
// cancel of DELETE /v1/jobs/{id}, /v1/releases) answer a database outage as admission does, so
// that an executor is told to retry rather than handed a 500. With the database unreachable
// each answers 503 unavailable, retryable, and writes nothing; with the connection cut during
// COMMIT each answers 503 outcome_unknown, retryable, and its repeat succeeds. Every answer is
// one openapi.json describes.
func TestFrontDoorExecutorCallsDatabaseDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	probe := startFrontDoor(t, fdOptions{}) // only for its database
	proxy, viaProxy := dbThroughCutter(t, probe.db)
	f := startFrontDoorOn(t, probe, fdOptions{apiDB: viaProxy})

	admit := func() int64 {
		t.Helper()
		r := f.do(t, http.MethodPost, "/v1/jobs", fdStarToken, map[string]any{"tenant": "acme"})
		if r.Status != http.StatusAccepted {
			t.Fatalf("admit: HTTP %d %s", r.Status, r.Raw)
		}
		return jobID(t, r.Body)
	}
	queued := admit()
	// A job as a drainer leaves it once it has sent it: dispatched under a nonce's hash.
	running := admit()
	if _, err := f.db.ExecContext(ctx, `UPDATE jobs SET status = 'dispatched', version = version + 1,
		attempt = attempt + 1, claimed_at = UTC_TIMESTAMP(6), dispatched_at = UTC_TIMESTAMP(6),
		lease_until = UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE, drainer_id = 'test', nonce_sha256 = ?,
		nonce_expires_at = UTC_TIMESTAMP(6) + INTERVAL 5 MINUTE WHERE id = ?`, store.HashNonce("n1"), running); err != nil {
		t.Fatal(err)
	}
	jobPath := func(id int64, suffix string) string { return "/v1/jobs/" + strconv.FormatInt(id, 10) + suffix }
	calls := []struct {
		name, method, template, path, token string
		body                                any
		ok                                  int
		status                              string // the job's status after the call succeeded
		id                                  int64
	}{
		{"start", http.MethodPost, "/v1/jobs/{id}/start", jobPath(running, "/start"), fdExecToken,
			map[string]any{"nonce": "n1", "start_id": "attempt-1"}, http.StatusOK, "running", running},
		{"complete", http.MethodPost, "/v1/jobs/{id}/complete", jobPath(running, "/complete"), fdExecToken,
			map[string]any{"nonce": "n1", "status": "succeeded"}, http.StatusOK, "succeeded", running},
		{"cancel", http.MethodDelete, "/v1/jobs/{id}", jobPath(queued, ""), fdAlphaToken,
			nil, http.StatusOK, "canceled", queued},
		{"release", http.MethodPost, "/v1/releases", "/v1/releases", fdExecToken,
			map[string]any{"tenant": "acme"}, http.StatusAccepted, "", 0},
	}
	status := func(id int64) string {
		t.Helper()
		var s string
		if err := f.db.QueryRowContext(ctx, "SELECT status FROM jobs WHERE id = ?", id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}

	proxy.setDown(true)
	before := f.rowCounts(t)
	for _, c := range calls {
		r := f.do(t, c.method, c.path, c.token, c.body)
		if r.Status != http.StatusServiceUnavailable || r.Body["error_code"] != "unavailable" || r.Body["retryable"] != true {
			t.Errorf("%s with the database unreachable: HTTP %d %s, want 503 unavailable retryable", c.name, r.Status, r.Raw)
		}
		checkDescribed(t, c.method, c.template, r)
	}
	if after := f.rowCounts(t); after != before {
		t.Errorf("rows (jobs, outbox, tenants) went from %v to %v during the outage", before, after)
	}
	if s, q := status(running), status(queued); s != "dispatched" || q != "queued" {
		t.Errorf("after the outage the jobs are %s and %s, want dispatched and queued", s, q)
	}

	proxy.setDown(false)
	for _, c := range calls {
		cuts := proxy.cuts.Load()
		proxy.armed.Store(true)
		r := f.do(t, c.method, c.path, c.token, c.body)
		if proxy.cuts.Load() != cuts+1 {
			t.Fatalf("%s: the proxy cut %d connections, want 1", c.name, proxy.cuts.Load()-cuts)
		}
		if r.Status != http.StatusServiceUnavailable || r.Body["error_code"] != "outcome_unknown" || r.Body["retryable"] != true {
			t.Errorf("%s cut at COMMIT: HTTP %d %s, want 503 outcome_unknown retryable", c.name, r.Status, r.Raw)
		}
		checkDescribed(t, c.method, c.template, r)
		r = f.do(t, c.method, c.path, c.token, c.body)
		if r.Status != c.ok {
			t.Errorf("%s repeated after the cut: HTTP %d %s, want %d", c.name, r.Status, r.Raw, c.ok)
		}
		if c.id != 0 {
			if s := status(c.id); s != c.status {
				t.Errorf("%s repeated after the cut left the job %s, want %s", c.name, s, c.status)
			}
		}
	}
}
