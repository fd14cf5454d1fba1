package gate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sluicehq/sluice/gate/admitrate"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/sqldb"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/outbox"
)

// run decides and writes items in one transaction, retried as a whole on deadlock.
// shared marks a combiner group (see errGroupLocked); read, if set, is called each time the
// transaction has read its state under its tenants' locks (Admitter.overlap).
func (a *Admitter) run(ctx context.Context, items []*item, cfg config.Config, shared bool, read func()) error {
	if cfg.AdmissionMode != config.ModeOff {
		if err := a.lookupGates(ctx, items); err != nil {
			return err
		}
	}
	var rows []outbox.Row
	var err error
	for attempt := 1; ; attempt++ {
		rows, err = a.attempt(ctx, items, cfg, shared, read)
		if err == nil || !retryable(err) || attempt >= a.cfg.TxAttempts {
			break
		}
		if !shared && lockBusy(err) {
			// A queued job a replace key names was held elsewhere (store.LockReplaceable takes
			// it without waiting): most likely a claim, a few milliseconds long. Give it time.
			t := time.NewTimer(time.Duration(attempt) * replaceRetry)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
		}
	}
	if err != nil {
		return err
	}
	if len(rows) > 0 && a.cfg.Published != nil {
		a.cfg.Published(rows)
	}
	return nil
}

// replaceRetry is the wait before a retry of an admission whose replace key's job was held
// elsewhere, times the attempts made: about a claim's length.
const replaceRetry = 10 * time.Millisecond

// lookupGates reads, before the transaction, the gates of queue=false items' rate keys: a
// memcached round trip must not be made while holding a tenant's lock. Its only error is the
// clock's.
func (a *Admitter) lookupGates(ctx context.Context, items []*item) error {
	if a.cfg.RateGates == nil {
		return nil
	}
	var hashes []string
	for _, it := range items {
		if it.invalid == nil && it.hash != nil && it.req.Queue != nil && !*it.req.Queue {
			hashes = append(hashes, *it.hash)
		}
	}
	if len(hashes) == 0 {
		return nil
	}
	now, err := a.cfg.Clock.Now(ctx)
	if err != nil {
		return unavailable(err)
	}
	gated := a.gates(ctx, hashes, now)
	for _, it := range items {
		if it.invalid != nil || it.hash == nil || it.req.Queue == nil || *it.req.Queue {
			continue
		}
		if nb, ok := gated[*it.hash]; ok && nb.After(now) {
			it.gatedFor = int((nb.Sub(now) + time.Second - 1) / time.Second)
		}
	}
	return nil
}

// gates returns the gate instants of the gated keys among hashes (Config.RateGates, which must be
// set), asked with a 200 ms bound; a lookup that fails is counted and logged (failOpen, now) and
// treats every key as not gated.
func (a *Admitter) gates(ctx context.Context, hashes []string, now time.Time) map[string]time.Time {
	gctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	gated, err := a.cfg.RateGates.NotBefore(gctx, hashes)
	if err != nil {
		a.cfg.FailOpenMetrics.gateLookupFailed()
		a.failOpen("rate gate lookup failed; treating keys as not gated", err, now)
	}
	return gated
}

// failOpen logs a limiter-side failure at most once per 15 s (SPEC §5: fails open, counts it,
// logs sparingly). now is the admission's reading of Config.Clock.
func (a *Admitter) failOpen(msg string, err error, now time.Time) {
	a.logMu.Lock()
	if now.Sub(a.lastFailOpen) < 15*time.Second {
		a.logMu.Unlock()
		return
	}
	a.lastFailOpen = now
	a.logMu.Unlock()
	a.cfg.Log.Warn(msg, "error", err)
}

// attempt is one try at items' transaction: read the state under the tenant locks, decide
// (decide.go), take and settle the rate-limit reservations, write and commit. It returns the
// outbox rows of the committed pokes.
func (a *Admitter) attempt(ctx context.Context, items []*item, cfg config.Config, shared bool, read func()) (rows []outbox.Row, err error) {
	var live []*item
	for _, it := range items {
		it.reset()
		if it.invalid == nil {
			live = append(live, it)
		}
	}
	if len(live) == 0 {
		return nil, nil
	}
	// The transaction's one reading of Config.Clock, taken before its statements run (see
	// depthEstimate.counted).
	wall, err := a.cfg.Clock.Now(ctx)
	if err != nil {
		return nil, unavailable(err)
	}
	var stmts *store.StmtCache
	if len(live) > maxGroup {
		stmts = a.stmts // a batch (see store.AdmissionTx)
	}
	atx, err := store.BeginAdmission(ctx, a.cfg.TxDB, stmts)
	if err != nil {
		return nil, unavailable(err)
	}
	tx := a.withFaults(ctx, atx)
	reservations := map[string]*admitrate.Reservation{}
	done := false
	defer func() {
		if !done {
			for _, r := range reservations {
				r.Refund(ctx, r.Granted())
			}
		}
		tx.Close()
	}()
	st, err := a.read(ctx, tx, live, cfg, shared, wall)
	if err != nil {
		if shared && (lockBusy(err) || syntaxError(err)) {
			return nil, errGroupLocked
		}
		return nil, a.txErr(err)
	}
	if read != nil {
		read()
	}
	replays(live, cfg, st)
	if err := replayPositions(ctx, tx.DB(), live); err != nil {
		return nil, a.txErr(err)
	}
	a.reserve(ctx, rateCharges(live, cfg), cfg, st, reservations, wall)
	if f := a.cfg.Faults; f != nil && f.AfterReserve != nil {
		if err := f.AfterReserve(ctx); err != nil {
			return nil, a.txErr(err)
		}
	}
	for t, n := range decide(live, cfg, st) {
		reservations[t].Refund(context.Background(), n)
	}
	a.logShadowed(live)
	if done, err = a.write(ctx, tx, live, st, shared, reservations); err != nil {
		return nil, err
	}
	rows = a.finish(ctx, live, st)
	a.depth.admitted(len(rows))
	return rows, nil
}

// keyed reports whether it is inserted queued with a start deadline, a replace key or a priority
// other than the default, which their tables record (store.RecordJobKeys).
func (it *item) keyed() bool {
	return it.insert && it.scope == "" && (it.req.StartBy != nil || it.req.ReplaceKey != nil || it.req.priority() != job.DefaultPriority)
}

// recorded reports whether store.RecordJobKeys writes a row of it: keyed, or a redrive inserted,
// queued or rejected (job_redrives links both to the job redriven).
func (it *item) recorded() bool {
	return it.keyed() || (it.insert && it.retryOf != nil)
}

// replace moves the queued jobs the inserted items replace to replaced (store.Replace): rows
// locked by the read (store.LockReplaceable), or items of this transaction that a later one of it
// replaced.
func (a *Admitter) replace(ctx context.Context, tx txConn, items []*item, st *state) error {
	var rs []store.Replacement
	for _, it := range items {
		switch r := it.replaces; {
		case r.row != nil:
			rs = append(rs, store.Replacement{Old: *r.row, By: it.id})
		case r.item != nil:
			old := store.Row{Job: job.Job{ID: r.item.id, Tenant: r.item.req.Tenant, Status: job.Queued}}
			rs = append(rs, store.Replacement{Old: old, By: it.id})
		}
	}
	return a.store.Replace(ctx, tx.DB(), st.now, rs)
}

// write inserts the decided rows and commits, the COMMIT in the inserts' round trip or in one
// of its own (commitWithInsert). settled reports whether the reservations are settled: the
// transaction committed, or its COMMIT failed and commitErr kept or refunded them.
func (a *Admitter) write(ctx context.Context, tx txConn, items []*item, st *state, shared bool, reservations map[string]*admitrate.Reservation) (settled bool, err error) {
	if !slices.ContainsFunc(items, func(it *item) bool { return it.insert }) {
		// Replays and refusals that write nothing: nothing to keep, and no charge to settle
		// (replays are not charged; decide refunded the refused). The caller's close rolls the
		// transaction back, which also takes back the tenants rows its lock statement created:
		// a flood of refused tenant names leaves no tenant state.
		return true, nil
	}
	replaces := slices.ContainsFunc(items, func(it *item) bool { return it.replaces.some() })
	recorded := slices.ContainsFunc(items, (*item).recorded)
	withInsert := a.commitWithInsert(tx, reservations) && !replaces && !recorded
	if err := a.insert(ctx, tx, items, st, !shared, withInsert); err != nil {
		if withInsert && sqldb.ConnectionLost(err) {
			return true, a.commitErr(ctx, err, items, reservations) // the COMMIT may have run
		}
		return false, a.txErr(err)
	}
	if replaces {
		if err := a.replace(ctx, tx, items, st); err != nil {
			return false, a.txErr(err)
		}
	}
	if recorded {
		var jobs []store.JobKeys
		for _, it := range items {
			switch {
			case it.keyed():
				queuedAt := st.now
				if due := it.req.due(st.now); due.After(st.now) {
					queuedAt = due // scheduled: it joins its tenant's queue then (store.NewJob.Due)
				}
				jobs = append(jobs, store.JobKeys{ID: it.id, Tenant: it.req.Tenant, StartBy: it.req.startBy(), ReplaceKey: it.req.ReplaceKey,
					Priority: it.req.Priority, QueuedAt: queuedAt, RetryOf: it.retryOf})
			case it.recorded():
				jobs = append(jobs, store.JobKeys{ID: it.id, Tenant: it.req.Tenant, RetryOf: it.retryOf})
			}
		}
		if err := store.RecordJobKeys(ctx, tx.DB(), jobs); err != nil {
			return false, a.txErr(err)
		}
	}
	if !withInsert {
		if err := tx.Commit(); err != nil {
			return true, a.commitErr(ctx, err, items, reservations) // the transaction is over either way
		}
	}
	return true, nil
}

// replayPositions reads the queue position of each replayed job still queued.
func replayPositions(ctx context.Context, tx sqldb.DB, items []*item) error {
	for _, it := range items {
		if it.invalid != nil || !it.res.Replayed {
			continue
		}
		j, err := store.WithPosition(ctx, tx, it.res.Job)
		if err != nil {
			return err
		}
		it.res.Job = j
	}
	return nil
}

// reserve takes the rate-limit units of charges (rateCharges) and records each tenant's grant
// in st.rate for decide; reservations keeps them for refunds. A tenant whose reservation fails
// is admitted without the limit (SPEC §5: fails open, counted, logged sparingly).
func (a *Admitter) reserve(ctx context.Context, charges []rateCharge, cfg config.Config, st *state, reservations map[string]*admitrate.Reservation, now time.Time) {
	if len(charges) == 0 {
		return
	}
	if a.cfg.RateLimiter == nil {
		a.logMu.Lock()
		warn := !a.warnedNoRL
		a.warnedNoRL = true
		a.logMu.Unlock()
		if warn {
			a.cfg.Log.Warn("admission_rate_per_minute is set but this process has no rate limiter (memcached); not enforced")
		}
		return
	}
	for _, c := range charges {
		rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		r, err := a.cfg.RateLimiter.Reserve(rctx, c.tenant, c.n, cfg.AdmissionRatePerMinute, now)
		cancel()
		if err != nil {
			a.cfg.FailOpenMetrics.limiterFailed()
			a.failOpen("admission rate limiter unavailable; admitting without it (fail open)", err, now)
			continue
		}
		reservations[c.tenant] = r
		if st.rate == nil {
			st.rate = map[string]rateGrant{}
		}
		st.rate[c.tenant] = rateGrant{granted: r.Granted(), retryAfter: r.RetryAfter}
	}
}

// logShadowed logs the refusals shadow mode let through (SPEC §5: recorded, not refused).
func (a *Admitter) logShadowed(items []*item) {
	for _, it := range items {
		if it.shadow.rate {
			a.cfg.Log.Warn("admission rate limit would refuse (shadow mode)", "tenant", it.req.Tenant)
		}
	}
	for _, it := range items {
		if it.shadow.scope != "" {
			a.cfg.Log.Warn("depth cap would refuse admission (shadow mode)", "tenant", it.req.Tenant, "scope", it.shadow.scope)
		}
		if it.shadow.immediate {
			a.cfg.Log.Warn("immediate-or-refuse would refuse admission (shadow mode)", "tenant", it.req.Tenant)
		}
	}
}

// finish builds the results of a committed transaction, logs and returns its outbox rows.
func (a *Admitter) finish(ctx context.Context, items []*item, st *state) []outbox.Row {
	var rows []outbox.Row
	for _, it := range items {
		switch {
		case it.dupOf != nil:
			if it.dupOf.err != nil || it.dupOf.scope != "" {
				it.err = it.dupOf.err
				if it.dupOf.scope != "" {
					it.err = depthError(it.dupOf)
				}
			} else {
				it.res = it.dupOf.res
				it.res.Replayed = true
			}
		case !it.insert:
		case it.scope != "":
			a.cfg.Log.Warn("depth cap refused admission", "tenant", it.req.Tenant, "scope", it.scope, "job_id", it.id)
			a.store.LogTransition(ctx, store.Row{Job: job.Job{ID: it.id, Tenant: it.req.Tenant, QueuedAt: st.now, Status: "admitted"}}, job.Rejected, 0, st.now, string(job.CodeQueueFull))
			a.store.Metrics.Finished(job.Rejected, nil, st.now)
			it.err = depthError(it)
		default:
			it.res.Job.ID, it.res.Job.Tenant, it.res.Job.Status, it.res.Job.QueuedAt = it.id, it.req.Tenant, job.Queued, st.now
			if due := it.req.due(st.now); !due.IsZero() {
				it.res.Job.QueuedAt, it.res.Job.NotBefore = due, &due
			}
			it.res.Job.StartBy, it.res.Job.ReplaceKey = it.req.startBy(), it.req.ReplaceKey
			if by := it.replacedBy; by != nil {
				// A later admission of the same request replaced it before the COMMIT.
				it.res.Job.Status, it.res.Job.ReplacedBy, it.res.Job.Position = job.Replaced, &by.id, nil
			}
			if it.replaces.some() {
				a.store.Metrics.Finished(job.Replaced, nil, st.now) // the job it replaced ended
			}
			it.res.Job.RateKeySHA256, it.res.Job.RetryOf = it.hash, it.retryOf
			it.res.Job.Lanes, it.res.Job.Interactive = append([]string{}, it.req.Lanes...), it.req.interactive()
			a.store.LogTransition(ctx, store.Row{Job: job.Job{ID: it.id, Tenant: it.req.Tenant, QueuedAt: st.now, Status: "admitted"}}, job.Queued, 0, st.now, "")
			if it.outboxID != 0 {
				msg := outbox.PokeMessage(a.cfg.Prefix, outbox.Enqueue, it.req.Tenant, it.id)
				rows = append(rows, outbox.Row{ID: it.outboxID, Subject: msg.Subject, Payload: msg.Payload, CreatedAt: st.now})
			}
		}
	}
	return rows
}

// txErr turns a database failure inside an admission transaction into the API's error: the
// database unreachable or the connection lost before COMMIT is "unavailable, retryable"
// (nothing was written); anything else stays an internal error for the log.
func (a *Admitter) txErr(err error) error {
	var je *job.Error
	if errors.As(err, &je) {
		return err
	}
	if sqldb.ConnectionLost(err) {
		return unavailable(err)
	}
	return err
}

// commitErr classifies a failed COMMIT and settles the rate-limit reservations. If the
// connection broke during COMMIT its outcome is unknown: the first inserted row is re-read by
// id on another connection and the charges are kept if it exists, refunded if not. An unkeyed
// request must not be retried blindly (it may create a duplicate); a keyed one may, since its
// replay returns the one job that exists.
func (a *Admitter) commitErr(ctx context.Context, err error, items []*item, res map[string]*admitrate.Reservation) error {
	refundAll := func() {
		for _, r := range res {
			r.Refund(ctx, r.Granted())
		}
	}
	if !sqldb.ConnectionLost(err) {
		refundAll()
		return fmt.Errorf("commit admission: %w", err)
	}
	var first int64
	keyed := true
	for _, it := range items {
		if it.insert && first == 0 {
			first = it.id
		}
		if it.req.IdempotencyKey == nil && it.retryOf == nil {
			keyed = false
		}
	}
	exists := "unknown"
	if first != 0 {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_, gerr := store.Get(rctx, a.cfg.DB, first, false)
		cancel()
		switch {
		case gerr == nil:
			exists = "yes"
		case errors.Is(gerr, store.ErrNotFound):
			exists = "no"
			refundAll()
		}
	}
	a.cfg.Log.Warn("admission commit outcome unknown", "job_id", first, "row_found_on_reread", exists, "error", err)
	detail := map[string]any{"retryable": keyed}
	if first != 0 && len(items) == 1 {
		detail["id"] = first
	}
	return &job.Error{Code: job.CodeOutcomeUnknown, Err: err,
		Message: "the database connection broke during commit; the job may or may not exist",
		Detail:  detail}
}

// commitWithInsert says whether the COMMIT goes in the inserts' round trip, which saves an
// admission one of its three (about a tenth of single-admission throughput at 4 clients, and
// some pickup latency). The price: if the connection breaks in that round trip, the new rows'
// ids are unknown as well as the outcome. Only a rate-limit reservation needs them then (SPEC
// §5: the row is re-read by its id to keep or refund the charge), so a transaction holding one
// commits in a round trip of its own, as does a batch (see store.AdmissionTx). A test's Faults
// do not change this (see faultyTx).
func (a *Admitter) commitWithInsert(tx txConn, reservations map[string]*admitrate.Reservation) bool {
	return len(reservations) == 0 && tx.CanCommitWithInsert()
}
