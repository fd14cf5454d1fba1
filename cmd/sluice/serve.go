package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/cmd/sluice/app"
)

// serve runs `sluice serve` (the roles asked for, all by default) and, with dev, `sluice dev`
// (everything in one process, with what devSetup adds), until ctx is done; then it stops taking
// new work and waits for the dispatches in flight, up to the grace.
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
	opts, err := serveOptions(c, dev)
	if err != nil {
		return err
	}
	opts.API, opts.Relay, opts.Drainer = *roleAPI, *roleRelay, *roleDrainer
	opts.Log, opts.LogDropped = log, logQueue.Dropped
	// SIGHUP reads the certificate files again (they are polled too). It is caught only with
	// TLS configured: otherwise a hangup ends the process (Go's default). Registered before
	// Start, so that no SIGHUP sent once the listener is up can kill the process.
	hup := make(chan os.Signal, 1)
	if opts.TLSCertFile != "" {
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
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
		printDevBanner(stdout, a, opts, extras)
	}
	for running := true; running; {
		select {
		case <-hup:
			_ = a.ReloadTLS() // logged there; a pair that cannot be used leaves the previous one
		case <-ctx.Done():
			running = false
		}
	}
	log.Info("stopping: no new claims; waiting for in-flight dispatches", "grace", opts.Grace.String())
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

// serveOptions is what the settings c say for app.Start: everything but the roles and the log.
func serveOptions(c *settingValues, dev bool) (app.Options, error) {
	confirm, err := c.bool("executor-confirm-start")
	if err != nil {
		return app.Options{}, err
	}
	core, err := c.bool("nats-core")
	if err != nil {
		return app.Options{}, err
	}
	tenantLabels, err := c.bool("metrics-tenant-labels")
	if err != nil {
		return app.Options{}, err
	}
	grace, err := time.ParseDuration(c.get("grace"))
	if err != nil {
		return app.Options{}, fmt.Errorf("grace: %w", err)
	}
	tokens, err := loadTokens(c, dev)
	if err != nil {
		return app.Options{}, err
	}
	opts := app.Options{
		MySQLDSN: c.get("mysql-dsn"), NATSURL: c.get("nats-url"), NATSAuth: c.natsAuth(), CoreNATS: core, Listen: c.get("listen"),
		MetricsListen: c.get("metrics-listen"), MetricsToken: c.get("metrics-token"), NoTenantLabels: !tenantLabels,
		ExecutorURL: c.get("executor-url"), ExecutorSecret: c.get("executor-secret"), ExecutorID: c.get("executor-id"),
		UnconfirmedStarts: !confirm, Tokens: tokens, DrainerID: c.get("drainer-id"), Prefix: c.get("subject-prefix"),
		InitStream: true, Grace: grace, Version: version, Memcached: splitList(c.get("memcached")),
		CORSOrigins: splitList(c.get("cors-origins")),
	}
	// Transport security: the database over TLS when its files are set, HTTPS on the
	// listeners.
	if opts.MySQLDSN, err = c.mysqlDSN(); err != nil {
		return app.Options{}, err
	}
	opts.TLSCertFile, opts.TLSKeyFile = c.get("tls-cert"), c.get("tls-key")
	if dev && (opts.TLSCertFile != "" || opts.TLSKeyFile != "") {
		return app.Options{}, errDevTLS
	}
	if err := c.boundsOptions(&opts); err != nil {
		return app.Options{}, err
	}
	return opts, nil
}

// printDevBanner tells the developer where `sluice dev` listens and with which token.
func printDevBanner(stdout io.Writer, a *app.App, opts app.Options, extras devExtras) {
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
