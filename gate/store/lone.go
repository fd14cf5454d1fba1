package store

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/sluicehq/sluice/gate/sqldb"
)

// The lone-job probe is the pickup path of an idle queue: when a drainer's previous pass left the
// queue empty, a job that arrives is most likely the only one queued, and then every ordering
// picks it whatever the other tenants hold in flight. So such a pass first reads at most two
// queued jobs, alone (ProbeQueue) or, after a poke, under the claim lock in the
// claim's first round trip (LockClaims): two round trips from the poke to the dispatch.

// QueuedJob is a queued job as the lone-job probe reads it: what a claim decides by. The claim
// reads its payload back (ClaimJobs).
type QueuedJob struct {
	Head
	NotBefore sql.NullTime
}

// loneProbeSQL reads at most two queued jobs.
const loneProbeSQL = `SELECT id, tenant, rate_key_sha256, queued_at, version, lanes, interactive,
	not_before FROM jobs FORCE INDEX (claim) WHERE status = 'queued' LIMIT 2`

// ProbeQueue reads at most two queued jobs: none means there is nothing to
// do, one may be claimed at once (the lone-job path of an idle queue). LockClaims can make the
// same read under the claim lock, in its round trip.
func ProbeQueue(ctx context.Context, db sqldb.DB) ([]QueuedJob, error) {
	rows, err := db.QueryContext(ctx, loneProbeSQL)
	if err != nil {
		return nil, fmt.Errorf("read the queue's head: %w", err)
	}
	defer rows.Close()
	return scanLone(rows)
}

// scanLone reads loneProbeSQL's rows.
func scanLone(rows *sql.Rows) ([]QueuedJob, error) {
	var found []QueuedJob
	for rows.Next() {
		var j QueuedJob
		var lanes string
		if err := rows.Scan(&j.ID, &j.Tenant, &j.RateKey, &j.QueuedAt, &j.Version, &lanes, &j.Interactive, &j.NotBefore); err != nil {
			return nil, fmt.Errorf("read the queue's head: %w", err)
		}
		if lanes != "" {
			j.Lanes = SplitLanes(lanes)
		}
		found = append(found, j)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the queue's head: %w", err)
	}
	return found, nil
}
