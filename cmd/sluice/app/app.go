// Package app wires sluice's components into one running process: it opens the database and the
// broker, builds the API, relay and drainer that the options ask for, runs them, and stops them
// in order. cmd/sluice parses flags into Options; the integration tests build the same App with
// port 0, so what they test is what ships.
package app

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/admitrate"
	"github.com/sluicehq/sluice/gate/api"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/logq"
	"github.com/sluicehq/sluice/gate/rategate"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/gate/waiters"
	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/outbox"
	"github.com/sluicehq/sluice/publisher"
)

// Options are a process's static settings (SPEC §9). Field docs give the defaults.
type Options struct {
	// MySQLDSN names the database. Required.
	MySQLDSN string
	// NATSURL is the broker. Required.
	NATSURL string
	// NATSAuth is the broker's credentials, if it requires any.
	NATSAuth publisher.NATSAuth
	// MetricsListen, if set, serves /metrics on this address instead of the API's listener
	// (SLUICE_METRICS_LISTEN); MetricsToken, if set, is the bearer token a scrape must carry
	// (SLUICE_METRICS_TOKEN; not the placeholder of the example settings); NoTenantLabels keeps
	// tenant names out of metric labels (SLUICE_METRICS_TENANT_LABELS=false).
	MetricsListen, MetricsToken string
	NoTenantLabels              bool
	// CORSOrigins are the browser origins allowed to call the API (SLUICE_CORS_ORIGINS).
	// Default none.
	CORSOrigins []string
	// CoreNATS publishes without JetStream (for brokers without it). Default false.
	CoreNATS bool
	// Listen is the API address; ":0" picks a free port. Default DefaultListen.
	Listen string
	// Listener, if set, is the API's listener (or the ops endpoints' of a process without the
	// API role), already bound; Listen is then ignored. A caller that must know the address
	// before the drainer starts claiming binds it first: `sluice dev` gives it to the simulated
	// executor, which calls the API back, and the drainer may dispatch a job queued by an
	// earlier run before Start returns. Start takes it over: Stop closes it, and so does a
	// Start that fails. Default: Start listens on Listen.
	Listener net.Listener
	// ExecutorURL receives dispatches. Required with the drainer role.
	ExecutorURL string
	// ExecutorSecret signs dispatches. Required with ExecutorURL: at least
	// MinExecutorSecretLength bytes, and not the placeholder of deploy/sluice.env.example.
	ExecutorSecret string
	// ExecutorID is named as the audience of every dispatch (SLUICE_EXECUTOR_ID). Default "":
	// none.
	ExecutorID string
	// UnconfirmedStarts: the executor cannot confirm starts. Default false.
	UnconfirmedStarts bool
	// Tokens authenticates API callers. Required with the API role.
	Tokens *api.Tokens
	// DrainerID names the drainer. Default hostname-pid.
	DrainerID string
	// Prefix is the NATS subject prefix. Default "sluice".
	Prefix string
	// API, Relay and Drainer select the roles to run. All false means all three.
	API, Relay, Drainer bool
	// InitStream creates the JetStream stream at start-up if it is missing (an existing one is
	// left as `sluice nats init` set it). Default false.
	InitStream bool
	// PollInterval is the drainer's backstop poll. Default 1 s.
	PollInterval time.Duration
	// Grace is how long Stop waits for in-flight dispatches. Default 30 s.
	Grace time.Duration
	// Version is the build version. Default "dev".
	Version string
	// Log receives everything. Default: JSON on stderr through a logq queue of the App's own,
	// which Stop closes last.
	Log *slog.Logger
	// LogDropped, if set, counts the log lines Log has dropped (logq.Queue.Dropped), exported as
	// sluice_log_dropped_total. Default: the App's own queue's count when Log is unset, else no
	// such metric.
	LogDropped func() uint64
	// Memcached are the rate-gate servers (SLUICE_MEMCACHED). Default: none, and then no key is
	// ever gated (the drainer claims as if memcached were down, and /v1/gates answers 503).
	Memcached []string
	// GateTimeout bounds each memcached round trip of the gate store. Default 50 ms.
	GateTimeout time.Duration
	// MaxConns bounds the connections open at once on the listener; past it, new ones wait to
	// be accepted. Default DefaultMaxConns; negative: no bound.
	MaxConns int
	// MaxRequests bounds the API requests in progress at once other than the executor's
	// callbacks and the probes (api.Config.MaxRequests); keep it well below MaxConns. Default
	// api.DefaultMaxRequests.
	MaxRequests int

	// TLSCertFile and TLSKeyFile (SLUICE_TLS_CERT, SLUICE_TLS_KEY) are the PEM files of the
	// certificate (its chain after it) and private key of the HTTP listeners: set both and the
	// API's listener (or the ops endpoints' of a process without the API role) and the metrics
	// listener serve HTTPS only. The files are read again on ReloadTLS and whenever they
	// change (checked every 10 s); a pair that cannot be used then is logged and the previous
	// one kept. Start fails if they cannot be loaded, or if only one is set. Default: plain
	// HTTP.
	TLSCertFile, TLSKeyFile string

	// MaxConnsPerSource bounds the connections one source (an IPv4 address, an IPv6 /64)
	// outside ExecutorSources may hold open at once; past it, a new one of its connections is
	// closed as soon as it is accepted (SLUICE_MAX_CONNS_PER_SOURCE). Default
	// DefaultMaxConnsPerSource; negative: no bound.
	MaxConnsPerSource int
	// ReservedConns of MaxConns are kept for ExecutorSources: the other sources together hold
	// at most MaxConns-ReservedConns, and past that a new connection of theirs is closed as soon
	// as it is accepted, so that idle or slow sockets of unauthenticated clients never leave the
	// executor's /start and /complete without a connection (SLUICE_RESERVED_CONNS). Default
	// DefaultReservedConns, or an eighth of a MaxConns below 1,024; negative: none. Must be
	// below MaxConns.
	ReservedConns int
	// ExecutorSources are the addresses the executors call back from (SLUICE_EXECUTOR_SOURCES):
	// their connections are never capped per source and alone may take ReservedConns. Default
	// DefaultExecutorSources (loopback); an empty, non-nil list: none.
	ExecutorSources []netip.Prefix
	// MemoryBudget bounds the bytes that API request bodies and pages of jobs in progress hold
	// together (api.Config.MemoryBudget, SLUICE_MEMORY_BUDGET). Default
	// api.DefaultMemoryBudget; negative: no budget.
	MemoryBudget int64
	// WaitBackstop is the period of the waiting requests' backstop read (waiters.Config.Interval).
	// Default waiters.DefaultInterval; tests set it long to prove that release pokes wake waiters.
	WaitBackstop time.Duration
}

// DefaultListen is the API's listen address when Options.Listen is empty (SPEC §9).
const DefaultListen = "127.0.0.1:7480"

// App is a running sluice process.
type App struct {
	opts      Options
	log       *slog.Logger
	ownLog    *logq.Queue   // the queue under log when Options.Log was unset; Stop closes it
	db        *sql.DB       // refuses several statements in one round trip (store.Open)
	txDB      *sql.DB       // admissions' and the drainer's transactions, which send several (store.OpenMulti)
	clock     *clock.Synced // the database's clock, read once for every component of the process
	nc        *nats.Conn
	limits    *config.Cache
	registry  *prometheus.Registry
	jobs      *store.Metrics // shared by the API's and the drainer's stores; nil with neither role
	drainer   *drainer.Drainer
	relay     *publisher.Relay
	purger    *publisher.Purger
	jobPurger *publisher.Purger
	// auditPurger purges audit events past audit_retention_days, beside jobPurger.
	auditPurger *publisher.Purger
	// audit writes the audit events of refusals that write nothing else (SPEC §10).
	audit   *store.AuditQueue
	fast    *publisher.FastPath
	gates   *rategate.Store
	httpSrv *httpServer
	// waiters wakes the API's requests that wait for a job to change.
	waiters *waiters.Hub
	// metricsSrv serves /metrics on Options.MetricsListen, when set.
	metricsSrv *httpServer
	metricsLn  net.Listener
	listener   net.Listener
	ops        opsState // status, probes and the shutdown sequence (ops.go)

	cancel  context.CancelFunc // stops the loops (claiming, relaying, reloading)
	loops   sync.WaitGroup
	serveWG sync.WaitGroup
	stopped sync.Once

	// tls serves the listeners' certificate (Options.TLSCertFile); nil: plain HTTP.
	tls *certReloader
}

// Start connects and starts the roles in opts. The returned App runs until Stop.
func Start(ctx context.Context, opts Options) (*App, error) {
	opts.setDefaults()
	var ownLog *logq.Queue
	if opts.Log == nil {
		var err error
		if ownLog, err = logq.New(logq.Config{Sink: os.Stderr}); err != nil {
			return nil, err
		}
		opts.Log, opts.LogDropped = slog.New(ownLog.Handler()), ownLog.Dropped
	}
	ok := false
	defer func() {
		// A listener handed over is closed with everything else if Start fails, as it would
		// be by Stop: its caller has nothing left to close it with.
		if !ok && opts.Listener != nil {
			_ = opts.Listener.Close()
		}
		if !ok && ownLog != nil {
			_ = ownLog.Close(context.Background())
		}
	}()
	if err := opts.check(); err != nil {
		return nil, err
	}
	a, err := newApp(opts, ownLog)
	if err != nil {
		return nil, err
	}
	a.ops.init(opts)
	a.ops.ready = newProbe(a.schemaReady)
	defer func() {
		if !ok {
			if a.metricsSrv != nil { // started before a later step failed
				_ = a.metricsSrv.Close()
				a.serveWG.Wait()
			}
			a.closeConns()
		}
	}()
	if err := a.startRoles(ctx); err != nil {
		return nil, err
	}
	a.runLoops()
	ok = true
	a.warnOpenMetrics()
	a.log.Info("sluice started", "api", opts.API, "relay", opts.Relay, "drainer", opts.Drainer, "listen", a.Addr(), "version", opts.Version)
	return a, nil
}

// newApp is the App of opts before it connects to anything: its metrics registry with the
// process's collectors, and its TLS certificate loaded, so that one that cannot be loaded is a
// configuration error found at once.
func newApp(opts Options, ownLog *logq.Queue) (*App, error) {
	a := &App{opts: opts, log: opts.Log, ownLog: ownLog, registry: prometheus.NewRegistry()}
	if opts.TLSCertFile != "" {
		// Before connecting to anything: a certificate that cannot be loaded is a
		// configuration error, found at once.
		var err error
		if a.tls, err = newCertReloader(opts.TLSCertFile, opts.TLSKeyFile, a.log); err != nil {
			return nil, err
		}
	}
	a.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if opts.LogDropped != nil {
		a.registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_log_dropped_total",
			Help: "Log lines dropped because the log sink did not keep up (SPEC §10)."},
			func() float64 { return float64(opts.LogDropped()) }))
	}
	return a, nil
}

// startRoles connects to the database and the broker and starts what opts asks for: the relay,
// the API's fast path, the rate gates, the drainer, the status reader and the servers.
func (a *App) startRoles(ctx context.Context) error {
	opts := a.opts
	js, err := a.connect(ctx)
	if err != nil {
		return err
	}
	installID, err := publisher.InstallationID(ctx, a.db)
	if err != nil {
		return err
	}
	relayMetrics := publisher.NewRelayMetrics(a.registry)
	a.registry.MustRegister(publisher.NewOutboxCollector(a.db, nil, a.log))
	if opts.Relay {
		if err := a.startRelay(js, installID, relayMetrics); err != nil {
			return err
		}
	}
	if opts.API {
		if a.fast, err = publisher.NewFastPath(publisher.FastPathConfig{DB: a.db, NC: a.nc, JS: js, InstallID: installID,
			Log: a.log, Metrics: relayMetrics, Clock: a.clock}); err != nil {
			return err
		}
	}
	if err := a.startGates(); err != nil {
		return err
	}
	if opts.API || opts.Drainer {
		// Jobs end in both roles (the API's /complete, cancels and rejected admissions; the
		// drainer's outcomes, recoveries and expiries), and a registry takes a name once.
		if a.jobs, err = store.NewMetrics(a.registry); err != nil {
			return err
		}
	}
	if opts.Drainer {
		if err := a.startDrainer(); err != nil {
			return err
		}
	}
	if err := a.startStatus(); err != nil {
		return err
	}
	if opts.MetricsListen != "" {
		if err := a.startMetricsServer(ctx); err != nil {
			return err
		}
	}
	if opts.API {
		if err := a.startAPI(ctx); err != nil {
			return err
		}
	} else if err := a.startOpsServer(ctx); err != nil {
		return err
	}
	return nil
}

// warnOpenMetrics says once, at start, that /metrics answers anyone who reaches the listener:
// the default (SPEC §9) suits a scraper on a private network, but on an exposed listener every
// caller reads queue depths and, with tenant labels, the names of the deepest tenants.
func (a *App) warnOpenMetrics() {
	if a.opts.MetricsToken != "" || a.opts.MetricsListen != "" {
		return
	}
	shows := "queue depths, in flight and gated keys"
	if !a.opts.NoTenantLabels {
		shows += ", and the names of the deepest tenants"
	}
	a.log.Warn("/metrics is open to anyone who reaches "+a.Addr()+": it shows "+shows+
		"; set SLUICE_METRICS_TOKEN, or SLUICE_METRICS_LISTEN to serve it on an address of its own",
		"listen", a.Addr())
}

// setDefaults fills in the options left unset: every role, the default listener, prefix, grace
// and version.
func (opts *Options) setDefaults() {
	if !opts.API && !opts.Relay && !opts.Drainer {
		opts.API, opts.Relay, opts.Drainer = true, true, true
	}
	if opts.Listen == "" {
		opts.Listen = DefaultListen
	}
	if opts.Prefix == "" {
		opts.Prefix = outbox.DefaultPrefix
	}
	if opts.Grace <= 0 {
		opts.Grace = 30 * time.Second
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
}

// MinExecutorSecretLength is the shortest executor signing secret, in bytes. Whoever has the
// secret can forge dispatches that an executor runs, and a captured signed dispatch lets its
// holder test guesses offline at any rate: only a secret as long as an API token
// (api.MinTokenLength) makes that hopeless.
const MinExecutorSecretLength = api.MinTokenLength

// placeholder marks the example values of deploy/sluice.env.example and the README, compared
// in lower case: a copied example, however long, is known to everyone who read it.
const placeholder = "change-me"

// isPlaceholder reports whether a secret is still an example value.
func isPlaceholder(secret string) bool {
	return strings.Contains(strings.ToLower(secret), placeholder)
}

// placeholderErr is the refusal of setting still holding an example value; it never shows the value.
func placeholderErr(setting string) error {
	return fmt.Errorf("invalid config: %s: still the %q placeholder of the example settings (generate one with `openssl rand -hex 32`)",
		setting, placeholder)
}

// connLimits resolves the listener's bounds: defaults for unset ones, none for negative ones.
func (opts *Options) connLimits(refused *prometheus.CounterVec) connLimits {
	lim := connLimits{max: cmp.Or(opts.MaxConns, DefaultMaxConns),
		perSource: cmp.Or(opts.MaxConnsPerSource, DefaultMaxConnsPerSource),
		reserved:  opts.ReservedConns, exempt: opts.ExecutorSources, refused: refused}
	if lim.reserved == 0 {
		// An eighth of a smaller bound, so that a MaxConns set below the default reserve
		// still leaves the other sources most of it.
		lim.reserved = min(DefaultReservedConns, lim.max/8)
	}
	if lim.exempt == nil {
		lim.exempt = DefaultExecutorSources()
	}
	return lim
}

// DefaultExecutorSources are Options.ExecutorSources' default: loopback, where `sluice dev`'s
// simulated executor and an executor beside sluice on one host call from.
func DefaultExecutorSources() []netip.Prefix {
	return []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
}

// check refuses options a process cannot start with, naming the setting.
func (opts *Options) check() error {
	switch {
	case opts.ReservedConns > 0 && opts.MaxConns >= 0 && opts.ReservedConns >= cmp.Or(opts.MaxConns, DefaultMaxConns):
		return errors.New("invalid config: reserved connections (SLUICE_RESERVED_CONNS): must be below the connection bound (SLUICE_MAX_CONNS)")
	case opts.MySQLDSN == "":
		return errors.New("invalid config: MySQL DSN: required")
	case opts.NATSURL == "":
		return errors.New("invalid config: NATS URL: required")
	case opts.Drainer && opts.ExecutorURL == "":
		return errors.New("invalid config: executor URL (SLUICE_EXECUTOR_URL): required to run the drainer")
	case opts.ExecutorURL != "" && opts.ExecutorSecret == "":
		return errors.New("invalid config: executor secret (SLUICE_EXECUTOR_SECRET): required with an executor URL")
	case opts.ExecutorURL != "" && len(opts.ExecutorSecret) < MinExecutorSecretLength:
		return fmt.Errorf("invalid config: executor secret (SLUICE_EXECUTOR_SECRET): at least %d bytes, got %d (generate one with `openssl rand -hex 32`)",
			MinExecutorSecretLength, len(opts.ExecutorSecret))
	case opts.ExecutorURL != "" && isPlaceholder(opts.ExecutorSecret):
		return placeholderErr("executor secret (SLUICE_EXECUTOR_SECRET)")
	case isPlaceholder(opts.MetricsToken):
		// The example settings ship this one uncommented: a copied file must not leave /metrics
		// behind a token everyone who read the example knows.
		return placeholderErr("metrics token (SLUICE_METRICS_TOKEN)")
	case opts.API && opts.Tokens == nil:
		return errors.New("invalid config: tokens (SLUICE_TOKENS or SLUICE_TOKENS_FILE): required to run the API")
	case opts.TLSCertFile != "" && opts.TLSKeyFile == "":
		return errors.New("invalid config: TLS key (SLUICE_TLS_KEY): required with a TLS certificate (SLUICE_TLS_CERT)")
	case opts.TLSKeyFile != "" && opts.TLSCertFile == "":
		return errors.New("invalid config: TLS certificate (SLUICE_TLS_CERT): required with a TLS key (SLUICE_TLS_KEY)")
	}
	return nil
}

// connect opens the database (whose schema must be current), the runtime config and NATS, and
// prepares the JetStream stream when asked to; it returns the JetStream client (nil in core NATS
// mode).
func (a *App) connect(ctx context.Context) (jetstream.JetStream, error) {
	opts := a.opts
	var err error
	if a.db, err = store.Open(ctx, opts.MySQLDSN); err != nil {
		return nil, err
	}
	if opts.API || opts.Drainer {
		if a.txDB, err = store.OpenMulti(ctx, opts.MySQLDSN); err != nil {
			return nil, err
		}
	}
	current, err := migrations.Current(ctx, a.db)
	if err != nil || !current {
		return nil, fmt.Errorf("the database schema is not current (run `sluice migrate up`): %v", err)
	}
	a.clock = clock.NewDBSynced(a.db)
	a.limits = config.NewCache(a.db, a.log)
	if err := a.limits.Reload(ctx); err != nil {
		return nil, err
	}
	name := "sluice"
	if opts.DrainerID != "" {
		name += " " + opts.DrainerID
	}
	auth, err := opts.NATSAuth.Options()
	if err != nil {
		return nil, err
	}
	if a.nc, err = nats.Connect(opts.NATSURL, append(a.natsOptions(name), auth...)...); err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", RedactURL(opts.NATSURL), RedactError(err, opts.NATSURL))
	}
	var js jetstream.JetStream
	if !opts.CoreNATS {
		if js, err = jetstream.New(a.nc, jetstream.WithPublishAsyncMaxPending(8192)); err != nil {
			return nil, fmt.Errorf("JetStream: %w", err)
		}
		if opts.InitStream {
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, change, err := publisher.PrepareStream(sctx, js, publisher.StreamConfig{Prefix: opts.Prefix})
			cancel()
			switch {
			case err != nil:
				// The broker may be down; sluice works without it (pokes are hints).
				a.log.Warn("the JetStream stream is not ready; continuing", "error", err)
			case change == publisher.StreamCreated:
				a.log.Info("created the JetStream stream with default settings (see `sluice nats init`)")
			case change == publisher.WindowRaised:
				a.log.Warn("raised the JetStream stream's duplicate window to the minimum", "window", publisher.MinDuplicateWindow.String())
			}
		}
	}
	return js, nil
}

// startRelay builds the relay role: the relay, and the purgers of published outbox rows and of
// finished jobs.
func (a *App) startRelay(js jetstream.JetStream, installID string, relayMetrics *publisher.RelayMetrics) error {
	var err error
	if a.relay, err = publisher.NewRelay(publisher.RelayConfig{DB: a.db, NC: a.nc, JS: js, InstallID: installID,
		Log: a.log, Metrics: relayMetrics, Clock: a.clock}); err != nil {
		return err
	}
	if a.purger, err = publisher.NewPurger(publisher.PurgerConfig{DB: a.db, Log: a.log, Retention: func() time.Duration {
		return a.limits.Current().Config.OutboxRetention()
	}}); err != nil {
		return err
	}
	// Finished jobs are purged by the same housekeeping role: one relay process per
	// installation at least, whatever runs the drainers.
	if a.jobPurger, err = publisher.NewPurger(publisher.PurgerConfig{DB: a.db, Log: a.log, Rows: "finished jobs",
		Purge: func(ctx context.Context, db *sql.DB, cutoff time.Time, limit int) (int64, error) {
			return store.PurgeSettled(ctx, db, cutoff, limit)
		},
		Retention: func() time.Duration {
			return a.limits.Current().Config.Retention()
		}}); err != nil {
		return err
	}
	if a.auditPurger, err = publisher.NewPurger(publisher.PurgerConfig{DB: a.db, Log: a.log, Rows: "audit events",
		Purge: func(ctx context.Context, db *sql.DB, cutoff time.Time, limit int) (int64, error) {
			return store.PurgeAudit(ctx, db, cutoff, limit)
		},
		Retention: func() time.Duration {
			return a.limits.Current().Config.AuditRetention()
		}}); err != nil {
		return err
	}

	return nil
}

// endedHook is the drainer's Ended in a process that also serves the API (wakeWaiters), else
// none: a drainer alone has nobody to tell.
func (a *App) endedHook() func([]int64) {
	if !a.opts.API {
		return nil
	}
	return a.wakeWaiters
}

// wakeWaiters wakes the API's requests waiting on jobs the drainer of this process ended: at
// once, where the jobs' release pokes reach them only after the relay's next pass. Waiters in
// other processes hear the pokes. The hub is set (startAPI) before the loops start.
func (a *App) wakeWaiters(ids []int64) { a.waiters.Wake(ids...) }

// startDrainer builds the drainer role and subscribes it to the pokes.
func (a *App) startDrainer() error {
	opts := a.opts
	var err error
	if executor.PlainHTTPToRemote(opts.ExecutorURL) {
		a.log.Warn("the executor URL is plain http:// to a host that is not loopback: signed payloads and nonces cross the network unencrypted; use https://",
			"executor_url", RedactURL(opts.ExecutorURL))
	}
	sender := executor.NewClient(opts.ExecutorURL, []byte(opts.ExecutorSecret))
	sender.Audience = opts.ExecutorID
	metrics := drainer.NewMetrics(a.registry)
	if a.drainer, err = drainer.New(drainer.Config{DB: a.db, TxDB: a.txDB, Executor: sender, ID: opts.DrainerID, RateGates: a.drainerGates(),
		Prefix: opts.Prefix, UnconfirmedStarts: opts.UnconfirmedStarts, PollInterval: opts.PollInterval,
		Log: a.log, Metrics: metrics, JobMetrics: a.jobs, BuildVersion: opts.Version, Clock: a.clock,
		Ended: a.endedHook()}); err != nil {
		return err
	}
	// Pokes are hints: a queue group spreads them over the drainers, and each one only wakes a
	// pass, which coalesces with any pass already pending.
	if _, err := a.nc.QueueSubscribe(opts.Prefix+".>", "sluice-drainers", func(*nats.Msg) {
		metrics.Pokes.Inc()
		a.drainer.Poke()
	}); err != nil {
		return fmt.Errorf("subscribe to pokes: %w", err)
	}

	return nil
}

// runLoops starts the background loops of the roles this process runs; Stop ends them.
func (a *App) runLoops() {
	loopCtx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	a.goLoop(func() { a.limits.Run(loopCtx) })
	if a.tls != nil {
		a.goLoop(func() { a.tls.run(loopCtx, tlsCheckInterval) })
	}
	if a.relay != nil {
		a.goLoop(func() { a.relay.Run(loopCtx) })
		a.goLoop(func() { a.purger.Run(loopCtx) })
		a.goLoop(func() { a.jobPurger.Run(loopCtx) })
		a.goLoop(func() { a.auditPurger.Run(loopCtx) })
	}
	if a.audit != nil {
		a.goLoop(func() { a.audit.Run(loopCtx) })
	}
	if a.fast != nil {
		a.goLoop(func() { a.fast.Run(loopCtx) })
	}
	if a.waiters != nil {
		a.goLoop(func() { a.waiters.Run(loopCtx) })
	}
	if a.drainer != nil {
		a.startClaiming()
	}
}

func (a *App) goLoop(f func()) {
	a.loops.Add(1)
	go func() {
		defer a.loops.Done()
		f()
	}()
}

func (a *App) startAPI(ctx context.Context) error {
	adm, err := a.newAdmitter()
	if err != nil {
		return err
	}
	hub, err := a.newWaiters()
	if err != nil {
		return err
	}
	srv, err := api.New(api.Config{DB: a.db, Waiters: hub, Admitter: adm, Limits: a.limits, Tokens: a.opts.Tokens,
		Gatherer: a.registry, MetricsToken: a.opts.MetricsToken, MetricsElsewhere: a.MetricsAddr(), Log: a.log, Ready: a.ready, RateGates: a.gates, Status: a.ops.status, Components: a.components,
		Clock: a.clock, MaxRequests: a.opts.MaxRequests, CORSOrigins: a.opts.CORSOrigins, MemoryBudget: a.opts.MemoryBudget,
		Simulate: Simulator(a.db)})
	if err != nil {
		return err
	}
	a.waiters = hub
	a.registerAPIGauges(srv, hub)
	return a.serve(ctx, srv)
}

// newAdmitter builds the process's admission, and its audit queue of refusals.
func (a *App) newAdmitter() (*gate.Admitter, error) {
	// The admission rate limit and the gate lookup of queue=false share memcached with the gate
	// store; both fail open, so a missing memcached costs precision, never admissions.
	var limiter gate.RateLimiter
	if len(a.opts.Memcached) > 0 {
		l, err := admitrate.New(admitrate.Config{Servers: a.opts.Memcached})
		if err != nil {
			return nil, err
		}
		limiter = l
	}
	var lookup gate.RateGateLookup
	if a.gates != nil {
		lookup = a.gates
	}
	failOpen, err := gate.NewFailOpenMetrics(a.registry)
	if err != nil {
		return nil, err
	}
	published := a.fast.Submit
	if a.drainer != nil {
		// A drainer in this process hears of the job at once rather than a broker hop later.
		// The poke still goes out, for drainers elsewhere, but once this drainer's claim is
		// done: published at once, it took the cores from that claim (drainer.PokeThen).
		published = func(rows []outbox.Row) {
			a.drainer.PokeThen(func() { a.fast.Submit(rows) })
		}
	}
	if a.audit, err = store.NewAuditQueue(store.AuditQueueConfig{DB: a.db, Registerer: a.registry, Log: a.log}); err != nil {
		return nil, err
	}
	return gate.New(gate.Config{DB: a.db, TxDB: a.txDB, Limits: a.limits, Prefix: a.opts.Prefix, Log: a.log,
		Published: published, Metrics: gate.NewMetrics(a.registry), JobMetrics: a.jobs, RateLimiter: limiter, RateGates: lookup,
		FailOpenMetrics: failOpen, Audit: a.audit})
}

// newWaiters builds the hub of requests waiting on a job (?wait=, follow=1). It subscribes to
// the release pokes only while requests wait: not a queue group, since every process must hear
// every job's end, but nothing for a process nobody waits on, which would otherwise take one
// message per job and slow the drain.
func (a *App) newWaiters() (*waiters.Hub, error) {
	var hub *waiters.Hub
	hub, err := api.NewWaiters(a.db, waiters.Config{Interval: a.opts.WaitBackstop, Log: a.log,
		Listen: func() (func(), error) {
			sub, err := a.nc.Subscribe(a.opts.Prefix+"."+string(outbox.Release)+".>", func(m *nats.Msg) {
				if id := outbox.PokeJobID(m.Data); id > 0 {
					hub.Wake(id)
				}
			})
			if err != nil {
				return nil, fmt.Errorf("subscribe to release pokes: %w", err)
			}
			return func() { _ = sub.Unsubscribe() }, nil
		}})
	return hub, err
}

// registerAPIGauges registers the API's gauges of the memory budget and the waiting requests.
func (a *App) registerAPIGauges(srv *api.Server, hub *waiters.Hub) {
	budget := cmp.Or(a.opts.MemoryBudget, api.DefaultMemoryBudget)
	a.registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_request_memory_bytes",
			Help: "Bytes charged to the memory budget by API request bodies and pages of jobs in progress (SLUICE_MEMORY_BUDGET)."},
			func() float64 { return float64(srv.MemoryInUse()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_request_memory_budget_bytes",
			Help: "The memory budget of API request bodies and pages of jobs (SLUICE_MEMORY_BUDGET); negative: none."},
			func() float64 { return float64(budget) }))
	a.registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_job_waiters",
			Help: "API requests waiting now for a job to change (?wait=, the events stream with follow=1)."},
			func() float64 { return float64(hub.Len()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_job_waiter_wakes_total",
			Help: "Waiting requests woken, by what woke them: the job's end (its release poke, or this process's drainer), or the once-a-second backstop read.", ConstLabels: prometheus.Labels{"source": "poke"}},
			func() float64 { poke, _ := hub.Wakes(); return float64(poke) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_job_waiter_wakes_total",
			Help: "Waiting requests woken, by what woke them: the job's end (its release poke, or this process's drainer), or the once-a-second backstop read.", ConstLabels: prometheus.Labels{"source": "backstop"}},
			func() float64 { _, backstop := hub.Wakes(); return float64(backstop) }))
}

// serve listens on the listen address and serves h until Stop.
func (a *App) serve(ctx context.Context, h http.Handler) error {
	if a.listener = a.opts.Listener; a.listener == nil {
		var lc net.ListenConfig
		var err error
		if a.listener, err = lc.Listen(ctx, "tcp", a.opts.Listen); err != nil {
			return fmt.Errorf("listen on %s: %w", a.opts.Listen, err)
		}
	}
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_connections_refused_total",
		Help: "Connections closed as soon as accepted: reason source (past SLUICE_MAX_CONNS_PER_SOURCE) or reserved (the other sources' share of SLUICE_MAX_CONNS, past SLUICE_RESERVED_CONNS, is full)."},
		[]string{"reason"})
	if err := a.registry.Register(refused); err != nil {
		return fmt.Errorf("register connection metrics: %w", err)
	}
	a.listener = newConnLimiter(a.listener, a.opts.connLimits(refused))
	a.httpSrv = newHTTPServer(h)
	if a.tls != nil {
		a.httpSrv.useTLS(a.tls, a.log)
	}
	a.serveWG.Add(1)
	go func() {
		defer a.serveWG.Done()
		if err := a.httpSrv.serveOn(a.listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("API server stopped", "error", err)
		}
	}()
	return nil
}

// startMetricsServer serves /metrics, and nothing else, on Options.MetricsListen: a deployment
// that scrapes from another network than its producers call from keeps the two apart.
func (a *App) startMetricsServer(ctx context.Context) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", a.opts.MetricsListen)
	if err != nil {
		return fmt.Errorf("listen on %s (SLUICE_METRICS_LISTEN): %w", a.opts.MetricsListen, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", api.MetricsHandler(a.registry, a.opts.MetricsToken))
	a.metricsLn, a.metricsSrv = ln, newHTTPServer(mux)
	if a.tls != nil {
		a.metricsSrv.useTLS(a.tls, a.log)
	}
	a.serveWG.Add(1)
	go func() {
		defer a.serveWG.Done()
		if err := a.metricsSrv.serveOn(newLimitListener(ln, 64)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("metrics server stopped", "error", err)
		}
	}()
	return nil
}

// ReloadTLS reads the certificate files again (on SIGHUP) and serves their pair from the next
// handshake on, logging the outcome. A pair that cannot be used is returned as the error and
// the previous certificate stays. Without TLS it does nothing. Safe for concurrent use.
func (a *App) ReloadTLS() error {
	if a.tls == nil {
		return nil
	}
	return a.tls.reloadAndLog("SIGHUP")
}

// MetricsAddr returns the address of the metrics listener (Options.MetricsListen), or "".
func (a *App) MetricsAddr() string {
	if a.metricsLn == nil {
		return ""
	}
	return a.metricsLn.Addr().String()
}

// ready is /readyz: the database reachable and its schema current, and the process not
// stopping (so a load balancer stops sending it work while it drains). Its errors are
// *api.NotReadyError: /readyz shows only their reason word and logs the rest. Stopping shows at
// once; the database's answer comes from a.ops.ready, at most a second old.
func (a *App) ready(ctx context.Context) error {
	if a.ops.stopping.Load() {
		return api.NotReady(api.ReadyReasonStopping, errors.New("shutting down"))
	}
	return a.ops.ready.Read(ctx)
}

// schemaReady is ready's database check: one round trip, at most 2 s.
func (a *App) schemaReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	current, err := migrations.Current(ctx, a.db)
	if err != nil {
		return api.NotReady(api.ReadyReasonDatabase, fmt.Errorf("database: %w", err))
	}
	if !current {
		return api.NotReady(api.ReadyReasonMigrations, errors.New("database schema is not current"))
	}
	return nil
}

// Addr returns the listening address: the API's, or the metrics and health endpoints' of a
// process without the API role.
func (a *App) Addr() string {
	if a.listener == nil {
		return ""
	}
	return a.listener.Addr().String()
}

// DB returns the process's database pool, on which a statement cannot stack a second (every
// statement but admissions' and the drainer's transactions runs on it).
func (a *App) DB() *sql.DB { return a.db }

// Registry returns the process's metrics registry.
func (a *App) Registry() *prometheus.Registry { return a.registry }

// JobMetrics returns the process's job-lifecycle collectors, nil in a process with neither the
// API nor the drainer role. A drainer run beside the App (as tests do) shares them through
// drainer.Config.JobMetrics, as the App's own drainer does.
func (a *App) JobMetrics() *store.Metrics { return a.jobs }

// Stop shuts down in this order, and returns when it is done:
//
//  1. stop claiming at once (the drainer's loop ends after the pass in progress) and answer
//     /readyz with 503, so a load balancer stops sending work;
//  2. let in-flight dispatches finish up to the grace period, while the API still serves the
//     executors' /start and /complete calls; past the grace, the rest are recorded as unknown
//     outcomes (requeued if never started, else lost) and the drainer records its clean stop;
//  3. stop accepting API requests and finish those in progress (at most 10 s);
//  4. stop the relay, fast path and config reloads: outbox rows written meanwhile wait for the
//     next relay, the outbox being durable;
//  5. drain the NATS connection (flush what is pending, unsubscribe) and close the database;
//  6. with Options.Log unset, write the queued log lines, at most 2 s (SPEC §10).
//
// Nothing is lost if the process is killed instead at any point: leases and the outbox cover
// it. Idempotent.
func (a *App) Stop(ctx context.Context) error {
	var err error
	a.stopped.Do(func() {
		a.stopClaiming(ctx)
		if a.waiters != nil {
			a.waiters.Stop()
		}
		for _, srv := range []*httpServer{a.httpSrv, a.metricsSrv} {
			if srv != nil {
				sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err = errors.Join(err, srv.Shutdown(sctx))
				cancel()
			}
		}
		a.serveWG.Wait()
		a.cancel()
		a.loops.Wait()
		a.closeConns()
		a.log.Info("sluice stopped")
		if a.ownLog != nil {
			_ = a.ownLog.Close(ctx)
		}
	})
	return err
}

func (a *App) closeConns() {
	if a.nc != nil {
		a.drainNATS()
		a.nc.Close()
	}
	for _, db := range []*sql.DB{a.db, a.txDB} {
		if db != nil {
			_ = db.Close()
		}
	}
}
