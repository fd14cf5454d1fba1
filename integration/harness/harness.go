// Package harness starts a complete sluice for a test or benchmark: its own database, its own
// embedded NATS server with JetStream, the simulated executor and the same App that
// `sluice serve` runs, on free loopback ports, all stopped in the test's cleanup. It also has the
// small HTTP helpers the tests share and WaitFor, the one way tests wait: on a condition, with a
// deadline.
package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cmd/sluice/app"
	"github.com/sluicehq/sluice/drainer/executor/simexec"
	"github.com/sluicehq/sluice/gate/api"
	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/integration/testdb"
	"github.com/sluicehq/sluice/integration/wait"
)

// Tokens used by every harness.
const (
	ProducerToken = "producer-token-0123456789abcdef0123"
	ExecutorToken = "executor-token-0123456789abcdef0123"
	AdminToken    = "admin-token-0123456789abcdef0123456"
	Secret        = "test-secret-0123456789abcdef0123456"
)

// Env is a running sluice with its dependencies.
type Env struct {
	DB      *testdb.DB
	NATS    *natstest.Server
	Exec    *simexec.Server
	ExecURL string
	App     *app.App
	URL     string // API base URL
	HTTP    *http.Client

	natsURL string
	tokens  *api.Tokens
	log     *slog.Logger
}

// Options tune Start.
type Options struct {
	// Roles, as app.Options; all false runs all three.
	API, Relay, Drainer bool
	// NATSURL, if set, is a broker the test owns (one it stops and starts); the harness then
	// starts no embedded server and Env.NATS is nil.
	NATSURL string
	// OnReceive is passed to the simulated executor.
	OnReceive func(jobID int64, tenant string, at time.Time)
	// Log, if nil, discards (set SLUICE_TEST_LOG=1 to see the app's log).
	Log *slog.Logger
	// Memcached, as app.Options: the rate-gate servers. Default none (no key is ever gated).
	Memcached []string
	// GateTimeout, as app.Options. Tests that assert gates hold set it well above the 50 ms
	// default, which a loaded 2-core machine running -race can exceed (and then fails open).
	GateTimeout time.Duration
	// MetricsListen, MetricsToken and NoTenantLabels, as app.Options.
	MetricsListen, MetricsToken string
	NoTenantLabels              bool
	// ExecutorURL, if set, receives the dispatches instead of the simulated executor, which is
	// then not started (Env.Exec is nil): a test's own executor.
	ExecutorURL string
	// ExecutorID, as app.Options: the audience every dispatch names. Default none.
	ExecutorID string
	// Listen is the API's address (StartApp: to start an API again where a stopped one
	// listened). Default 127.0.0.1:0, a free port.
	Listen string
	// Tokens are configured besides the three of every harness (a producer scoped to some
	// tenants, say).
	Tokens []api.Token
	// MaxConns, MaxConnsPerSource, ReservedConns and ExecutorSources, as app.Options: the
	// listener's connection bounds. Default: app's.
	MaxConns, MaxConnsPerSource, ReservedConns int
	ExecutorSources                            []netip.Prefix
	// WaitBackstop, as app.Options.
	WaitBackstop time.Duration
}

// Start brings up an Env for tb.
func Start(tb testing.TB, o Options) *Env {
	tb.Helper()
	e := &Env{DB: testdb.New(tb), HTTP: &http.Client{Timeout: 30 * time.Second}}
	var err error
	natsURL := o.NATSURL
	if natsURL == "" {
		e.NATS = natstest.Start(tb)
		natsURL = e.NATS.URL()
	}
	log := o.Log
	if log == nil {
		if os.Getenv("SLUICE_TEST_LOG") != "" {
			log = slog.New(slog.NewJSONHandler(os.Stderr, nil))
		} else {
			log = slog.New(slog.DiscardHandler)
		}
	}
	if o.ExecutorURL != "" {
		e.ExecURL = o.ExecutorURL
	} else {
		e.Exec = simexec.New(simexec.Config{Secret: []byte(Secret), OnReceive: o.OnReceive, Log: log})
		execSrv := httptest.NewServer(e.Exec.Handler())
		tb.Cleanup(func() { execSrv.Close(); e.Exec.Close() })
		e.ExecURL = execSrv.URL + "/dispatch"
	}
	tokens, err := api.NewTokens(append([]api.Token{
		{Name: "producer", Token: ProducerToken, Role: api.Producer, Tenants: []string{"*"}},
		{Name: "executor", Token: ExecutorToken, Role: api.Executor},
		{Name: "admin", Token: AdminToken, Role: api.Admin},
	}, o.Tokens...))
	if err != nil {
		tb.Fatalf("harness: %v", err)
	}
	e.natsURL, e.tokens, e.log = natsURL, tokens, log
	e.App = e.StartApp(tb, o)
	e.URL = "http://" + e.App.Addr()
	if e.Exec != nil {
		e.Exec.SetAPI(e.URL, ExecutorToken)
	}
	return e
}

// StartApp starts another sluice process (in this one) with the roles and API address of o on the
// Env's database, broker and executor, stopped in tb.Cleanup: split roles, as on separate hosts.
func (e *Env) StartApp(tb testing.TB, o Options) *app.App {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	listen := o.Listen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	a, err := app.Start(ctx, app.Options{
		MySQLDSN: e.DB.DSN, NATSURL: e.natsURL, Listen: listen,
		ExecutorURL: e.ExecURL, ExecutorSecret: Secret, ExecutorID: o.ExecutorID, Tokens: e.tokens, InitStream: true,
		API: o.API, Relay: o.Relay, Drainer: o.Drainer, Grace: 10 * time.Second, Log: e.log,
		Memcached: o.Memcached, GateTimeout: o.GateTimeout,
		MetricsListen: o.MetricsListen, MetricsToken: o.MetricsToken, NoTenantLabels: o.NoTenantLabels,
		MaxConns: o.MaxConns, MaxConnsPerSource: o.MaxConnsPerSource, ReservedConns: o.ReservedConns,
		ExecutorSources: o.ExecutorSources, WaitBackstop: o.WaitBackstop,
	})
	if err != nil {
		tb.Fatalf("harness: start sluice: %v", err)
	}
	tb.Cleanup(func() { _ = a.Stop(context.Background()) })
	return a
}

// Response is a decoded API answer.
type Response struct {
	Status int
	Header http.Header
	Body   map[string]any
	Raw    []byte
}

// Do sends method path with body (marshalled to JSON unless it is []byte) and token.
func (e *Env) Do(tb testing.TB, method, path, token string, body any) Response {
	tb.Helper()
	return e.DoHeader(tb, method, path, token, body, nil)
}

// DoHeader is Do with the request headers in h added.
func (e *Env) DoHeader(tb testing.TB, method, path, token string, body any, h http.Header) Response {
	tb.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			tb.Fatalf("marshal: %v", err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, e.URL+path, rd)
	if err != nil {
		tb.Fatalf("request: %v", err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, vs := range h {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := e.HTTP.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("%s %s: read: %v", method, path, err)
	}
	out := Response{Status: resp.StatusCode, Header: resp.Header, Raw: raw}
	if len(raw) > 0 && raw[0] == '{' {
		if err := json.Unmarshal(raw, &out.Body); err != nil {
			tb.Fatalf("%s %s: decode %q: %v", method, path, raw, err)
		}
	}
	return out
}

// Admit posts a job for tenant with payload and returns its id, failing tb unless it got 202.
func (e *Env) Admit(tb testing.TB, tenant string, payload any) int64 {
	tb.Helper()
	r := e.Do(tb, http.MethodPost, "/v1/jobs", ProducerToken, map[string]any{"tenant": tenant, "payload": payload})
	if r.Status != http.StatusAccepted {
		tb.Fatalf("admit: HTTP %d: %s", r.Status, r.Raw)
	}
	return int64(r.Body["id"].(float64))
}

// WaitFor is wait.For: a wait on a condition with a deadline, never a sleep that hopes.
func WaitFor(tb testing.TB, timeout time.Duration, what string, cond func() (bool, error)) {
	tb.Helper()
	wait.For(tb, timeout, what, cond)
}

// CountJobs returns the number of jobs per status.
func (e *Env) CountJobs(ctx context.Context) (map[string]int, error) {
	return e.CountJobsWhere(ctx, "TRUE")
}

// CountJobsWhere returns the number of jobs per status among those matching the SQL condition
// where (with args for its placeholders).
func (e *Env) CountJobsWhere(ctx context.Context, where string, args ...any) (map[string]int, error) {
	rows, err := e.DB.QueryContext(ctx, "SELECT status, COUNT(*) FROM jobs WHERE "+where+" GROUP BY status", args...)
	if err != nil {
		return nil, fmt.Errorf("count jobs: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			return nil, err
		}
		out[s] = n
	}
	return out, rows.Err()
}
