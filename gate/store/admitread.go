package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gate/config"
)

// AdmissionRead is what an admission transaction reads under its tenants' locks.
type AdmissionRead struct {
	// Tenants are the tenants whose rows are locked (created if missing), sorted and distinct
	// so that two batches lock in the same order and cannot deadlock. At least one.
	Tenants []string
	// NoWait takes the locks without waiting: a tenant held by another transaction fails the
	// read with a lock wait timeout (MariaDB's SET STATEMENT; a server without it fails the
	// statement with a syntax error).
	NoWait bool
	// GlobalCountUpTo, if above 0, counts the queued jobs of every tenant, stopping at that many;
	// else GlobalEstimate is returned as the global depth without a count.
	GlobalCountUpTo int64
	GlobalEstimate  int64
	// CountInFlight reads what is in flight, jobs and live slots (AdmissionState.Usage, tiers as
	// Config says): the capacity decision of queue=false admissions and the headers of every admission
	// (SPEC §5a).
	CountInFlight bool
	Config        config.Config
	// CountInteractive counts each tenant's interactive queued jobs (AdmissionState's
	// TenantInteractive): only a queue=false admission of interactive work needs them.
	CountInteractive bool
	// IdempotencyKeys are looked up among Tenants' jobs.
	IdempotencyKeys []string
	// Redrives are the jobs redriven: the job each one's first redrive created is read.
	Redrives []int64
}

// AdmissionState is what ReadAdmission read.
type AdmissionState struct {
	Now         time.Time // the database's UTC_TIMESTAMP(6), read after the locks
	TenantDepth map[string]int
	// TenantInteractive counts the tenant's interactive queued jobs: they are all that is ahead
	// of an interactive job, which goes before its tenant's other queued jobs (SPEC §5a).
	TenantInteractive map[string]int
	TenantInFlight    map[string]int
	GlobalDepth       int // counted, or the estimate given
	// NoHeadAfterNow says that no tenant read has a queue head dated after Now (NewJobs).
	NoHeadAfterNow bool
	// Usage is what is in flight by tenant, tier, lane and interactive, when counted.
	Usage    config.Usage
	Keyed    []Row
	Redriven []Row
}

// lockTenantsSQL is the statement that takes the row lock of n tenants, given in sorted order so
// that two batches lock in the same order and cannot deadlock. Locking a tenant serialises that
// tenant's admissions, which makes its depth cap and idempotent replay exact; other tenants are
// not blocked. A tenant's row is created at its first admission.
func lockTenantsSQL(n int) string {
	return "INSERT INTO tenants (tenant, created_at) VALUES " +
		strings.TrimSuffix(strings.Repeat("(?, UTC_TIMESTAMP(6)),", n), ",") +
		" ON DUPLICATE KEY UPDATE tenant = tenant"
}

// ReadAdmission begins the transaction, locks p's tenants and reads the database clock, the
// session's id step (idStepSQL, kept for InsertJobs), the depths, in-flight counts, idempotency keys and redrives p asks for, all in one round trip.
// Each read is its own statement after the lock: a statement that both locked and read would
// take its snapshot before it waited for the lock and miss what the previous holder committed
// (a racing duplicate key, a depth one short). Folding the reads into the lock as INSERT ... ON
// DUPLICATE KEY UPDATE ... RETURNING (subqueries) fails that way: the
// idempotency-key lookup, a unique-key lookup of constants, is read while the statement is
// optimised, before the lock wait, and TestFrontDoorIdempotency's 50 racers then hit a duplicate
// key. Under READ COMMITTED each later statement of the round trip reads after the lock is held.
func (t *AdmissionTx) ReadAdmission(ctx context.Context, p AdmissionRead) (AdmissionState, error) {
	stmts, args := admissionReadSQL(p)
	st := AdmissionState{TenantDepth: map[string]int{}, TenantInteractive: map[string]int{}, TenantInFlight: map[string]int{},
		Usage: config.NewUsage()}
	res, err := t.query(ctx, stmts, args)
	if err != nil {
		return st, fmt.Errorf("read admission state: %w", err)
	}
	defer res.Close()
	if err := scanDepths(res, p.Tenants, p.CountInteractive, &st, &t.idStep); err != nil {
		return st, err
	}
	st.Now = st.Now.UTC()
	if p.CountInFlight {
		if st.Usage, st.TenantInFlight, err = readUsageJobs(res, p.Config, p.Tenants); err != nil {
			return st, err
		}
	}
	if len(p.IdempotencyKeys) > 0 {
		if err := res.EachRow(func(r Row) { st.Keyed = append(st.Keyed, r) }); err != nil {
			return st, fmt.Errorf("read idempotency keys: %w", err)
		}
	}
	if len(p.Redrives) > 0 {
		if err := res.EachRow(func(r Row) { st.Redriven = append(st.Redriven, r) }); err != nil {
			return st, fmt.Errorf("read redrives: %w", err)
		}
	}
	return st, res.Close()
}

// admissionReadSQL builds ReadAdmission's statements: the lock, then the depths and counts (for
// one tenant, one statement; for several, grouped counts of the depths and in-flight jobs and of
// the interactive depths), then the idempotency keys and the redrives asked for, if any.
func admissionReadSQL(p AdmissionRead) ([]string, []any) {
	tenantArgs := make([]any, len(p.Tenants))
	for i, t := range p.Tenants {
		tenantArgs[i] = t
	}
	stmts := []string{lockTenantsSQL(len(p.Tenants))}
	args := append([]any(nil), tenantArgs...)
	if p.NoWait {
		stmts[0] = "SET STATEMENT innodb_lock_wait_timeout = 0 FOR " + stmts[0]
	}
	globalSQL, globalArg := "(SELECT ?)", any(p.GlobalEstimate)
	if p.GlobalCountUpTo > 0 {
		globalSQL = "(SELECT COUNT(*) FROM (SELECT 1 FROM jobs FORCE INDEX (claim) WHERE status = 'queued' LIMIT ?) g)"
		globalArg = p.GlobalCountUpTo
	}
	// A tenant's depth is its row's queued count (migration 0010: admission counts the jobs it
	// inserts, the triggers those leaving and re-entering the queue), read under the tenant's
	// lock, which every change of it takes: exact, and one row however deep the queue, where
	// counting the claim index's queued entries would read up to the depth cap a tenant on every
	// admission. The in-flight counts are read from the claim index (status, tenant, ...) alone,
	// three short ranges per tenant bounded by the caps, and the interactive depth from
	// interactive_queue: neither reads a job row. Left to itself the optimizer chooses tenant_id
	// (every job the tenant ever had) or lease (the in-flight jobs of every tenant), and the
	// interactive flag, which is in no index of the jobs in those states, costs a row lookup per
	// queued job.
	if len(p.Tenants) == 1 {
		t := p.Tenants[0]
		// With CountInFlight, the tenant's jobs in flight are counted from the in-flight read
		// below, not by a range read of their own (80 us a statement).
		inFlightSQL, inFlightArgs := "0", []any{}
		if !p.CountInFlight {
			inFlightSQL = "(SELECT COUNT(*) FROM jobs FORCE INDEX (claim) WHERE tenant = ? AND status IN ('claimed','dispatched','running'))"
			inFlightArgs = append(inFlightArgs, t)
		}
		interactiveSQL, interactiveArgs := "0", []any{}
		if p.CountInteractive {
			interactiveSQL = "(SELECT COUNT(*) FROM jobs FORCE INDEX (interactive_queue) WHERE interactive_tenant = ?)"
			interactiveArgs = append(interactiveArgs, t)
		}
		stmts = append(stmts, `SELECT UTC_TIMESTAMP(6),
			(SELECT queued FROM tenants WHERE tenant = ?),
			`+interactiveSQL+`,
			`+inFlightSQL+`,
			`+globalSQL+`,
			`+noHeadAfterNowSQL(1)+`, `+idStepSQL)
		args = append(append(append(args, t), interactiveArgs...), inFlightArgs...)
		args = append(args, globalArg, t)
	} else {
		depths := `SELECT tenant, TRUE, queued FROM tenants WHERE tenant IN (` + Placeholders(len(p.Tenants)) + `)`
		if !p.CountInFlight {
			depths += ` UNION ALL SELECT tenant, FALSE, COUNT(*) FROM jobs FORCE INDEX (claim)
			WHERE status IN ('claimed','dispatched','running') AND tenant IN (` + Placeholders(len(p.Tenants)) + `)
			GROUP BY tenant`
		}
		stmts = append(stmts, `SELECT UTC_TIMESTAMP(6), `+globalSQL+`, `+noHeadAfterNowSQL(len(p.Tenants))+`, `+idStepSQL, depths)
		args = append(args, globalArg)
		args = append(args, tenantArgs...)
		args = append(args, tenantArgs...)
		if !p.CountInFlight {
			args = append(args, tenantArgs...)
		}
		if p.CountInteractive {
			stmts = append(stmts, `SELECT interactive_tenant, COUNT(*) FROM jobs FORCE INDEX (interactive_queue)
			WHERE interactive_tenant IN (`+Placeholders(len(p.Tenants))+`) GROUP BY interactive_tenant`)
			args = append(args, tenantArgs...)
		}
	}
	if p.CountInFlight {
		// Statements of the same round trip, read after the lock like the others: the jobs in
		// flight and the live slots, which count against the same limits (SPEC §5a).
		stmts = append(stmts, usageSQL)
	}
	if len(p.IdempotencyKeys) > 0 {
		stmts = append(stmts, "SELECT "+Columns+" FROM jobs WHERE tenant IN ("+
			Placeholders(len(p.Tenants))+") AND idempotency_key IN ("+Placeholders(len(p.IdempotencyKeys))+")")
		args = append(args, tenantArgs...)
		for _, k := range p.IdempotencyKeys {
			args = append(args, k)
		}
	}
	if len(p.Redrives) > 0 {
		// The job an earlier redrive of the same job created: the first, if several (job_redrives,
		// migration 0027, links each redrive to the job it redrives).
		stmts = append(stmts, "SELECT "+Columns+" FROM jobs WHERE id IN (SELECT MIN(job_id) FROM job_redrives WHERE retry_of IN ("+
			Placeholders(len(p.Redrives))+") GROUP BY retry_of)")
		args = append(args, int64Args(p.Redrives)...)
	}
	return stmts, args
}

// noHeadAfterNowSQL is whether none of n tenants has a queue head dated after the statement's
// UTC_TIMESTAMP(6) (AdmissionState.NoHeadAfterNow).
func noHeadAfterNowSQL(n int) string {
	return "NOT EXISTS (SELECT 1 FROM tenants WHERE tenant IN (" + Placeholders(n) + ") AND head_at > UTC_TIMESTAMP(6))"
}

// scanDepths reads the database time, the depths (with interactive, the interactive ones) and
// the in-flight counts into st, and the session's id step (idStepSQL) into idStep.
func scanDepths(res *Results, tenants []string, interactive bool, st *AdmissionState, idStep *int64) error {
	if len(tenants) == 1 {
		var depth, interactiveDepth, inFlight int
		if err := res.ScanOne(&st.Now, &depth, &interactiveDepth, &inFlight, &st.GlobalDepth, &st.NoHeadAfterNow, idStep); err != nil {
			return fmt.Errorf("read admission state: %w", err)
		}
		st.TenantDepth[tenants[0]], st.TenantInteractive[tenants[0]], st.TenantInFlight[tenants[0]] = depth, interactiveDepth, inFlight
		return nil
	}
	if err := res.ScanOne(&st.Now, &st.GlobalDepth, &st.NoHeadAfterNow, idStep); err != nil {
		return fmt.Errorf("read admission state: %w", err)
	}
	err := eachCount(res, func(t string, queued bool, n int) {
		if queued {
			st.TenantDepth[t] += n
		} else {
			st.TenantInFlight[t] += n
		}
	}, true)
	if err != nil {
		return fmt.Errorf("read tenant depths: %w", err)
	}
	if !interactive {
		return nil
	}
	if err := eachCount(res, func(t string, _ bool, n int) { st.TenantInteractive[t] += n }, false); err != nil {
		return fmt.Errorf("read interactive depths: %w", err)
	}
	return nil
}

// eachCount calls f with each row of the next result set: a tenant, with flagged a flag
// column, and a count.
func eachCount(res *Results, f func(tenant string, flag bool, n int), flagged bool) error {
	rows, err := res.Next()
	if err != nil {
		return err
	}
	for rows.Next() {
		var t string
		var flag bool
		var n int
		dest := []any{&t, &flag, &n}
		if !flagged {
			dest = []any{&t, &n}
		}
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		f(t, flag, n)
	}
	return rows.Err()
}
