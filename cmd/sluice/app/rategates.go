package app

import (
	"context"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/gate/rategate"
	"github.com/sluicehq/sluice/gate/store"
)

// startGates builds the rate-gate store on opts.Memcached, if any, and registers the
// sluice_gated_keys gauge. Without memcached no key is ever gated.
func (a *App) startGates() error {
	if len(a.opts.Memcached) == 0 {
		return nil
	}
	var err error
	if a.gates, err = rategate.New(rategate.Config{Servers: a.opts.Memcached, Timeout: a.opts.GateTimeout, Log: a.log}); err != nil {
		return err
	}
	queued := func(ctx context.Context) (map[string]int64, error) { return store.QueuedRateKeys(ctx, a.db, 0) }
	return rategate.RegisterGatedKeys(a.registry, rategate.GaugeConfig{Queued: queued, Store: a.gates, Log: a.log})
}

// drainerGates is the store as the drainer takes it: a nil interface, never an interface
// holding a nil *rategate.Store, when no memcached is configured.
func (a *App) drainerGates() drainer.RateGates {
	if a.gates == nil {
		return nil
	}
	return a.gates
}

// RateGates returns the process's rate-gate store, or nil when no memcached is configured (for
// /v1/status: rategate.Queued and Store.Reachable).
func (a *App) RateGates() *rategate.Store { return a.gates }
