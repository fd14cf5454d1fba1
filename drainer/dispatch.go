package drainer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/rategate"
	"github.com/sluicehq/sluice/gate/store"
)

// startDispatch sends c to the executor in a goroutine owned by the Drainer and records the
// answer. The job is already committed as dispatched: nothing is sent before that commit.
func (d *Drainer) startDispatch(c claimed) {
	d.dispatches.Add(1)
	d.unanswered.Add(1)
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
		err := d.recordRetrying(rctx, c, ans)
		if err != nil {
			d.cfg.Log.Error("recording dispatch outcome failed; the lease will recover the job", "job_id", c.row.ID, "error", err)
		}
		// A recorded outcome ends this drainer's hold on the job, and so does a recorded 202,
		// whose lease now runs to the wall; an unrecorded answer stops the renewal, so that
		// recovery takes the job when its lease runs out.
		d.forget(c)
		freed := err == nil && ans.Kind != executor.Accepted
		d.unanswered.Add(-1) // before the wake, so that the pass it starts counts the slot free
		if freed {
			d.Wake() // capacity freed: claim the next job now, not at the next poll
		}
		if d.cfg.Recorded != nil {
			d.cfg.Recorded(c.row.ID)
		}
	}()
}

// forget drops c from the jobs this drainer holds (and renews), unless a later claim of the same
// job replaced it.
func (d *Drainer) forget(c claimed) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if v, ok := d.held[c.row.ID]; ok && v == c.row.Version {
		delete(d.held, c.row.ID)
	}
}

// outcomeReq is one dispatch answer waiting to be recorded.
type outcomeReq struct {
	c         claimed
	ans       executor.Answer
	gateRetry int  // the gate the answer asked for, in seconds (0: none)
	gated     bool // the gate store took that gate
	done      chan error
}

// maxOutcomeBatch bounds the outcomes written in one transaction.
const maxOutcomeBatch = 256

// record applies an executor's answer, whose gate gateAnswer took (gateRetry, gated), to the job
// it was dispatched as (SPEC §8), fenced on the claimed version: if recovery or an executor's
// /complete got there first, the write is refused (startDispatch then lets go of the job, as
// after any recorded outcome). Answers arriving together are written together: the first caller
// to find no batch in progress becomes the writer and records everything queued until the queue
// is empty (group commit), so a thousand outcomes do not cost a thousand commits.
func (d *Drainer) record(ctx context.Context, c claimed, ans executor.Answer, gateRetry int, gated bool) error {
	if ans.Kind == executor.Accepted {
		return d.leaseToWall(ctx, c)
	}
	req := &outcomeReq{c: c, ans: ans, gateRetry: gateRetry, gated: gated, done: make(chan error, 1)}
	d.recMu.Lock()
	d.recQueue = append(d.recQueue, req)
	if d.recBusy {
		d.recMu.Unlock()
		return <-req.done
	}
	d.recBusy = true
	for {
		batch := d.recQueue
		if len(batch) > maxOutcomeBatch {
			batch = batch[:maxOutcomeBatch]
		}
		d.recQueue = d.recQueue[len(batch):]
		d.recMu.Unlock()
		err := d.recordBatch(ctx, batch)
		for _, r := range batch {
			r.done <- err
		}
		d.recMu.Lock()
		if len(d.recQueue) == 0 {
			d.recBusy = false
			d.recMu.Unlock()
			return <-req.done
		}
	}
}

// gateAnswer gates the rate key of c's job when ans carries a gate (any answer, 202 included) or
// is a 429, and returns the gate's retry (0 for none) and whether it is in force. It runs once an
// answer, before the outcome is written and outside any transaction: the key's other jobs must
// stop being claimed whatever happens to this one, and a retried write must not push the gate
// later than now + R + 5 s from the answer (SPEC §5).
func (d *Drainer) gateAnswer(ctx context.Context, c claimed, ans executor.Answer) (gateRetry int, gated bool) {
	if ans.Gate != nil {
		gateRetry = ans.Gate.RetryAfter
	}
	if ans.Kind == executor.RateLimited {
		// SPEC §8: a 429 always gates; without a usable Retry-After the shortest gate is used.
		gateRetry = max(gateRetry, ans.RetryAfter, 1)
	}
	if gateRetry > 0 {
		gated = d.gate(ctx, c.row, gateRetry)
	}
	return gateRetry, gated
}

// leaseToWall records a 202: the executor has the job and will report through /complete, to
// any API process, so the job must not depend on this drainer living on (SPEC §8: it stays
// dispatched or running until complete or wall). Its lease runs to the wall at once; recovery
// takes it only then, and this drainer stops renewing it. Fenced: if the job moved on (an early
// /complete), there is nothing to hold.
func (d *Drainer) leaseToWall(ctx context.Context, c claimed) error {
	_, err := d.cfg.DB.ExecContext(ctx, `UPDATE jobs SET lease_until = ?
		WHERE id = ? AND version = ? AND status IN ('dispatched','running')`,
		c.row.DispatchedAt.Add(c.wall), c.row.ID, c.row.Version)
	if err != nil {
		return fmt.Errorf("extend the lease of accepted job %d to its wall: %w", c.row.ID, err)
	}
	return nil
}

// recordBatch writes the outcomes of batch in one transaction of three round trips
// (store.ConnTx): one begins it and locks the jobs, one applies the outcomes and writes their
// pokes, one commits.
func (d *Drainer) recordBatch(ctx context.Context, batch []*outcomeReq) error {
	now, err := d.cfg.Clock.Now(ctx)
	if err != nil {
		return err
	}
	tx, err := store.BeginConnTx(ctx, d.cfg.DB)
	if err != nil {
		return fmt.Errorf("begin outcomes: %w", err)
	}
	defer tx.Close()
	ids := make([]int64, len(batch))
	for i, r := range batch {
		ids[i] = r.c.row.ID
	}
	res, err := tx.Query(ctx, []string{"SELECT " + store.LockColumns + " FROM jobs WHERE id IN (" + store.Placeholders(len(ids)) + ") ORDER BY id FOR UPDATE"}, int64Args(ids)...)
	if err != nil {
		return fmt.Errorf("lock dispatched jobs: %w", err)
	}
	current := map[int64]store.Row{}
	err = res.EachRow(func(r store.Row) { current[r.ID] = r })
	if err = errors.Join(err, res.Close()); err != nil {
		return fmt.Errorf("lock dispatched jobs: %w", err)
	}
	var items []store.Finishing
	for _, req := range batch {
		r, ok := current[req.c.row.ID]
		if !ok || r.Version != req.c.row.Version || !r.Status.InFlight() {
			d.cfg.Log.Warn("dispatch outcome ignored: the job moved on", "job_id", req.c.row.ID,
				"claimed_version", req.c.row.Version, "version", r.Version, "status", r.Status)
			continue
		}
		items = append(items, store.Finishing{Row: r, Outcome: d.outcome(now, r, req)})
	}
	if len(items) == 0 {
		return nil
	}
	to, err := d.store.FinishManyConn(ctx, tx, now, items)
	if err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit %d outcome(s): %w", len(items), err)
	}
	for i, it := range items {
		if to[i] == job.Queued {
			d.headCache.invalidate(it.Row.Tenant) // it keeps its place ahead of the cached heads
		}
	}
	for i, it := range items {
		d.store.Metrics.Finished(to[i], it.Row.DispatchedAt, now)
	}
	return nil
}

// outcome maps an executor's answer to the job's next state (the SPEC §8 table).
func (d *Drainer) outcome(now time.Time, r store.Row, req *outcomeReq) store.Outcome {
	ans := req.ans
	// A 429 or a 503 is the executor saying it did not start the job, which holds when starts
	// are not confirmed too (the job is then still dispatched, never running). Only an answer
	// that says nothing (an error, a timeout) needs a confirmation to prove the job never started.
	refusedUnstarted := r.Status != job.Running
	neverStarted := refusedUnstarted && !d.cfg.UnconfirmedStarts
	switch ans.Kind {
	case executor.Done:
		return store.Outcome{Status: job.Status(ans.Status), ErrorCode: ans.ErrorCode, ErrorMessage: ans.ErrorMessage, Result: ans.Result,
			Reported: true}
	case executor.RateLimited:
		if !refusedUnstarted {
			return store.Outcome{Status: job.Failed, ErrorCode: string(job.CodeRateLimited), ErrorMessage: "the executor answered 429 after the start"}
		}
		// The gate holds the job back, so clearing the gate releases it too. Only when the gate
		// could not be written (no store, memcached down, no rate key) does the job get a
		// not-before of its own, so that it at least does not hit the quota again at once. A 429
		// never spends the dispatch budget: an hourly limit must be waited out.
		o := store.Outcome{Status: job.Queued, ErrorCode: string(job.CodeRateLimited),
			ErrorMessage: "the executor answered 429; the rate key is gated"}
		if !req.gated {
			nb := now.Add(time.Duration(min(req.gateRetry, rategate.MaxRetryAfter))*time.Second + rategate.Margin)
			o.NotBefore = &nb
			o.ErrorMessage = "the executor answered 429; the rate key could not be gated, so the job waits on its own"
		}
		return o
	case executor.Refused:
		if !refusedUnstarted {
			return store.Outcome{Status: job.Failed, ErrorCode: "executor_refused", ErrorMessage: "the executor answered 503 after the start"}
		}
		nb := now.Add(refusalDelay(ans.RetryAfter, r.Refusals+1))
		return store.Outcome{Status: job.Queued, NotBefore: &nb, CountRefusal: true, ErrorCode: "executor_refused",
			ErrorMessage: "the executor answered 503"}
	default:
		msg := "the dispatch's outcome is unknown"
		if ans.Err != nil {
			msg = ans.Err.Error()
		}
		if neverStarted {
			return store.Outcome{Status: job.Queued, CountFailure: true, Budget: req.c.budget, ErrorCode: "dispatch_error", ErrorMessage: msg}
		}
		return store.Outcome{Status: job.Lost, ErrorCode: "outcome_unknown", ErrorMessage: msg}
	}
}

// refusalDelay is how long a job refused with 503 for the refusal-th time waits: the executor's
// Retry-After, else 1 s doubling with each refusal up to 60 s (SPEC §8). Refusals, not attempts:
// a job claimed again after 429s or dispatch errors has not been refused more often.
func refusalDelay(retryAfter, refusal int) time.Duration {
	if retryAfter > 0 {
		return time.Duration(retryAfter) * time.Second
	}
	delay := time.Second
	for i := 1; i < refusal && delay < time.Minute; i++ {
		delay *= 2
	}
	return min(delay, time.Minute)
}

// gate extends the gate of r's rate key by retryAfter seconds (clamped to SPEC §5's 1..86,400)
// and reports whether the gate is now in force. A failing gate store is counted, never fatal,
// and logged at debug level only: the store warns of the outage itself, at most once per 15 s
// (SPEC §5), where a line per 429 would flood the log while memcached is down.
func (d *Drainer) gate(ctx context.Context, r store.Row, retryAfter int) bool {
	if d.cfg.Gates == nil || r.RateKeySHA256 == nil {
		return false
	}
	retryAfter = min(max(retryAfter, rategate.MinRetryAfter), rategate.MaxRetryAfter)
	if _, err := d.cfg.Gates.Extend(ctx, *r.RateKeySHA256, retryAfter); err != nil {
		if d.cfg.Metrics != nil {
			d.cfg.Metrics.GateUnavailable.Inc()
		}
		d.cfg.Log.Debug("could not gate rate key; the job waits on its own not-before", "rate_key_sha256", *r.RateKeySHA256, "retry_after", retryAfter, "error", err)
		return false
	}
	return true
}
