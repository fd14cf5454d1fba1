package integration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer/executor/simexec"
	"github.com/sluicehq/sluice/gate/status"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/integration/testdb"
)

// buildSluice builds the sluice binary once for the test.
func buildSluice(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sluice")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/sluicehq/sluice/cmd/sluice")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// proc is a `sluice serve` subprocess with its own database, broker and simulated executor.
type proc struct {
	t       *testing.T
	bin     string
	cmd     *exec.Cmd
	env     []string
	url     string
	db      *testdb.DB
	exec    *simexec.Server
	log     *syncBuffer
	exited  chan struct{}
	exitErr error
}

func startServe(t *testing.T, bin string) *proc {
	t.Helper()
	return startServeLogTo(t, bin, nil)
}

// startServeLogTo is startServe with the process's stderr, where it logs, on stderr rather than
// in p.log (which keeps its stdout); nil means p.log.
func startServeLogTo(t *testing.T, bin string, stderr *os.File) *proc {
	t.Helper()
	p := &proc{t: t, bin: bin, db: testdb.New(t), log: &syncBuffer{}, exited: make(chan struct{})}
	ns := natstest.Start(t)
	p.exec = simexec.New(simexec.Config{Secret: []byte(harness.Secret)})
	execSrv := httptest.NewServer(p.exec.Handler())
	t.Cleanup(func() { execSrv.Close(); p.exec.Close() })
	port := natstest.FreePort(t)
	p.url = fmt.Sprintf("http://127.0.0.1:%d", port)
	p.exec.SetAPI(p.url, harness.ExecutorToken)
	tokens, _ := json.Marshal([]map[string]any{
		{"name": "producer", "token": harness.ProducerToken, "role": "producer", "tenants": []string{"*"}},
		{"name": "executor", "token": harness.ExecutorToken, "role": "executor"},
		{"name": "admin", "token": harness.AdminToken, "role": "admin"},
	})
	p.env = append(os.Environ(),
		"SLUICE_MYSQL_DSN="+p.db.DSN, "SLUICE_NATS_URL="+ns.URL(), fmt.Sprintf("SLUICE_LISTEN=127.0.0.1:%d", port),
		"SLUICE_EXECUTOR_URL="+execSrv.URL+"/dispatch", "SLUICE_EXECUTOR_SECRET="+harness.Secret,
		"SLUICE_TOKENS="+string(tokens), "SLUICE_SHUTDOWN_GRACE=20s", "SLUICE_DRAINER_ID=serve-under-test",
		"SLUICE_MEMCACHED=127.0.0.1:11211", "SLUICE_API_URL="+p.url, "SLUICE_TOKEN="+harness.AdminToken)
	p.cmd = exec.Command(bin, "serve")
	p.cmd.Env = p.env
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if stderr != nil {
		p.cmd.Stderr = stderr
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exitErr = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	})
	harness.WaitFor(t, 30*time.Second, "sluice serve to be ready", func() (bool, error) {
		select {
		case <-p.exited:
			t.Fatalf("sluice serve exited during start-up: %v\n%s", p.exitErr, p.log.String())
		default:
		}
		resp, err := http.Get(p.url + "/readyz")
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	return p
}

func (p *proc) admit(tenant string, payload any) {
	p.t.Helper()
	code, body, err := apiDo(context.Background(), http.DefaultClient, http.MethodPost, p.url+"/v1/jobs", harness.ProducerToken,
		map[string]any{"tenant": tenant, "payload": payload})
	if err != nil || code != http.StatusAccepted {
		p.t.Fatalf("admit: HTTP %d %v %v", code, body, err)
	}
}

func (p *proc) signal(s syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(s); err != nil {
		p.t.Fatal(err)
	}
}

// cli runs a sluice command against the serving process and returns its output and exit code.
func (p *proc) cli(args ...string) (string, int) {
	p.t.Helper()
	cmd := exec.Command(p.bin, args...)
	cmd.Env = p.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return out.String(), ee.ExitCode()
	case err != nil:
		p.t.Fatal(err)
	}
	return out.String(), 0
}

func (p *proc) counts() map[string]int {
	p.t.Helper()
	rows, err := p.db.QueryContext(context.Background(), "SELECT status, COUNT(*) FROM jobs GROUP BY status")
	if err != nil {
		p.t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			p.t.Fatal(err)
		}
		out[s] = n
	}
	return out
}

// TestOpsServeBinary runs the built binary as an operator would: the status and config
// commands against a live `sluice serve`, then SIGTERM (graceful: stop claiming at once, let
// in-flight dispatches finish, exit 0) and a second SIGTERM (exit at once, nothing lost).
func TestOpsServeBinary(t *testing.T) {
	t.Parallel()
	bin := buildSluice(t)

	t.Run("cli", func(t *testing.T) {
		p := startServe(t, bin)
		p.admit("acme", nil)
		out, code := p.cli("config", "set", "tenant_queue_depth=400", "ordering=fifo", "--note", "cli change: a=b")
		if code != 0 || !strings.Contains(out, "version 1") || !strings.Contains(out, "tenant_queue_depth: 500 -> 400") {
			t.Errorf("config set: exit %d\n%s", code, out)
		}
		out, code = p.cli("config", "set", "ordering=lifo")
		if code != 1 || !strings.Contains(out, "ordering") || !strings.Contains(out, "nothing changed") {
			t.Errorf("invalid config set: exit %d (want 1)\n%s", code, out)
		}
		out, code = p.cli("config", "show")
		if code != 0 || !strings.Contains(out, "version 1") || !regexpLine(out, `tenant_queue_depth\s+400`) || !regexpLine(out, `ordering\s+"fifo"`) {
			t.Errorf("config show: exit %d\n%s", code, out)
		}
		out, code = p.cli("config", "history")
		if code != 0 || !strings.Contains(out, `"cli change: a=b"`) || !strings.Contains(out, "by admin") {
			t.Errorf("config history: exit %d\n%s", code, out)
		}
		harness.WaitFor(t, 10*time.Second, "the job to succeed", func() (bool, error) { return p.counts()["succeeded"] == 1, nil })
		out, code = p.cli("status")
		if code != 0 || !strings.Contains(out, "serve-under-test") || !strings.Contains(out, "broker     connected") || !strings.Contains(out, "memcached  reachable") {
			t.Errorf("status: exit %d\n%s", code, out)
		}
		out, code = p.cli("status", "--json")
		var st map[string]any
		if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st["queue"] == nil || st["drainers"] == nil {
			t.Errorf("status --json: exit %d\n%s", code, out)
		}
		p.signal(syscall.SIGTERM)
		<-p.exited
	})

	t.Run("graceful", func(t *testing.T) {
		p := startServe(t, bin)
		for i := 0; i < 4; i++ {
			p.admit(fmt.Sprintf("t%d", i%2), map[string]any{"sleep_ms": 4000})
		}
		harness.WaitFor(t, 10*time.Second, "4 jobs running at the executor", func() (bool, error) { return p.exec.Stats().InFlight == 4, nil })
		p.admit("t0", map[string]any{"sleep_ms": 10})
		p.admit("t9", map[string]any{"sleep_ms": 10}) // queued behind the global cap
		p.signal(syscall.SIGTERM)
		harness.WaitFor(t, 5*time.Second, "/readyz to answer 503 while draining", func() (bool, error) {
			resp, err := http.Get(p.url + "/readyz")
			if err != nil {
				return false, err
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusServiceUnavailable, nil
		})
		select {
		case <-p.exited:
		case <-time.After(25 * time.Second):
			t.Fatalf("sluice did not exit within the grace period\n%s", p.log.String())
		}
		if p.exitErr != nil {
			t.Errorf("exit after SIGTERM: %v, want status 0\n%s", p.exitErr, p.log.String())
		}
		if c := p.counts(); c["succeeded"] != 4 || c["queued"] != 2 || len(c) != 2 {
			t.Errorf("jobs after shutdown %v: want the 4 in flight succeeded and the 2 queued untouched", c)
		}
		if st := p.exec.Stats(); st.TotalStarts != 4 || st.DuplicateStarts != 0 {
			t.Errorf("executor: %d starts, %d duplicates; want 4, 0", st.TotalStarts, st.DuplicateStarts)
		}
		var stopped bool
		if err := p.db.QueryRowContext(context.Background(), "SELECT stopped_at IS NOT NULL FROM drainers WHERE id = 'serve-under-test'").Scan(&stopped); err != nil || !stopped {
			t.Errorf("drainer row does not record the clean stop (%v)", err)
		}
		log := p.log.String()
		for _, want := range []string{`"msg":"stopped claiming; waiting for in-flight dispatches"`, `"msg":"sluice stopped"`} {
			if !strings.Contains(log, want) {
				t.Errorf("log lacks %s", want)
			}
		}
		for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
			if !json.Valid([]byte(line)) {
				t.Errorf("log line is not JSON: %s", line)
			}
		}
	})

	t.Run("second SIGTERM", func(t *testing.T) {
		p := startServe(t, bin)
		for i := 0; i < 2; i++ {
			p.admit("slow", map[string]any{"sleep_ms": 60000})
		}
		harness.WaitFor(t, 10*time.Second, "2 jobs running at the executor", func() (bool, error) { return p.exec.Stats().InFlight == 2, nil })
		p.signal(syscall.SIGTERM)
		harness.WaitFor(t, 5*time.Second, "the process to stop claiming", func() (bool, error) {
			return strings.Contains(p.log.String(), "stopped claiming"), nil
		})
		p.signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(3 * time.Second):
			t.Fatalf("a second SIGTERM did not exit at once\n%s", p.log.String())
		}
		// Nothing is lost: both jobs are still in flight under a live lease, which recovery
		// resolves (SPEC §12 invariant 1).
		var inFlight int
		if err := p.db.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM jobs WHERE status IN ('dispatched','running')
			AND lease_until > UTC_TIMESTAMP(6)`).Scan(&inFlight); err != nil || inFlight != 2 {
			t.Errorf("%d jobs in flight with a live lease after the forced exit (%v), want 2", inFlight, err)
		}
		// A drainer that died without a clean stop is reported stalled once it has missed 3 poll
		// periods, from the database alone.
		r, err := status.New(status.Config{DB: p.db.DB})
		if err != nil {
			t.Fatal(err)
		}
		harness.WaitFor(t, 10*time.Second, "the dead drainer to be reported stalled", func() (bool, error) {
			st, err := r.Read(context.Background())
			if err != nil || len(st.Drainers) != 1 {
				return false, err
			}
			d := st.Drainers[0]
			return d.ID == "serve-under-test" && d.State == status.Stalled && strings.Contains(d.Reason, "no heartbeat"), nil
		})
	})
}

// regexpLine reports whether some line of text matches pattern.
func regexpLine(text, pattern string) bool {
	re := regexp.MustCompile(pattern)
	for _, line := range strings.Split(text, "\n") {
		if re.MatchString(line) {
			return true
		}
	}
	return false
}
