// Package store owns every statement on the job tables: jobs, tenants (each tenant's queue
// state), claim_lock, drainers and slots (leases on capacity, counted with the jobs in flight:
// slots.go). Admission, the executor-facing API (start, complete, cancel),
// listing, status and the drainer all go through it; none of them builds SQL of its own. Each
// operation is a function (or, when it logs transitions or writes pokes, a method of Store) with
// typed parameters and a typed result, and has a conformance test of its own against MariaDB
// (the _test.go file beside it) that shows what it returns, what its fence refuses and which
// rows it leaves locked.
//
// Fencing. Every write names the version and the state(s) its writer expects; a writer whose
// condition fails has lost the job and must stop touching it (ErrFenced).
//
// Lock order. Every transaction that moves jobs into or out of queued locks the job rows first,
// in id order, then their tenants' rows, in key order (lockorder.go); an admission locks only
// its tenants, in key order.
//
// The statements are shaped for speed in a few ways, each kept here and nowhere else:
//
//   - Combined round trips. A ConnTx drives a transaction by hand on a connection of its own,
//     so that it begins inside its first round trip and commits inside its last, several
//     statements each: an admission costs two (AdmissionTx), a claim two (LockClaims,
//     ClaimJobs), a batch of outcomes two (LockJobs, FinishManyCommit). The expired-lease scan
//     carries the drainer's heartbeat (ScanExpiredWithSlots).
//   - Row-constructor fences. A write to many jobs is fenced with "id IN (...) AND (id,
//     version[, status]) IN ((?,?[,?]), ...)": the same fence as OR-ed groups takes longer to
//     plan than the update takes to run, and the leading id IN (...) keeps it on the
//     primary key, since MariaDB 10.11 plans a row-constructor IN of a single tuple as a full
//     index scan (a million-row scan per claim with a backlog).
//   - Forced indexes. Reads of a queue force the claim index (status, tenant, queued_at, id) and
//     walk it in order, stopping at LIMIT: left to itself MariaDB may pick another index and sort
//     a tenant's whole backlog. Reads of tenants force the index of their order (head,
//     work_tenant, depth: migration 0010), so that none grows with the number of tenants.
//   - Prepared batches. A batch admission inserts through server-side prepared statements
//     (StmtCache): the server parses a 250-row INSERT sent as text for much longer than it binds
//     the same rows to a prepared one.
//   - Derived audit rows. When a prepared batch holds at least 64 jobs whose audit rows the job
//     rows imply (admitted, by the caller), those audit rows are one INSERT ... SELECT of the jobs
//     just inserted, each row's detail cut by the job's offset from one value that carries them
//     all (auditAdmittedRangesSQL): a few bytes a row on the wire instead of twelve values, which
//     cut what the audit adds to a batch admission's CPU, the server's and the API's, by about a
//     third.
//   - Bounded statements. A read of many tenants' heads is split into statements of at most
//     48 KiB (ReadHeads), far below the server's packet limit; a job INSERT holds at most 250
//     rows (InsertJobs).
//
// It sits under gate because it is the gate's data layer: the drainer consumes it, never the
// reverse. It imports only the shared vocabulary (gate/job, gate/sqldb), the runtime config
// (gate/config, which the claim reads under its lock) and the outbox.
package store

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/outbox"
)

// Placeholders returns n comma-separated placeholders, for an IN list or a VALUES row.
func Placeholders(n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat("?,", n-1) + "?"
}

// HashNonce returns the SHA-256 of a nonce: only the hash is stored.
func HashNonce(nonce string) []byte {
	sum := sha256.Sum256([]byte(nonce))
	return sum[:]
}

// Store writes job transitions. Safe for concurrent use.
type Store struct {
	// Prefix is the NATS subject prefix of the pokes written with transitions. Default "sluice".
	Prefix string
	// Log receives one line per job transition (SPEC §10). Default: discard.
	Log *slog.Logger
	// Metrics are the process's job-lifecycle collectors, shared by every Store of the process.
	// The methods here do not count (their caller's transaction may yet roll back): callers
	// report what they wrote once it has committed. Default none: nothing is counted.
	Metrics *Metrics
	// Actor names the writer in the audit rows of transitions made under a context that names
	// none (WithActor): a drainer's id. Default "".
	Actor string
	// AuditOff drops the audit rows (SPEC §10) from the transitions this Store writes. It is not
	// a setting: it exists only so that the benchmarks can measure the audit trail's cost beside
	// the same work without it, in the same run. Default false: every transition is audited.
	AuditOff bool
	// ChargeTime, if set and true when an outcome is written, charges the executor time of the
	// jobs that ended (start to outcome) to their tenants in tenant_time, in the outcome's
	// transaction (ordering fair_time, migration 0023). Default nil: nothing is charged.
	ChargeTime func() bool
}

func (s *Store) prefix() string {
	if s.Prefix == "" {
		return outbox.DefaultPrefix
	}
	return s.Prefix
}

// LogTransition writes the one structured line per job transition of SPEC §10.
func (s *Store) LogTransition(ctx context.Context, r Row, to job.Status, version int64, now time.Time, code string) {
	if s.Log == nil || !s.Log.Enabled(ctx, slog.LevelInfo) {
		return
	}
	// A record of its own rather than Logger.LogAttrs, which reads the caller's program counter
	// (runtime.Callers) for a source no handler here prints: a batch writes a thousand lines.
	rec := slog.NewRecord(time.Now(), slog.LevelInfo, "job transition", 0)
	attrs := []slog.Attr{
		slog.Int64("job_id", r.ID),
		slog.String("tenant", r.Tenant),
		slog.String("from", string(r.Status)),
		slog.String("to", string(to)),
		slog.Int64("version", version),
	}
	if r.DispatchedAt != nil {
		attrs = append(attrs, slog.Int64("waited_ms", r.DispatchedAt.Sub(r.QueuedAt).Milliseconds()))
		if to.Terminal() {
			attrs = append(attrs, slog.Int64("ran_ms", now.Sub(*r.DispatchedAt).Milliseconds()))
		}
	} else if to == job.Dispatched {
		attrs = append(attrs, slog.Int64("waited_ms", now.Sub(r.QueuedAt).Milliseconds()))
	}
	if code != "" {
		attrs = append(attrs, slog.String("error_code", code))
	}
	rec.AddAttrs(attrs...)
	_ = s.Log.Handler().Handle(ctx, rec) // as Logger.LogAttrs, which drops the handler's error
}
