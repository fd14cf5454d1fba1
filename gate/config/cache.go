package config

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/sluicehq/sluice/gate/sqldb"
)

// ReloadEvery is how often a process re-reads the runtime configuration (SPEC §9: at most
// every 5 s).
const ReloadEvery = 5 * time.Second

// Cache holds the last good runtime configuration of a process. Safe for concurrent use.
type Cache struct {
	db  sqldb.DB
	log *slog.Logger

	mu      sync.Mutex
	current Versioned
	stale   bool
	loaded  bool // a Reload has succeeded
}

// NewCache returns a cache over db holding the defaults until the first Reload.
func NewCache(db sqldb.DB, log *slog.Logger) *Cache {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Cache{db: db, log: log, current: Versioned{Config: Default()}}
}

// Current returns the configuration in force for this process.
func (c *Cache) Current() Versioned {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.current
}

// Stale reports whether the last reload failed (the process runs on its last good config).
func (c *Cache) Stale() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stale
}

// Reload re-reads the configuration. On failure it keeps the last good one, marks the cache
// stale and returns the error.
func (c *Cache) Reload(ctx context.Context) error {
	v, err := Load(ctx, c.db)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		if !c.stale {
			c.log.Warn("runtime config reload failed; keeping the last good config", "version", c.current.Version, "error", err)
		}
		c.stale = true
		return err
	}
	switch {
	case !c.loaded:
		c.log.Info("runtime config loaded", "version", v.Version) // the version the process starts with
	case v.Version != c.current.Version:
		// A change is logged once, by the process that made it (Patch, SPEC §9: one log line per
		// change); each process picking it up says so at debug level.
		c.log.Debug("runtime config loaded", "version", v.Version)
	}
	c.current, c.stale, c.loaded = v, false, true
	return nil
}

// Run reloads every ReloadEvery until ctx is done.
func (c *Cache) Run(ctx context.Context) {
	t := time.NewTicker(ReloadEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = c.Reload(ctx)
		}
	}
}
