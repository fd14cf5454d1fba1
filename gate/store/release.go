package store

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/gate/sqldb"
	"github.com/sluicehq/sluice/outbox"
)

// Release writes a capacity-release poke for tenant in tx: capacity freed outside sluice's job
// transitions (a sandbox that stopped, a slot an external executor gave back). It changes no
// job; the poke only wakes drainers, which read the truth from the database. It returns the
// outbox row id.
func (s *Store) Release(ctx context.Context, tx sqldb.DB, now time.Time, tenant string) (int64, error) {
	ids, err := outbox.Write(ctx, tx, now, outbox.PokeMessage(s.prefix(), outbox.Release, tenant, 0))
	if err != nil {
		return 0, fmt.Errorf("release for tenant %q: %w", tenant, err)
	}
	return ids[0], nil
}
