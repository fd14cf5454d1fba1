package drainer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/drainer/store"
	"github.com/sluicehq/sluice/gate/job"
)

// startDispatch sends c to the executor in a goroutine owned by the Drainer and records the
// answer. The job is already committed as dispatched: nothing is sent before that commit.
func (d *Drainer) startDispatch(c claimed) {
	d.dispatches.Add(1)
	go func() {
		defer d.dispatches.Done()
		ctx, cancel := context.WithTimeout(d.work, c.wall)
		defer cancel()
		deadline := *c.row.DispatchedAt
		deadline = deadline.Add(c.wall)
		ans := d.cfg.Executor.Send(ctx, executor.Dispatch{
			JobID:         c.row.ID,
			Tenant:        c.row.Tenant,
			RateKeySHA256: c.row.RateKeySHA256,
			Payload:       c.row.Payload,
			Nonce:         c.nonce,
			Deadline:      deadline,
			Version:       c.row.Version,
			Attempt:       c.row.Attempt,
		})
		// Record with a context of its own: a canceled dispatch must still record its outcome.
		rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer rcancel()
		if err := d.recordRetrying(rctx, c, ans); err != nil {
			d.cfg.Log.Error("recording dispatch outcome failed; the lease will recover the job", "job_id", c.row.ID, "error", err)
		}
	}()
}

// record applies an executor's answer to the job it was dispatched as (SPEC §8), fenced on the
// claimed version: if recovery or an executor's /complete got there first, the write is refused
// and this drainer lets go of the job.
func (d *Drainer) record(ctx context.Context, c claimed, ans executor.Answer) error {
	if ans.Kind == executor.Accepted {
		return nil // the executor will call /complete; the lease is renewed until the wall
	}
	defer func() {
		d.mu.Lock()
		if h, ok := d.held[c.row.ID]; ok && h.version == c.row.Version {
			delete(d.held, c.row.ID)
		}
		d.mu.Unlock()
		d.Wake() // capacity freed: claim the next job now, not at the next poll
	}()
	cfg, err := loadLimits(ctx, d.cfg.DB)
	if err != nil {
		return err
	}
	if ans.Gate != nil && ans.Gate.RetryAfter > 0 {
		d.gate(ctx, c.row, ans.Gate.RetryAfter)
	}
	now, err := d.cfg.Clock.Now(ctx)
	if err != nil {
		return err
	}
	tx, err := d.cfg.DB.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin outcome: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	r, err := store.Get(ctx, tx, c.row.ID, true)
	if err != nil {
		return err
	}
	if r.Version != c.row.Version || !r.Status.InFlight() {
		d.cfg.Log.Info("dispatch outcome ignored: the job moved on", "job_id", r.ID,
			"claimed_version", c.row.Version, "version", r.Version, "status", r.Status)
		return nil
	}
	neverStarted := r.Status != job.Running && !d.cfg.UnconfirmedStarts
	var o store.Outcome
	switch ans.Kind {
	case executor.Done:
		o = store.Outcome{Status: job.Status(ans.Status), ErrorCode: ans.ErrorCode, ErrorMessage: ans.ErrorMessage, Result: ans.Result}
	case executor.RateLimited:
		retry := ans.RetryAfter
		if retry <= 0 {
			retry = 1
		}
		d.gate(ctx, r, retry)
		if neverStarted {
			nb := now.Add(time.Duration(retry) * time.Second)
			o = store.Outcome{Status: job.Queued, NotBefore: &nb, ErrorCode: string(job.CodeRateLimited),
				ErrorMessage: "the executor answered 429; the rate key is gated"}
		} else {
			o = store.Outcome{Status: job.Failed, ErrorCode: string(job.CodeRateLimited), ErrorMessage: "the executor answered 429 after the start"}
		}
	case executor.Refused:
		if neverStarted {
			nb := now.Add(refusalDelay(ans.RetryAfter, r.Attempt))
			o = store.Outcome{Status: job.Queued, NotBefore: &nb, ErrorCode: "executor_refused",
				ErrorMessage: "the executor answered 503"}
		} else {
			o = store.Outcome{Status: job.Failed, ErrorCode: "executor_refused", ErrorMessage: "the executor answered 503 after the start"}
		}
	default:
		msg := "the dispatch's outcome is unknown"
		if ans.Err != nil {
			msg = ans.Err.Error()
		}
		if neverStarted {
			o = store.Outcome{Status: job.Queued, CountFailure: true, Budget: cfg.DispatchAttempts,
				ErrorCode: "dispatch_error", ErrorMessage: msg}
		} else {
			o = store.Outcome{Status: job.Lost, ErrorCode: "outcome_unknown", ErrorMessage: msg}
		}
	}
	if _, err := d.store.Finish(ctx, tx, now, r, o); err != nil {
		if errors.Is(err, store.ErrFenced) {
			return nil
		}
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit outcome of job %d: %w", r.ID, err)
	}
	if d.cfg.Metrics != nil {
		d.cfg.Metrics.observeOutcome(r, o.Status, now)
	}
	return nil
}

// refusalDelay is how long a job refused with 503 waits: the executor's Retry-After, else 1 s
// doubling per attempt up to 60 s.
func refusalDelay(retryAfter, attempt int) time.Duration {
	if retryAfter > 0 {
		return time.Duration(retryAfter) * time.Second
	}
	delay := time.Second
	for i := 1; i < attempt && delay < time.Minute; i++ {
		delay *= 2
	}
	return min(delay, time.Minute)
}

// gate extends the gate of r's rate key; a failing gate store is logged, never fatal (the job's
// own not-before still holds it back).
func (d *Drainer) gate(ctx context.Context, r store.Row, retryAfter int) {
	if d.cfg.Gates == nil || r.RateKeySHA256 == nil {
		return
	}
	if _, err := d.cfg.Gates.Extend(ctx, *r.RateKeySHA256, retryAfter); err != nil {
		d.cfg.Log.Warn("could not gate rate key", "rate_key_sha256", *r.RateKeySHA256, "error", err)
	}
}
