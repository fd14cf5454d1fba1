package integration_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/cmd/sluice/app"
	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/admitrate"
	"github.com/sluicehq/sluice/gate/api"
	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/limits"
	"github.com/sluicehq/sluice/gate/rategate"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/gate/waiters"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/testdb"
)

// Front-door tokens: two producers with disjoint tenants, one for every tenant, an executor and
// an admin.
const (
	fdAlphaToken = "alpha-producer-token-0001-abcdefghij" // tenants acme, globex
	fdBetaToken  = "beta-producer-token-0002-abcdefghijk" // tenant initech
	fdStarToken  = "star-producer-token-0003-abcdefghijk" // every tenant
	fdExecToken  = "executor-token-0004-abcdefghijklmnopq"
	fdAdminToken = "admin-token-0005-abcdefghijklmnopqrst"
)

// frontDoor is the admission API over a test's own database: the same gate.Admitter and
// api.Server that `sluice serve` runs, built directly so a test can set the runtime config,
// inject faults and read the log and metrics.
type frontDoor struct {
	db      *testdb.DB
	limits  *limits.Cache
	adm     *gate.Admitter
	api     *api.Server
	srv     *httptest.Server
	url     string
	reg     *prometheus.Registry
	logs    *logBuffer
	limiter *admitrate.Limiter
	now     *fakeNow

	alpha, beta, star, exec, admin *client.Client
}

type fdOptions struct {
	// memcached is the rate limiter's server; "" runs without a rate limiter.
	memcached string
	faults    *gate.Faults
	gates     gate.RateGateLookup
	// admitDB, if set, is the database handle admission uses (a proxied one), for its
	// transactions and its reads; it must take several statements in one round trip.
	admitDB *sql.DB
	// apiDB, if set, is the database handle (an OpenMulti pool) of the API's own transactions
	// (start, complete, cancel, releases) and clock; reads of jobs go through admission's.
	apiDB *sql.DB
	// apiGates, if set, is the gate store of the API's /v1/gates endpoints.
	apiGates *rategate.Store
	// lanes is gate.Config.Lanes; 0 takes the default.
	lanes int
	// audit is gate.Config.Audit: the queue of refusal events.
	audit *store.AuditQueue
	// auditOff is gate.Config.AuditOff: no audit rows (the benchmarks' comparison).
	auditOff bool
	// waiters is api.Config.Waiters: a hub with bounds of the test's own (its Read is set
	// here). Default: the API's. Nothing runs the hub's backstop: a test ticks it.
	waiters *waiters.Config
	// maxRequests is api.Config.MaxRequests; 0 takes the default.
	maxRequests int
}

// fakeNow is the wall clock of rate-limit windows and gates, fixed unless a test moves it, so
// that a minute boundary never splits a test's charges.
type fakeNow struct {
	mu sync.Mutex
	t  time.Time
}

func (f *fakeNow) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.t
}

// fakeClock is a fakeNow as the admission's clock.Clock.
type fakeClock struct{ *fakeNow }

func (c fakeClock) Now(context.Context) (time.Time, error) { return c.fakeNow.Now(), nil }

// logBuffer collects the JSON log lines of a test. Safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// lines returns the decoded log lines whose msg is msg.
func (l *logBuffer) lines(tb testing.TB, msg string) []map[string]any {
	tb.Helper()
	var out []map[string]any
	for _, line := range strings.Split(l.String(), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			tb.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

func startFrontDoor(t testing.TB, o fdOptions) *frontDoor {
	t.Helper()
	return startFrontDoorOn(t, &frontDoor{db: testdb.New(t)}, o)
}

// startFrontDoorOn starts another front door on the database of base.
func startFrontDoorOn(t testing.TB, base *frontDoor, o fdOptions) *frontDoor {
	t.Helper()
	f := &frontDoor{db: base.db, reg: prometheus.NewRegistry(), logs: &logBuffer{},
		now: &fakeNow{t: clock.Trunc(time.Now())}}
	log := slog.New(slog.NewJSONHandler(io.MultiWriter(f.logs), &slog.HandlerOptions{Level: slog.LevelDebug}))
	f.limits = limits.NewCache(f.db, log)
	failOpen, err := gate.NewFailOpenMetrics(f.reg)
	if err != nil {
		t.Fatal(err)
	}
	// Sluice's two pools, as the App opens them: reads on one that refuses stacked statements
	// (store.Open), admission transactions on one that takes them (store.OpenMulti).
	plain := f.db.Plain(t)
	cfg := gate.Config{DB: plain, TxDB: f.db.DB, Limits: f.limits, Log: log, Metrics: gate.NewMetrics(f.reg),
		FailOpenMetrics: failOpen, Faults: o.faults, RateGates: o.gates, Clock: fakeClock{f.now}, Lanes: o.lanes,
		Audit: o.audit, AuditOff: o.auditOff}
	if o.admitDB != nil {
		cfg.DB, cfg.TxDB = o.admitDB, o.admitDB
	}
	if o.memcached != "" {
		mc := memcache.New(o.memcached)
		mc.MaxIdleConns = 64
		if f.limiter, err = admitrate.New(admitrate.Config{Client: mc}); err != nil {
			t.Fatal(err)
		}
		cfg.RateLimiter = f.limiter
	}
	if f.adm, err = gate.New(cfg); err != nil {
		t.Fatal(err)
	}
	tokens, err := api.NewTokens([]api.Token{
		{Name: "alpha", Token: fdAlphaToken, Role: api.Producer, Tenants: []string{"acme", "globex"}},
		{Name: "beta", Token: fdBetaToken, Role: api.Producer, Tenants: []string{"initech"}},
		{Name: "star", Token: fdStarToken, Role: api.Producer, Tenants: []string{"*"}},
		{Name: "exec", Token: fdExecToken, Role: api.Executor},
		{Name: "admin", Token: fdAdminToken, Role: api.Admin},
	})
	if err != nil {
		t.Fatal(err)
	}
	apiDB, apiTxDB := plain, (*sql.DB)(nil) // the Admitter's
	if o.apiDB != nil {
		apiDB, apiTxDB = o.apiDB, o.apiDB
	}
	var hub *waiters.Hub
	if o.waiters != nil {
		if hub, err = api.NewWaiters(plain, *o.waiters); err != nil {
			t.Fatal(err)
		}
	}
	s, err := api.New(api.Config{DB: apiDB, TxDB: apiTxDB, Admitter: f.adm, Limits: f.limits, Tokens: tokens, Gatherer: f.reg, Log: log,
		RateGates: o.apiGates, Waiters: hub, MaxRequests: o.maxRequests, Simulate: app.Simulator(apiDB)})
	if err != nil {
		t.Fatal(err)
	}
	f.api = s
	f.srv = httptest.NewServer(s)
	t.Cleanup(f.srv.Close)
	f.url = f.srv.URL
	f.alpha = client.New(f.url, fdAlphaToken)
	f.beta = client.New(f.url, fdBetaToken)
	f.star = client.New(f.url, fdStarToken)
	f.exec = client.New(f.url, fdExecToken)
	f.admin = client.New(f.url, fdAdminToken)
	return f
}

// setConfig writes a new runtime config version with changes applied and reloads it, as
// PATCH /v1/config would.
func (f *frontDoor) setConfig(t testing.TB, changes map[string]any) {
	t.Helper()
	testdb.PatchLimits(t, f.db.DB, changes)
	if err := f.limits.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// do sends a raw request (body []byte or JSON-marshalled) with token.
func (f *frontDoor) do(t testing.TB, method, path, token string, body any) harness.Response {
	t.Helper()
	e := &harness.Env{URL: f.url, HTTP: &http.Client{Timeout: 30 * time.Second}}
	return e.Do(t, method, path, token, body)
}

// rowCounts returns the rows in jobs, outbox and tenants: what "writes nothing" is checked on.
func (f *frontDoor) rowCounts(t testing.TB) [3]int {
	t.Helper()
	var c [3]int
	for i, table := range []string{"jobs", "outbox", "tenants"} {
		if err := f.db.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM "+table).Scan(&c[i]); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// fillQueued inserts n queued jobs of tenant directly (what earlier admissions would have left).
func (f *frontDoor) fillQueued(t testing.TB, tenant string, n int, status string) {
	t.Helper()
	// Every job's tenant has a row in tenants (admission writes it; the drainer relies on it).
	if _, err := f.db.ExecContext(context.Background(), "INSERT IGNORE INTO tenants (tenant, created_at) VALUES (?, UTC_TIMESTAMP(6))", tenant); err != nil {
		t.Fatal(err)
	}
	for n > 0 {
		k := min(n, 500)
		q := "INSERT INTO jobs (tenant, status, queued_at) VALUES " + strings.TrimSuffix(strings.Repeat("(?, ?, UTC_TIMESTAMP(6)),", k), ",")
		args := make([]any, 0, 2*k)
		for i := 0; i < k; i++ {
			args = append(args, tenant, status)
		}
		if _, err := f.db.ExecContext(context.Background(), q, args...); err != nil {
			t.Fatal(err)
		}
		n -= k
	}
	if err := store.RecountQueues(context.Background(), f.db, tenant); err != nil {
		t.Fatal(err)
	}
}

// counter returns the value of a counter in f's registry, or of its series with label=value.
func (f *frontDoor) counter(t testing.TB, name, label, value string) float64 {
	t.Helper()
	if label == "" {
		return harness.Counter(t, f.reg, name)
	}
	return harness.Counter(t, f.reg, name, label, value)
}

// uniqueTenant returns a tenant name no other test run uses (memcached outlives databases).
func uniqueTenant(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

func jobID(t testing.TB, body map[string]any) int64 {
	t.Helper()
	v, ok := body["id"].(float64)
	if !ok {
		t.Fatalf("body has no id: %v", body)
	}
	return int64(v)
}

func asErr(err error, target **client.Error) bool {
	e, ok := err.(*client.Error)
	if ok {
		*target = e
	}
	return ok
}

// commitWithFault ends tx as the named fault says, for a gate.Faults Commit hook:
// "commit-lost" (the server committed, the answer was lost), "commit-rolled-back" (the connection
// broke before the server committed), "commit-refused" (the server answered an error: nothing
// committed), anything else a plain commit.
func commitWithFault(tx gate.Tx, fault string) error {
	switch fault {
	case "commit-lost":
		if err := tx.Commit(); err != nil {
			return err
		}
		return mysql.ErrInvalidConn
	case "commit-rolled-back":
		_ = tx.Rollback()
		return mysql.ErrInvalidConn
	case "commit-refused":
		_ = tx.Rollback()
		return &mysql.MySQLError{Number: 1180, Message: "Got error during COMMIT"}
	}
	return tx.Commit()
}
