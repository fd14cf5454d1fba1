package apitest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/cmd/sluice/app"
	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/admitrate"
	"github.com/sluicehq/sluice/gate/api"
	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/rategate"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/gate/waiters"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/testdb"
)

// Front-door tokens: two producers with disjoint tenants, one for every tenant, an executor and
// an admin.
const (
	AlphaToken = "alpha-producer-token-0001-abcdefghij" // tenants acme, globex
	BetaToken  = "beta-producer-token-0002-abcdefghijk" // tenant initech
	StarToken  = "star-producer-token-0003-abcdefghijk" // every tenant
	ExecToken  = "executor-token-0004-abcdefghijklmnopq"
	AdminToken = "admin-token-0005-abcdefghijklmnopqrst"
)

// Env is the admission API over a test's own database: the same gate.Admitter and api.Server
// that `sluice serve` runs, built directly so a test can set the runtime config, inject faults
// and read the log and metrics.
type Env struct {
	DB       *testdb.DB
	Limits   *config.Cache
	Admitter *gate.Admitter
	API      *api.Server
	Server   *httptest.Server
	URL      string
	Reg      *prometheus.Registry
	Logs     *LogBuffer
	Limiter  *admitrate.Limiter // nil unless Options.Memcached is set
	// Now is admission's clock, fixed unless a test moves it (Advance), so that a minute
	// boundary never splits a test's rate-limit charges.
	Now *clock.Fake

	// Clients of the front door, one per token: AlphaToken, BetaToken, StarToken, ExecToken,
	// AdminToken.
	Alpha, Beta, Star, Exec, Admin *client.Client
}

// Options are what a test changes of its front door. The zero value is a plain one: no rate
// limiter, fault hooks or gates, and the default lanes, audit and waiters.
type Options struct {
	// Memcached is the rate limiter's server; "" runs without a rate limiter.
	Memcached string
	Faults    *gate.Faults
	Gates     gate.RateGateLookup
	// AdmitDB, if set, is the database handle admission uses (a proxied one), for its
	// transactions and its reads; it must take several statements in one round trip.
	AdmitDB *sql.DB
	// APIDB, if set, is the database handle (an OpenMulti pool) of the API's own transactions
	// (start, complete, cancel, releases) and clock; reads of jobs go through admission's.
	APIDB *sql.DB
	// APIGates, if set, is the gate store of the API's /v1/gates endpoints.
	APIGates *rategate.Store
	// Lanes is gate.Config.Lanes; 0 takes the default.
	Lanes int
	// Audit is gate.Config.Audit: the queue of refusal events.
	Audit *store.AuditQueue
	// AuditOff is gate.Config.AuditOff: no audit rows (the benchmarks' comparison).
	AuditOff bool
	// Waiters is api.Config.Waiters: a hub with bounds of the test's own (its Read is set
	// here). Default: the API's. Nothing runs the hub's backstop: a test ticks it.
	Waiters *waiters.Config
	// MaxRequests is api.Config.MaxRequests; 0 takes the default.
	MaxRequests int
}

// Time is the front door's clock reading (Env.Now), for the rate limiter's windows.
func (f *Env) Time() time.Time {
	t, _ := f.Now.Now(context.Background())
	return t
}

// Setup starts a front door over a new test database.
func Setup(tb testing.TB, o Options) *Env {
	tb.Helper()
	return SetupOn(tb, &Env{DB: testdb.New(tb)}, o)
}

// SetupOn starts another front door on the database of base (only base.DB is used).
func SetupOn(tb testing.TB, base *Env, o Options) *Env {
	tb.Helper()
	f := &Env{DB: base.DB, Reg: prometheus.NewRegistry(), Logs: &LogBuffer{},
		Now: clock.NewFake(time.Now())}
	log := slog.New(slog.NewJSONHandler(io.MultiWriter(f.Logs), &slog.HandlerOptions{Level: slog.LevelDebug}))
	f.Limits = config.NewCache(f.DB, log)
	failOpen, err := gate.NewFailOpenMetrics(f.Reg)
	if err != nil {
		tb.Fatal(err)
	}
	// Sluice's two pools, as the App opens them: reads on one that refuses stacked statements
	// (store.Open), admission transactions on one that takes them (store.OpenMulti).
	plain := f.DB.Plain(tb)
	cfg := gate.Config{DB: plain, TxDB: f.DB.DB, Limits: f.Limits, Log: log, Metrics: gate.NewMetrics(f.Reg),
		FailOpenMetrics: failOpen, Faults: o.Faults, RateGates: o.Gates, Clock: f.Now, Lanes: o.Lanes,
		Audit: o.Audit, AuditOff: o.AuditOff}
	if o.AdmitDB != nil {
		cfg.DB, cfg.TxDB = o.AdmitDB, o.AdmitDB
	}
	if o.Memcached != "" {
		mc := memcache.New(o.Memcached)
		mc.MaxIdleConns = 64
		if f.Limiter, err = admitrate.New(admitrate.Config{Client: mc}); err != nil {
			tb.Fatal(err)
		}
		cfg.RateLimiter = f.Limiter
	}
	if f.Admitter, err = gate.New(cfg); err != nil {
		tb.Fatal(err)
	}
	tokens, err := api.NewTokens([]api.Token{
		{Name: "alpha", Token: AlphaToken, Role: api.Producer, Tenants: []string{"acme", "globex"}},
		{Name: "beta", Token: BetaToken, Role: api.Producer, Tenants: []string{"initech"}},
		{Name: "star", Token: StarToken, Role: api.Producer, Tenants: []string{"*"}},
		{Name: "exec", Token: ExecToken, Role: api.Executor},
		{Name: "admin", Token: AdminToken, Role: api.Admin},
	})
	if err != nil {
		tb.Fatal(err)
	}
	apiDB, apiTxDB := plain, (*sql.DB)(nil) // the Admitter's
	if o.APIDB != nil {
		apiDB, apiTxDB = o.APIDB, o.APIDB
	}
	var hub *waiters.Hub
	if o.Waiters != nil {
		if hub, err = api.NewWaiters(plain, *o.Waiters); err != nil {
			tb.Fatal(err)
		}
	}
	s, err := api.New(api.Config{DB: apiDB, TxDB: apiTxDB, Admitter: f.Admitter, Limits: f.Limits, Tokens: tokens, Gatherer: f.Reg, Log: log,
		RateGates: o.APIGates, Waiters: hub, MaxRequests: o.MaxRequests, Simulate: app.Simulator(apiDB)})
	if err != nil {
		tb.Fatal(err)
	}
	f.API = s
	f.Server = httptest.NewServer(s)
	tb.Cleanup(f.Server.Close)
	f.URL = f.Server.URL
	f.Alpha = client.New(f.URL, AlphaToken)
	f.Beta = client.New(f.URL, BetaToken)
	f.Star = client.New(f.URL, StarToken)
	f.Exec = client.New(f.URL, ExecToken)
	f.Admin = client.New(f.URL, AdminToken)
	return f
}

// SetConfig writes a new runtime config version with changes applied and reloads it, as
// PATCH /v1/config would.
func (f *Env) SetConfig(tb testing.TB, changes map[string]any) {
	tb.Helper()
	testdb.PatchLimits(tb, f.DB.DB, changes)
	if err := f.Limits.Reload(context.Background()); err != nil {
		tb.Fatal(err)
	}
}

// Do sends a raw request (body []byte or JSON-marshalled) with token.
func (f *Env) Do(tb testing.TB, method, path, token string, body any) harness.Response {
	tb.Helper()
	e := &harness.Env{URL: f.URL, HTTP: &http.Client{Timeout: 30 * time.Second}}
	return e.Do(tb, method, path, token, body)
}

// RowCounts returns the rows in jobs, outbox and tenants: what "writes nothing" is checked on.
func (f *Env) RowCounts(tb testing.TB) [3]int {
	tb.Helper()
	var c [3]int
	for i, table := range []string{"jobs", "outbox", "tenants"} {
		if err := f.DB.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM "+table).Scan(&c[i]); err != nil {
			tb.Fatal(err)
		}
	}
	return c
}

// FillQueued inserts n jobs of tenant in status directly (what earlier admissions would have
// left).
func (f *Env) FillQueued(tb testing.TB, tenant string, n int, status string) {
	tb.Helper()
	// Every job's tenant has a row in tenants (admission writes it; the drainer relies on it).
	if _, err := f.DB.ExecContext(context.Background(), "INSERT IGNORE INTO tenants (tenant, created_at) VALUES (?, UTC_TIMESTAMP(6))", tenant); err != nil {
		tb.Fatal(err)
	}
	for n > 0 {
		k := min(n, 500)
		q := "INSERT INTO jobs (tenant, status, queued_at) VALUES " + strings.TrimSuffix(strings.Repeat("(?, ?, UTC_TIMESTAMP(6)),", k), ",")
		args := make([]any, 0, 2*k)
		for i := 0; i < k; i++ {
			args = append(args, tenant, status)
		}
		if _, err := f.DB.ExecContext(context.Background(), q, args...); err != nil {
			tb.Fatal(err)
		}
		n -= k
	}
	if err := store.RecountQueues(context.Background(), f.DB, tenant); err != nil {
		tb.Fatal(err)
	}
}

// Counter returns the value of a counter in f's registry, or of its series with label=value.
func (f *Env) Counter(tb testing.TB, name, label, value string) float64 {
	tb.Helper()
	if label == "" {
		return harness.Counter(tb, f.Reg, name)
	}
	return harness.Counter(tb, f.Reg, name, label, value)
}

// UniqueTenant returns a tenant name no other test run uses (memcached outlives databases).
func UniqueTenant(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

// JobID returns the id of the job in an answer's body, failing tb if it has none.
func JobID(tb testing.TB, body map[string]any) int64 {
	tb.Helper()
	v, ok := body["id"].(float64)
	if !ok {
		tb.Fatalf("body has no id: %v", body)
	}
	return int64(v)
}

// AsClientError reports whether err is the client's *client.Error, and sets *target to it if so.
func AsClientError(err error, target **client.Error) bool {
	e, ok := err.(*client.Error)
	if ok {
		*target = e
	}
	return ok
}
