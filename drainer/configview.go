package drainer

import (
	"context"
	"database/sql"
	"reflect"
	"sync/atomic"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/sqldb"
)

// configView is the runtime configuration (config_versions) as this drainer last read it: by a
// claim transaction, under the claim lock, or by the upkeep's refresh. The claimer chooses
// candidates on it, the lease keeper takes the lease and wall from it, the rescuer the dispatch
// budget and the expirer max_queue_age_seconds. Safe for concurrent use without a lock: the lease
// keeper reads it from the goroutine that renews leases during a long pass.
type configView struct {
	p atomic.Pointer[config.Config] // nil until the first read
}

// get returns the configuration last read, or the defaults before the first read.
func (v *configView) get() config.Config {
	if c := v.p.Load(); c != nil {
		return *c
	}
	return config.Default()
}

// seen reports whether a configuration has been read.
func (v *configView) seen() bool { return v.p.Load() != nil }

// set records cfg as the configuration last read.
func (v *configView) set(cfg config.Config) { v.p.Store(&cfg) }

// refresh re-reads the runtime configuration from db, and reports whether it differs from the
// one last read (the defaults before the first read).
func (v *configView) refresh(ctx context.Context, db *sql.DB) (changed bool, err error) {
	cfg, err := loadLimits(ctx, db)
	if err != nil {
		return false, err
	}
	changed = !reflect.DeepEqual(cfg, v.get())
	v.set(cfg)
	return changed, nil
}

func loadLimits(ctx context.Context, q sqldb.DB) (config.Config, error) {
	v, err := config.Load(ctx, q)
	return v.Config, err
}
