package integration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/cmd/sluice/app"
	"github.com/sluicehq/sluice/drainer/executor/simexec"
	"github.com/sluicehq/sluice/gate/api"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/integration/testdb"
)

// opsEnv is a sluice started by the ops tests with what the shared harness does not expose: a
// database of the test's choosing (a test-owned mariadbd), a NATS URL of its choosing (a broker
// it restarts), the log captured, and the executor's traffic observable.
type opsEnv struct {
	*harness.Env
	Log *syncBuffer
}

type opsOptions struct {
	DSN     string // default: a fresh testdb
	NATSURL string // default: a fresh embedded server
	// WrapExec wraps the simulated executor's handler (to observe dispatches).
	WrapExec  func(http.Handler) http.Handler
	Memcached []string
	Poll      time.Duration
}

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func startOps(t *testing.T, o opsOptions) *opsEnv {
	t.Helper()
	e := &opsEnv{Env: &harness.Env{HTTP: &http.Client{Timeout: 30 * time.Second}}, Log: &syncBuffer{}}
	log := slog.New(slog.NewJSONHandler(io.MultiWriter(e.Log, testLogSink()), &slog.HandlerOptions{Level: slog.LevelDebug}))
	dsn := o.DSN
	if dsn == "" {
		e.DB = testdb.New(t)
		dsn = e.DB.DSN
	}
	natsURL := o.NATSURL
	if natsURL == "" {
		ns := natstest.Start(t)
		e.NATS = ns
		natsURL = ns.URL()
	}
	e.Exec = simexec.New(simexec.Config{Secret: []byte(harness.Secret), Log: log})
	var h http.Handler = e.Exec.Handler()
	if o.WrapExec != nil {
		h = o.WrapExec(h)
	}
	execSrv := httptest.NewServer(h)
	t.Cleanup(func() { execSrv.Close(); e.Exec.Close() })
	e.ExecURL = execSrv.URL + "/dispatch"
	tokens, err := api.NewTokens([]api.Token{
		{Name: "producer", Token: harness.ProducerToken, Role: api.Producer, Tenants: []string{"*"}},
		{Name: "executor", Token: harness.ExecutorToken, Role: api.Executor},
		{Name: "admin", Token: harness.AdminToken, Role: api.Admin},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e.App, err = app.Start(ctx, app.Options{
		MySQLDSN: dsn, NATSURL: natsURL, Listen: "127.0.0.1:0", ExecutorURL: e.ExecURL,
		ExecutorSecret: harness.Secret, Tokens: tokens, InitStream: true, Grace: 10 * time.Second,
		Log: log, Memcached: o.Memcached, PollInterval: o.Poll, DrainerID: "ops-" + strconv.Itoa(os.Getpid()) + "-" + t.Name(),
	})
	if err != nil {
		t.Fatalf("start sluice: %v", err)
	}
	t.Cleanup(func() { _ = e.App.Stop(context.Background()) })
	e.URL = "http://" + e.App.Addr()
	e.Exec.SetAPI(e.URL, harness.ExecutorToken)
	return e
}

func testLogSink() io.Writer {
	if os.Getenv("SLUICE_TEST_LOG") != "" {
		return os.Stderr
	}
	return io.Discard
}

// mariadb is a test-owned MariaDB server on its own port and data directory, which the test
// may kill (SIGKILL) and restart.
type mariadb struct {
	t       *testing.T
	dir     string
	port    int
	cmd     *exec.Cmd
	done    chan struct{}
	logFile *os.File
	opts    mariadbOptions
}

// mariadbOptions tune a test-owned MariaDB server.
type mariadbOptions struct {
	// Args are more mariadbd options (--ssl-cert=...).
	Args []string
	// TLS, if set, is the name of a TLS configuration registered with the driver
	// (mysql.RegisterTLSConfig), over which the start-up check connects: for a server that
	// requires TLS. Set by the test itself, apart from the code under test.
	TLS string
}

// startMariaDB initialises a data directory and starts mariadbd on a free loopback port.
func startMariaDB(t *testing.T) *mariadb {
	t.Helper()
	return startMariaDBWith(t, mariadbOptions{})
}

// startMariaDBWith is startMariaDB with opts.
func startMariaDBWith(t *testing.T, opts mariadbOptions) *mariadb {
	t.Helper()
	for _, bin := range []string{"/usr/sbin/mariadbd", "mariadb-install-db"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("this test needs %s (MariaDB server): %v; run deploy/local/setup.sh", bin, err)
		}
	}
	m := &mariadb{t: t, dir: t.TempDir(), port: natstest.FreePort(t), opts: opts}
	install := exec.Command("mariadb-install-db", "--no-defaults", "--datadir="+filepath.Join(m.dir, "data"),
		"--auth-root-authentication-method=normal", "--skip-test-db", "--user=root")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	var err error
	if m.logFile, err = os.Create(filepath.Join(m.dir, "mariadbd.log")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.kill()
		m.logFile.Close()
	})
	m.start()
	return m
}

// DSN returns a DSN for database name on this server.
func (m *mariadb) DSN(name string) string {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName = "root", "tcp", fmt.Sprintf("127.0.0.1:%d", m.port), name
	return cfg.FormatDSN()
}

func (m *mariadb) start() {
	m.t.Helper()
	args := []string{"--no-defaults", "--datadir=" + filepath.Join(m.dir, "data"),
		"--port=" + strconv.Itoa(m.port), "--socket=" + filepath.Join(m.dir, "sock"), "--bind-address=127.0.0.1",
		"--user=root", "--skip-name-resolve", "--innodb-buffer-pool-size=64M", "--innodb-log-file-size=16M",
		"--skip-log-bin", "--pid-file=" + filepath.Join(m.dir, "pid"), "--max-connections=500"}
	m.cmd = exec.Command("/usr/sbin/mariadbd", append(args, m.opts.Args...)...)
	m.cmd.Stdout, m.cmd.Stderr = m.logFile, m.logFile
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := m.cmd.Start(); err != nil {
		m.t.Fatalf("start mariadbd: %v", err)
	}
	done := make(chan struct{})
	m.done = done
	go func(c *exec.Cmd) { _ = c.Wait(); close(done) }(m.cmd)
	ctx := context.Background()
	harness.WaitFor(m.t, 60*time.Second, "the test-owned mariadbd to accept connections", func() (bool, error) {
		select {
		case <-done:
			log, _ := os.ReadFile(m.logFile.Name())
			m.t.Fatalf("mariadbd exited during start-up:\n%s", log)
		default:
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		dsn := m.DSN("")
		if m.opts.TLS != "" {
			cfg, _ := mysql.ParseDSN(dsn)
			cfg.TLSConfig = m.opts.TLS
			dsn = cfg.FormatDSN()
		}
		db, err := store.Open(pctx, dsn)
		if err != nil {
			return false, err
		}
		db.Close()
		return true, nil
	})
}

// kill SIGKILLs the server and waits for it to be gone.
func (m *mariadb) kill() {
	if m.cmd == nil || m.cmd.Process == nil {
		return
	}
	_ = m.cmd.Process.Signal(syscall.SIGKILL)
	<-m.done
	m.cmd = nil
}

// apiDo is a goroutine-safe request helper: unlike harness.Env.Do it never calls t.Fatal, so
// load generators can use it; a transport error comes back as err.
func apiDo(ctx context.Context, hc *http.Client, method, url, token string, body any) (int, map[string]any, error) {
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, nil, err
	}
	var out map[string]any
	if len(raw) > 0 && raw[0] == '{' {
		if err := json.Unmarshal(raw, &out); err != nil {
			return resp.StatusCode, nil, fmt.Errorf("decode %q: %w", raw, err)
		}
	}
	return resp.StatusCode, out, nil
}

// scrape returns the /metrics text.
func scrape(t testing.TB, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// metricValue returns the value of the series line that starts with series (name and labels
// exactly as exposed), and whether it was found.
func metricValue(text, series string) (float64, bool) {
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}
