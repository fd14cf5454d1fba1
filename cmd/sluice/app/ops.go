package app

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/gate/api"
	"github.com/sluicehq/sluice/gate/opsmetrics"
	"github.com/sluicehq/sluice/gate/status"
	"github.com/sluicehq/sluice/publisher"
)

// opsState is what an App keeps for operations: the status reader and its probes, and the
// state of the shutdown sequence that Stop runs.
type opsState struct {
	memcached *memcachedProbe
	ready     *probe // /readyz's database check, cached (probe.go)
	status    *status.Reader
	stopping  atomic.Bool   // /readyz answers 503 from the first moment of Stop
	ncClosed  chan struct{} // closed when the NATS connection is closed (after Drain)
	closeOnce sync.Once

	stopClaims context.CancelFunc // ends the drainer's loop: no new claims
	claimLoop  sync.WaitGroup
}

func (o *opsState) init(opts Options) {
	o.memcached = newMemcachedProbe(opts.Memcached)
	o.ncClosed = make(chan struct{})
}

// natsOptions are the connection options: publisher.ConnectOptions sets reconnects deliberately
// (forever, 250 ms apart with jitter, no reconnect buffer so a publish during an outage fails
// at once and its row waits in the outbox); the handlers log one line per state change and tell
// Stop when a drained connection has closed.
func (a *App) natsOptions(name string) []nats.Option {
	return append(publisher.ConnectOptions(name),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if a.ops.stopping.Load() {
				return // our own Drain at shutdown, not an outage
			}
			a.log.Warn("NATS disconnected; reconnecting (pokes are hints: the drainer polls, the outbox keeps what is not published)", "error", err)
		}),
		// Not ConnectedUrlRedacted: it masks a password but shows a token (nats://token@host).
		nats.ReconnectHandler(func(nc *nats.Conn) { a.log.Info("NATS reconnected", "url", RedactURL(nc.ConnectedUrl())) }),
		nats.ClosedHandler(func(*nats.Conn) { a.ops.closeOnce.Do(func() { close(a.ops.ncClosed) }) }))
}

// natsDrainTimeout bounds the wait for the NATS connection to drain at shutdown.
const natsDrainTimeout = 5 * time.Second

// drainNATS drains the connection (flushes pending publishes, ends subscriptions) and waits for
// it to close, at most natsDrainTimeout: Drain itself is asynchronous.
func (a *App) drainNATS() {
	if err := a.nc.Drain(); err != nil {
		return
	}
	select {
	case <-a.ops.ncClosed:
	case <-time.After(natsDrainTimeout):
	}
}

// startStatus builds the status reader behind GET /v1/status and registers the database-derived
// gauges (opsmetrics). It runs after every other component has registered its metrics: a gauge
// that a component owning the figure already exports (a gate store's sluice_gated_keys, a
// relay's outbox backlog) is left to it.
func (a *App) startStatus() error {
	var err error
	// RateGates: nil until a rate-gate store is wired here (drainer.RateGates has the NotBefore that
	// status needs); without it no key is listed as gated.
	if a.ops.status, err = status.New(status.Config{DB: a.db, Limits: a.limits, RateGates: a.drainerGates(),
		BrokerConnected: a.nc.IsConnected, MemcachedReachable: a.ops.memcached.Reachable, Recent: a.jobs.Recent()}); err != nil {
		return err
	}
	_, omitted, err := opsmetrics.Register(a.registry, opsmetrics.Config{Status: a.ops.status, Log: a.log,
		NoTenantLabels: a.opts.NoTenantLabels})
	if err != nil {
		return err
	}
	if len(omitted) > 0 {
		a.log.Debug("status metrics exported by other components", "metrics", omitted)
	}
	return nil
}

// startOpsServer serves /metrics, /healthz and /readyz on the listen address for a process
// without the API role (a split relay or drainer), so that every process can be scraped and
// health-checked.
func (a *App) startOpsServer(ctx context.Context) error {
	mux := http.NewServeMux()
	if a.opts.MetricsListen == "" {
		mux.Handle("GET /metrics", api.MetricsHandler(a.registry, a.opts.MetricsToken))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeOpsJSON(w, http.StatusOK, map[string]any{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		body := a.components(r.Context())
		body["status"], body["ready"] = "ready", true
		code := http.StatusOK
		if err := a.ready(r.Context()); err != nil {
			// As the API's /readyz: a reason word for anyone, the error for the log.
			api.NotReadyBody(body, err)
			a.log.Warn("not ready", "reason", body["reason"], "error", err)
			code = http.StatusServiceUnavailable
		}
		writeOpsJSON(w, code, body)
	})
	return a.serve(ctx, mux)
}

func writeOpsJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// components reports the optional dependencies in /readyz: sluice works without them (pokes
// are hints, gates fail open), so they never make the process unready.
func (a *App) components(ctx context.Context) map[string]any {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return map[string]any{
		"broker":    map[string]any{"connected": a.nc.IsConnected()},
		"memcached": map[string]any{"reachable": a.ops.memcached.Reachable(ctx)},
		"config":    map[string]any{"version": a.limits.Current().Version, "stale": a.limits.Stale()},
	}
}

// startClaiming runs the drainer's loop under a context of its own, so that Stop can end
// claiming first while everything else (the API serving /start and /complete, the relay) runs on.
func (a *App) startClaiming() {
	ctx, cancel := context.WithCancel(context.Background())
	a.ops.stopClaims = cancel
	a.ops.claimLoop.Add(1)
	go func() {
		defer a.ops.claimLoop.Done()
		a.drainer.Run(ctx)
	}()
}

// stopClaiming is steps 1 and 2 of Stop: /readyz says 503, no new claims, and in-flight
// dispatches get the grace period to finish.
func (a *App) stopClaiming(ctx context.Context) {
	a.ops.stopping.Store(true)
	if a.ops.stopClaims != nil {
		a.ops.stopClaims()
	}
	a.ops.claimLoop.Wait()
	if a.drainer != nil {
		a.log.Info("stopped claiming; waiting for in-flight dispatches", "in_flight", a.drainer.InFlight(), "grace", a.opts.Grace.String())
		gctx, cancel := context.WithTimeout(ctx, a.opts.Grace)
		a.drainer.Stop(gctx)
		cancel()
	}
}
