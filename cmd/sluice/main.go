// The runtime would re-read the cgroup CPU limit every second to adjust GOMAXPROCS. An idle
// drainer's whole budget is 1 ms of CPU a second (SPEC §14), and the limit read at start is
// the one that counts for a service restarted by its unit.
//go:debug updatemaxprocs=0

// Command sluice is the one sluice binary: the API, relay and drainer (serve), the all-in-one
// developer process (dev), schema migrations, stream set-up and the simulated executor. It only
// parses settings and wires the packages; see cmd/sluice/app for the wiring.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/cmd/sluice/app"
	"github.com/sluicehq/sluice/drainer/executor/simexec"
	"github.com/sluicehq/sluice/gate/api"
	"github.com/sluicehq/sluice/gate/logq"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/publisher"
	"github.com/sluicehq/sluice/publisher/devbroker"
)

// version is set at link time (-ldflags "-X main.version=...").
var version = "dev"

const usage = `sluice — a durable, fair admission queue

Usage:
  sluice serve [--api] [--relay] [--drainer] [flags]   run the API, relay and drainer (all by default)
  sluice dev [flags]                                   everything in one process with a simulated executor
                                                       (and a NATS server of its own if SLUICE_NATS_URL is unset)
  sluice migrate [up|status] [flags]                   apply or list schema migrations
  sluice jobs list|show|cancel|events [flags]          list, read or cancel jobs, or read a job's audit trail
  sluice audit [--tenant T] [--event E] [--since TIME] audit events, newest first, a page at a time (admin token)
  sluice slots list [--tenant T] | release ID          live slots, newest first; release one (admin token)
  sluice nats init [flags]                             create or update the JetStream stream
  sluice outbox status|replay|restore [flags]          outbox backlog, replay published rows, restore set-aside rows
  sluice simexec [flags]                               run the simulated executor alone
  sluice gate set|list|clear [flags]                   set, list or clear rate gates
  sluice version                                       print the version
  sluice status [--json] [flags]                       queue, tenants, gates, drainers, outbox (admin token)
  sluice tenants [--order name|depth] [--cursor C]     every tenant with work, a page at a time (admin token)
  sluice config show|set key=value... --note TEXT|history   runtime config (admin token)
  sluice config history [--limit N] [--cursor C]       its changes, newest first, a page at a time (admin token)
  sluice simulate --since T [--until T] --set key=value...   replay what arrived under a config change (database)
  sluice simulate --arrivals FILE [--current defaults] --set key=value...   the same for arrivals in a file

Settings come from flags, SLUICE_* environment variables or a --config file, in that order
(an empty variable or file value counts as unset).
Run 'sluice serve -h' to list them.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd, rest := args[0], args[1:]; cmd {
	case "serve":
		err = serve(ctx, rest, stdout, stderr, false)
	case "dev":
		err = serve(ctx, rest, stdout, stderr, true)
	case "migrate":
		err = migrate(ctx, rest, stdout, stderr)
	case "jobs":
		err = jobsCmd(ctx, rest, stdout, stderr)
	case "audit":
		err = auditCmd(ctx, rest, stdout, stderr)
	case "slots":
		err = slotsCmd(ctx, rest, stdout, stderr)
	case "nats":
		err = natsCmd(ctx, rest, stdout, stderr)
	case "outbox":
		err = outboxCmd(ctx, rest, stdout, stderr)
	case "simexec":
		err = simexecCmd(ctx, rest, stdout, stderr)
	case "gate":
		err = gateCmd(ctx, rest, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "sluice", version)
	case "status":
		err = statusCmd(ctx, rest, stdout, stderr)
	case "tenants":
		err = tenantsCmd(ctx, rest, stdout, stderr)
	case "config":
		err = configCmd(ctx, rest, stdout, stderr)
	case "simulate":
		err = simulateCmd(ctx, rest, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "sluice: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "sluice:", err)
		return 1
	}
	return 0
}

// newLogger returns a long-running process's logger: JSON lines on w at level, through a logq
// queue and its writer goroutine, so that a sink that stops reading drops lines rather than
// blocking admissions and claims (SPEC §10). The caller closes the queue with closeLog once
// everything else has stopped.
func newLogger(w io.Writer, level string) (*slog.Logger, *logq.Queue, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, nil, fmt.Errorf("log level: want debug, info, warn or error, got %q", level)
	}
	q, err := logq.New(logq.Config{Sink: w, Options: &slog.HandlerOptions{Level: l}})
	if err != nil {
		return nil, nil, err
	}
	return slog.New(q.Handler()), q, nil
}

// closeLog writes the log lines still queued, waiting at most logq's 2 s bound (SPEC §10). If
// the sink is stuck the lines are lost, and nothing is said about it: the only place to say it
// is the sink.
func closeLog(q *logq.Queue) { _ = q.Close(context.Background()) }

// loadTokens returns the API tokens of SLUICE_TOKENS, or of the file SLUICE_TOKENS_FILE names:
// nil when neither is set (the API then refuses to start, except under `sluice dev`, which adds
// its own). `sluice dev` passes withDev and gets the dev admin token added (see withDevToken).
func loadTokens(c *config, withDev bool) (*api.Tokens, error) {
	raw := c.get("tokens")
	if f := c.get("tokens-file"); raw == "" && f != "" {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("tokens file: %w", err)
		}
		raw = string(data)
	}
	var list []api.Token
	if raw != "" {
		var err error
		if list, err = api.DecodeTokens([]byte(raw)); err != nil {
			return nil, err
		}
	} else if !withDev {
		return nil, nil
	}
	if withDev {
		var err error
		if list, err = withDevToken(list); err != nil {
			return nil, err
		}
	}
	return api.NewTokens(list)
}

// devToken is the admin token `sluice dev` always accepts (SPEC §9): its banner names it, and its
// simulated executor calls /start and /complete with it.
var devToken = api.Token{Name: "dev", Token: "dev", Role: api.Admin, Builtin: true}

// withDevToken returns list with the dev admin token added, so that configured tokens (a
// producer's, to try them out) work next to it rather than instead of it. A configured admin
// token whose value is `dev` already stands for it. Any other use of the name or the value is
// refused: the value with another role would make the built-in executor's calls fail, and a
// second caller named dev would be indistinguishable from it in logs and config history.
func withDevToken(list []api.Token) ([]api.Token, error) {
	have := false
	list = slices.Clone(list) // the caller's list is left as it was
	for i, t := range list {
		switch {
		case t.Token == devToken.Token && t.Role == api.Admin:
			// It stands for the dev token, which alone may be shorter than api.MinTokenLength.
			list[i].Builtin = true
			have = true
		case t.Token == devToken.Token || t.Name == devToken.Name:
			return nil, fmt.Errorf("tokens: the configured token %q (role %q) uses the name or token %q, which `sluice dev` keeps for its own admin token: rename it, or use `sluice serve`",
				t.Name, t.Role, devToken.Token)
		}
	}
	if have {
		return list, nil
	}
	return append(list, devToken), nil
}

func serve(ctx context.Context, args []string, stdout, stderr io.Writer, dev bool) error {
	name := "serve"
	if dev {
		name = "dev"
	}
	fs := flag.NewFlagSet("sluice "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	roleAPI := fs.Bool("api", false, "run the API")
	roleRelay := fs.Bool("relay", false, "run the relay")
	roleDrainer := fs.Bool("drainer", false, "run the drainer")
	c, err := parseSettings(fs, args)
	if err != nil {
		return err
	}
	log, logQueue, err := newLogger(stderr, c.get("log-level"))
	if err != nil {
		return err
	}
	// Deferred first, so run last: after the App and the dev extras have stopped and logged.
	defer closeLog(logQueue)
	useDriverLog(log)
	if !dev && *roleDrainer && !*roleAPI && !*roleRelay {
		oneProcForDrainer(log, os.Getenv("GOMAXPROCS"))
	}
	confirm, err := c.bool("executor-confirm-start")
	if err != nil {
		return err
	}
	core, err := c.bool("nats-core")
	if err != nil {
		return err
	}
	tenantLabels, err := c.bool("metrics-tenant-labels")
	if err != nil {
		return err
	}
	grace, err := time.ParseDuration(c.get("grace"))
	if err != nil {
		return fmt.Errorf("grace: %w", err)
	}
	tokens, err := loadTokens(c, dev)
	if err != nil {
		return err
	}
	opts := app.Options{
		MySQLDSN: c.get("mysql-dsn"), NATSURL: c.get("nats-url"), NATSAuth: c.natsAuth(), CoreNATS: core, Listen: c.get("listen"),
		MetricsListen: c.get("metrics-listen"), MetricsToken: c.get("metrics-token"), NoTenantLabels: !tenantLabels,
		ExecutorURL: c.get("executor-url"), ExecutorSecret: c.get("executor-secret"), ExecutorID: c.get("executor-id"),
		UnconfirmedStarts: !confirm, Tokens: tokens, DrainerID: c.get("drainer-id"), Prefix: c.get("subject-prefix"),
		API: *roleAPI, Relay: *roleRelay, Drainer: *roleDrainer, InitStream: true, Grace: grace,
		Version: version, Log: log, LogDropped: logQueue.Dropped, Memcached: splitList(c.get("memcached")),
		CORSOrigins: splitList(c.get("cors-origins")),
	}
	// Transport security: the database over TLS when its files are set, HTTPS on the
	// listeners.
	if opts.MySQLDSN, err = c.mysqlDSN(); err != nil {
		return err
	}
	opts.TLSCertFile, opts.TLSKeyFile = c.get("tls-cert"), c.get("tls-key")
	if dev && (opts.TLSCertFile != "" || opts.TLSKeyFile != "") {
		return errDevTLS
	}
	// SIGHUP reads the certificate files again (they are polled too). It is caught only with
	// TLS configured: otherwise a hangup ends the process (Go's default). Registered before
	// Start, so that no SIGHUP sent once the listener is up can kill the process.
	hup := make(chan os.Signal, 1)
	if opts.TLSCertFile != "" {
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
	}
	if err := c.boundsOptions(&opts); err != nil {
		return err
	}
	var shutdown []func()
	defer func() {
		for i := len(shutdown) - 1; i >= 0; i-- {
			shutdown[i]()
		}
	}()
	var extras devExtras
	if dev {
		if err := devLoopbackOnly(c); err != nil {
			return err
		}
		if extras, err = devSetup(ctx, c, &opts, stdout, &shutdown); err != nil {
			return err
		}
	}
	if opts.NATSURL == "" {
		opts.NATSURL = nats.DefaultURL
	}
	a, err := app.Start(ctx, opts)
	if err != nil {
		return err
	}
	if dev {
		fmt.Fprintf(stdout, "sluice dev is running\n  API:        http://%s   (token: %s)\n  console:    http://%s/ui/\n  executor:   %s\n",
			a.Addr(), devToken.Token, a.Addr(), app.RedactURL(opts.ExecutorURL))
		if extras.statsURL != "" {
			fmt.Fprintf(stdout, "  stats:      %s\n", extras.statsURL)
		}
		broker := app.RedactURL(opts.NATSURL)
		if extras.embeddedNATS {
			broker += "   (embedded: SLUICE_NATS_URL is unset)"
		}
		fmt.Fprintf(stdout, "  NATS:       %s\nPress Ctrl-C to stop.\n", broker)
	}
	for running := true; running; {
		select {
		case <-hup:
			_ = a.ReloadTLS() // logged there; a pair that cannot be used leaves the previous one
		case <-ctx.Done():
			running = false
		}
	}
	log.Info("stopping: no new claims; waiting for in-flight dispatches", "grace", grace.String())
	// A second signal exits at once; leases and the outbox make that safe.
	again := make(chan os.Signal, 1)
	signal.Notify(again, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-again
		log.Warn("second signal: exiting now")
		closeLog(logQueue) // os.Exit skips the deferred one
		os.Exit(1)
	}()
	return a.Stop(context.Background())
}

// oneProcForDrainer runs a drainer-only process's Go code on one thread unless GOMAXPROCS is set
// in the environment. A drainer waits on MariaDB and the executor: its own CPU work a job is
// small enough that one P carries more than the 5,000 jobs/s of SPEC §14. With more Ps the
// runtime hands each statement's helper goroutines (database/sql's and the driver's cancel
// watchers) to other threads, which costs an idle drainer wake-ups, and a busy one takes CPU from
// a MariaDB on the same host, so that on a small machine a drainer drains faster on one P.
func oneProcForDrainer(log *slog.Logger, env string) {
	if env != "" {
		return
	}
	runtime.GOMAXPROCS(1)
	log.Info("drainer-only process: Go code runs on one thread (set GOMAXPROCS to change it)")
}

// devLoopbackOnly refuses an API or metrics listen address of `sluice dev` that is not loopback.
// dev accepts its built-in admin token `dev`, which everyone knows: on any other address, anyone
// who can reach the host could read every tenant's jobs and change the runtime config.
func devLoopbackOnly(c *config) error {
	for _, l := range []struct{ flag, env string }{{"listen", "SLUICE_LISTEN"}, {"metrics-listen", "SLUICE_METRICS_LISTEN"}} {
		addr := c.get(l.flag)
		if addr == "" && l.flag == "metrics-listen" {
			continue // metrics on the API listener
		}
		if !loopbackAddr(addr) {
			return fmt.Errorf("sluice dev: %s (--%s) %q is not a loopback address: dev accepts its built-in admin token `dev`, "+
				"which would let anyone who reaches that address act as admin; listen on 127.0.0.1, [::1] or localhost, "+
				"or run `sluice serve` with tokens of your own", l.env, l.flag, addr)
		}
	}
	return nil
}

// loopbackAddr reports whether the host of the listen address addr is loopback: 127.0.0.0/8,
// ::1 or localhost. An empty host means every interface.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// devExtras is what devSetup started, for the banner.
type devExtras struct {
	statsURL     string // the simulated executor's stats, "" with the user's own executor
	embeddedNATS bool
}

// devSetup fills in what `sluice dev` provides: migrations applied, an embedded NATS server
// unless a NATS URL is configured, and, unless an executor URL is configured, the simulated
// executor. The dev admin token is added by loadTokens.
func devSetup(ctx context.Context, c *config, opts *app.Options, stdout io.Writer, shutdown *[]func()) (devExtras, error) {
	var x devExtras
	if opts.NATSURL == "" {
		b, err := devbroker.Start()
		if err != nil {
			return x, err
		}
		*shutdown = append(*shutdown, b.Stop)
		opts.NATSURL, x.embeddedNATS = b.URL(), true
	}
	dsn, err := migrations.DSN(opts.MySQLDSN)
	if err != nil {
		return x, err
	}
	db, err := store.Open(ctx, dsn)
	if err != nil {
		return x, err
	}
	applied, err := migrations.Up(ctx, db, nil)
	db.Close()
	if err != nil {
		return x, err
	}
	for _, m := range applied {
		fmt.Fprintf(stdout, "applied migration %s\n", m.Name)
	}
	if opts.ExecutorURL != "" {
		return x, nil
	}
	if opts.ExecutorSecret == "" {
		// The built-in executor is the only one that has to know it, in this process: a fresh
		// random secret each run is as long as serve requires and guessable by no one.
		key := make([]byte, app.MinExecutorSecretLength)
		_, _ = rand.Read(key) // never fails (crypto/rand)
		opts.ExecutorSecret = hex.EncodeToString(key)
	}
	// The executor calls the API back, so it needs the API's real address (an OS-chosen port
	// with --listen 127.0.0.1:0) before the first dispatch, and the drainer may dispatch a job
	// an earlier run left queued as soon as app.Start begins claiming, before Start returns.
	// Binding the API's listener here gives the address first; app.Start serves on it.
	listen := opts.Listen
	if listen == "" {
		listen = app.DefaultListen
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", listen)
	if err != nil {
		return x, fmt.Errorf("listen on %s: %w", listen, err)
	}
	// The API URL is given even when starts are not confirmed: async jobs report through
	// /complete either way, and UnconfirmedStarts skips only /start.
	ex := simexec.New(simexec.Config{APIURL: "http://" + l.Addr().String(), Token: devToken.Token,
		UnconfirmedStarts: opts.UnconfirmedStarts, Secret: []byte(opts.ExecutorSecret), Audience: opts.ExecutorID, Log: opts.Log})
	stop, addr, err := serveHTTP(ctx, c.get("simexec-listen"), ex.Handler())
	if err != nil {
		l.Close()
		ex.Close()
		return x, err
	}
	*shutdown = append(*shutdown, func() { stop(); ex.Close() })
	opts.Listener = l
	opts.ExecutorURL = "http://" + addr + "/dispatch"
	x.statsURL = "http://" + addr + "/stats"
	return x, nil
}

func serveHTTP(ctx context.Context, addr string, h http.Handler) (func(), string, error) {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-done
	}, l.Addr().String(), nil
}

func migrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub := "up"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("sluice migrate "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	c, err := parseSettings(fs, args)
	if err != nil {
		return err
	}
	dsn, err := c.mysqlDSN()
	if err != nil {
		return err
	}
	if dsn, err = migrations.DSN(dsn); err != nil {
		return err
	}
	db, err := store.Open(ctx, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	switch sub {
	case "up":
		applied, err := migrations.Up(ctx, db, func(m migrations.Migration) {
			fmt.Fprintf(stdout, "applying %s ...\n", m.Name)
		})
		if err != nil {
			return err
		}
		if len(applied) == 0 {
			fmt.Fprintln(stdout, "schema is current; nothing to apply")
		} else {
			fmt.Fprintf(stdout, "applied %d migration(s); schema version %d\n", len(applied), applied[len(applied)-1].Version)
		}
	case "status":
		list, err := migrations.List(ctx, db)
		if err != nil {
			return err
		}
		for _, m := range list {
			state := "pending"
			if m.AppliedAt != nil {
				state = "applied " + m.AppliedAt.Format(time.RFC3339)
			}
			fmt.Fprintf(stdout, "%04d  %-40s %s\n", m.Version, m.Name, state)
		}
	default:
		return fmt.Errorf("migrate: unknown subcommand %q (want up or status)", sub)
	}
	return nil
}

// natsInitWait bounds `sluice nats init`'s stream set-up (publisher.EnsureStream retries).
const natsInitWait = time.Minute

func natsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "init" {
		return errors.New("nats: want `sluice nats init`")
	}
	fs := flag.NewFlagSet("sluice nats init", flag.ContinueOnError)
	fs.SetOutput(stderr)
	replicas := fs.Int("replicas", 1, "stream replicas (3 in a durable cluster)")
	dupes := fs.Duration("duplicate-window", 2*time.Minute, "JetStream duplicate window (at least 2m)")
	c, err := parseSettings(fs, args[1:])
	if err != nil {
		return err
	}
	nc, err := c.connectNATS("sluice nats init")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("JetStream: %w", err)
	}
	// EnsureStream asks again while the cluster cannot place the stream (a node restarting), and
	// more replicas than nodes look the same to it: a minute, then the broker's last answer.
	sctx, cancel := context.WithTimeout(ctx, natsInitWait)
	defer cancel()
	s, err := publisher.EnsureStream(sctx, js, publisher.StreamConfig{Prefix: c.get("subject-prefix"), Replicas: *replicas, Duplicates: *dupes})
	if err != nil {
		return fmt.Errorf("%w (asked for %s; are %d replicas possible on this broker?)", err, natsInitWait, *replicas)
	}
	info := s.CachedInfo()
	fmt.Fprintf(stdout, "stream %s ready: subjects %v, duplicate window %s, replicas %d, storage %s\n",
		info.Config.Name, info.Config.Subjects, info.Config.Duplicates, info.Config.Replicas, info.Config.Storage)
	return nil
}

func simexecCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sluice simexec", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c, err := parseSettings(fs, args)
	if err != nil {
		return err
	}
	log, logQueue, err := newLogger(stderr, c.get("log-level"))
	if err != nil {
		return err
	}
	defer closeLog(logQueue)
	confirm, err := c.bool("executor-confirm-start")
	if err != nil {
		return err
	}
	// Without a token every /start would be refused (401) and every job fail, and an async job
	// could never report: better said once at start-up than in a log line per job. The token
	// is required with starts unconfirmed too, since any job may ask for async.
	apiURL, token := c.get("api-url"), c.get("executor-token")
	does := "confirms starts and reports async jobs"
	if !confirm {
		does = "reports async jobs"
	}
	switch {
	case apiURL == "":
		return fmt.Errorf("SLUICE_API_URL (--api-url) is required: the simulated executor %s through the API", does)
	case token == "":
		return fmt.Errorf("SLUICE_EXECUTOR_TOKEN (--executor-token) is required: the simulated executor %s through the API at %s with it (an executor or admin token)", does, apiURL)
	}
	cfg := simexec.Config{APIURL: apiURL, Token: token, UnconfirmedStarts: !confirm,
		Secret: []byte(c.get("executor-secret")), Audience: c.get("executor-id"), Log: log}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("SLUICE_API_URL (--api-url): %w", err)
	}
	ex := simexec.New(cfg)
	defer ex.Close()
	stop, addr, err := serveHTTP(ctx, c.get("simexec-listen"), ex.Handler())
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "simulated executor listening on http://%s (dispatch: POST /dispatch, stats: GET /stats)\n", addr)
	<-ctx.Done()
	stop()
	return nil
}
