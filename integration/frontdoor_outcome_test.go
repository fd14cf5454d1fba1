package integration_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/migrations"
)

// commitCutter is a TCP proxy in front of MariaDB that, when armed, forwards the next COMMIT to
// the server and then cuts the connection before the server's answer reaches the client: the
// client cannot know whether its transaction committed.
type commitCutter struct {
	l     net.Listener
	armed atomic.Bool
	cuts  atomic.Int32
	wg    sync.WaitGroup
}

// comQueryCommit is a MySQL COM_QUERY packet body "COMMIT" (the driver's tx.Commit).
var comQueryCommit = []byte("\x03COMMIT")

func startCommitCutter(t *testing.T, server string) *commitCutter {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &commitCutter{l: l}
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
			if bytes.Contains(buf[:n], comQueryCommit) && p.armed.CompareAndSwap(true, false) {
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
	cfg, err := mysql.ParseDSN(probe.db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startCommitCutter(t, cfg.Addr)
	cfg.Addr = proxy.l.Addr().String()
	viaProxy, err := migrations.Open(ctx, cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { viaProxy.Close() })
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
