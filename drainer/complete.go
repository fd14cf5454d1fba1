package drainer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/rategate"
	"github.com/sluicehq/sluice/gate/store"
)

// completer records executors' answers (all but 202, which the dispatcher records itself) on
// the jobs they were dispatched as (SPEC §8), fenced on the claimed version: if recovery or an
// executor's /complete got there first, the write is refused, and record returns nil (the
// dispatcher then lets go of the job, as after any recorded outcome). record blocks until the
// outcome is committed or has failed; it is safe for concurrent use, one call per dispatch
// goroutine. Config.OutcomeBatch chooses the implementation: batchCompleter (the default) or
// inlineCompleter (OutcomeBatch 1).
type completer interface {
	record(ctx context.Context, req *outcomeReq) error
}

// outcomeReq is one dispatch answer waiting to be recorded.
type outcomeReq struct {
	c         claimed
	ans       executor.Answer
	gateRetry int        // the gate the answer asked for, in seconds (0: none)
	gated     bool       // the gate store took that gate
	answered  time.Time  // when the answer arrived (Config.Clock), for store.Outcome.EndedAt
	done      chan error // batchCompleter: the batch writer's answer
	// reclaimed is set, before done is answered, when the pass that wrote the outcome claimed in
	// the same transaction what it freed, or found nothing to claim in it: no pass need be woken
	// for it.
	reclaimed bool
}

// maxOutcomeBatch is Config.OutcomeBatch's default: the outcomes written in one transaction.
const maxOutcomeBatch = 256

// inlineCompleter writes each outcome in a transaction of its own, from the dispatch goroutine
// that got the answer. It owns no state.
type inlineCompleter struct{ w *outcomeWriter }

func (c inlineCompleter) record(ctx context.Context, req *outcomeReq) error {
	return c.w.write(ctx, []*outcomeReq{req})
}

// batchCompleter writes answers arriving together in one transaction (group commit): the first
// caller to find no batch in progress becomes the writer and records everything queued, at most
// max outcomes a transaction, until the queue is empty, so a thousand outcomes do not cost a
// thousand commits. mu guards queue and busy.
type batchCompleter struct {
	write func(ctx context.Context, batch []*outcomeReq) error // outcomeWriter.write
	max   int

	mu    sync.Mutex
	queue []*outcomeReq
	busy  bool // a writer is draining queue
}

func (b *batchCompleter) record(ctx context.Context, req *outcomeReq) error {
	req.done = make(chan error, 1)
	b.mu.Lock()
	b.queue = append(b.queue, req)
	if b.busy {
		b.mu.Unlock()
		return <-req.done
	}
	b.busy = true
	for {
		b.gather()
		batch := b.queue
		if len(batch) > b.max {
			batch = batch[:b.max]
		}
		b.queue = b.queue[len(batch):]
		b.mu.Unlock()
		err := b.write(ctx, batch)
		for _, r := range batch {
			r.done <- err
		}
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.busy = false
			b.mu.Unlock()
			return <-req.done
		}
	}
}

// gather lets the answers that are ready to be queued join the writer's next batch, called with
// mu held by the writer before each batch. A claim starts its dispatches together, and an
// executor that answers at once has them all answered within microseconds: without a yield, the
// first answer's goroutine would commit a batch of one, and the rest would wait for it and
// follow in a second transaction (a commit and its round trips more per claim). It yields to
// the scheduler while the queue grows, and costs one yield when answers trickle in.
func (b *batchCompleter) gather() {
	for n := len(b.queue); n < b.max; n = len(b.queue) {
		b.mu.Unlock()
		runtime.Gosched()
		b.mu.Lock()
		if len(b.queue) == n {
			return
		}
	}
}

// outcomeHandoff carries the batchCompleter's batches to the pass loop while Run schedules
// passes: the next pass writes a batch in its claim's transaction (claimer.claimCandidates), so
// that the capacity the outcomes free is claimed again without a transaction of their own, or on
// its own when the pass claims nothing (Drainer.RunOnce). With a no-op executor and caps of 64 the
// drain is a cycle of one claim and its outcomes, and this halves its transactions. Without Run
// (tests driving passes, Stop's grace) the writer writes its batch itself. One batch waits at
// most: the batchCompleter has one writer.
type outcomeHandoff struct {
	direct func(ctx context.Context, batch []*outcomeReq) error // outcomeWriter.write
	wake   func()
	q      nextPass[*outcomeBatch]
}

// outcomeBatch is a batch of outcomes handed to a pass. Its writer waits on done, which the pass
// answers once, with how the batch's write went (answer).
type outcomeBatch struct {
	reqs     []*outcomeReq
	done     chan error
	answered bool // owned by the pass that took the batch
}

// errNotTaken answers a batch that Run stopped before a pass took it: its writer writes it.
var errNotTaken = errors.New("no pass took the outcomes")

// write is the batchCompleter's write: it hands batch to the next pass and waits for its answer,
// or writes it itself when no pass is coming.
func (h *outcomeHandoff) write(ctx context.Context, batch []*outcomeReq) error {
	b := &outcomeBatch{reqs: batch, done: make(chan error, 1)}
	if !h.q.add(b, 1) {
		return h.direct(ctx, batch)
	}
	h.wake()
	if err := <-b.done; !errors.Is(err, errNotTaken) {
		return err
	}
	return h.direct(ctx, batch)
}

// take returns the batch waiting for a pass, or nil. The pass must answer it.
func (h *outcomeHandoff) take() *outcomeBatch {
	if h == nil {
		return nil
	}
	if bs := h.q.take(); len(bs) > 0 {
		return bs[0]
	}
	return nil
}

// setRunning records whether Run schedules passes; when it stops, a batch still waiting goes
// back to its writer.
func (h *outcomeHandoff) setRunning(on bool) {
	if h == nil {
		return
	}
	for _, b := range h.q.setRunning(on) {
		b.answer(errNotTaken, false)
	}
}

// size is how many outcomes b holds (0 for nil).
func (b *outcomeBatch) size() int {
	if b == nil {
		return 0
	}
	return len(b.reqs)
}

// pending reports whether b is a batch still to answer.
func (b *outcomeBatch) pending() bool { return b != nil && !b.answered }

// answer tells b's writer how its write went, and whether the pass that wrote it claimed what it
// freed (outcomeReq.reclaimed); only the first answer counts.
func (b *outcomeBatch) answer(err error, reclaimed bool) {
	if b.pending() {
		b.answered = true
		for _, r := range b.reqs {
			r.reclaimed = reclaimed
		}
		b.done <- err
	}
}

// outcomeWriter writes a batch of outcomes in one transaction, for either completer. It owns no
// state: it reads the Drainer's Config and drops from heads the tenants of jobs it requeues.
type outcomeWriter struct {
	cfg   *Config
	store *store.Store
	heads *headCache
}

// write writes the outcomes of batch in one transaction of two round trips (store.ConnTx): one
// begins it and locks the jobs, one applies the outcomes of the jobs still as claimed, writes
// their pokes and commits.
func (w *outcomeWriter) write(ctx context.Context, batch []*outcomeReq) error {
	now, err := w.cfg.Clock.Now(ctx)
	if err != nil {
		return err
	}
	tx, err := store.BeginConnTx(ctx, w.cfg.TxDB)
	if err != nil {
		return fmt.Errorf("begin outcomes: %w", err)
	}
	defer tx.Close()
	locked, err := store.LockJobs(ctx, tx, batchIDs(batch))
	if err != nil {
		return err
	}
	items := w.settle(now, batch, locked)
	if len(items) == 0 {
		return nil
	}
	return w.finish(ctx, tx, now, items)
}

// batchIDs are the ids of batch's jobs.
func batchIDs(batch []*outcomeReq) []int64 {
	ids := make([]int64, len(batch))
	for i, r := range batch {
		ids[i] = r.c.row.ID
	}
	return ids
}

// settle returns the outcomes to write for batch, given its jobs as locked (read under a lock
// that holds until the commit): those of the jobs still as claimed. The others moved on (recovery,
// a /complete or a cancel got there first), and are logged and left.
func (w *outcomeWriter) settle(now time.Time, batch []*outcomeReq, locked []store.Row) []store.Finishing {
	current := make(map[int64]int, len(locked)) // index in locked
	for i, r := range locked {
		current[r.ID] = i
	}
	items := make([]store.Finishing, 0, len(batch))
	for _, req := range batch {
		var r store.Row
		i, ok := current[req.c.row.ID]
		if ok {
			r = locked[i]
		}
		if !ok || r.Version != req.c.row.Version || !r.Status.InFlight() {
			w.cfg.Log.Warn("dispatch outcome ignored: the job moved on", "job_id", req.c.row.ID,
				"claimed_version", req.c.row.Version, "version", r.Version, "status", r.Status)
			continue
		}
		items = append(items, store.Finishing{Row: r, Outcome: w.outcome(now, r, req)})
	}
	return items
}

// finish writes items, settled on rows locked in tx, and commits, in one round trip
// (store.FinishManyCommit), then acts on what it wrote (written).
func (w *outcomeWriter) finish(ctx context.Context, tx *store.ConnTx, now time.Time, items []store.Finishing) error {
	to, err := w.store.FinishManyCommit(ctx, tx, now, items)
	if err != nil {
		return fmt.Errorf("write and commit %d outcome(s): %w", len(items), err)
	}
	w.written(now, items, to)
	return nil
}

// written acts on outcomes committed: each job's metrics, the heads cache loses the tenants
// of jobs requeued, and the jobs are announced (Config.Ended).
func (w *outcomeWriter) written(now time.Time, items []store.Finishing, to []job.Status) {
	if w.cfg.Ended != nil && len(items) > 0 {
		ids := make([]int64, len(items))
		for i, it := range items {
			ids[i] = it.Row.ID
		}
		w.cfg.Ended(ids)
	}
	for i, it := range items {
		if to[i] == job.Queued {
			w.heads.invalidate(it.Row.Tenant) // it keeps its place ahead of the cached heads
		}
	}
	for i, it := range items {
		w.store.Metrics.Finished(to[i], it.Row.DispatchedAt, now)
	}
}

// outcome maps an executor's answer to the job's next state (the SPEC §8 table).
func (w *outcomeWriter) outcome(now time.Time, r store.Row, req *outcomeReq) store.Outcome {
	ans := req.ans
	// A 429 or a 503 is the executor saying it did not start the job, which holds when starts
	// are not confirmed too (the job is then still dispatched, never running). Only an answer
	// that says nothing (an error, a timeout) needs a confirmation to prove the job never started.
	refusedUnstarted := r.Status != job.Running
	neverStarted := refusedUnstarted && !w.cfg.UnconfirmedStarts
	switch ans.Kind {
	case executor.Done:
		return store.Outcome{Status: job.Status(ans.Status), ErrorCode: ans.ErrorCode, ErrorMessage: ans.ErrorMessage, Result: ans.Result,
			Reported: true, EndedAt: req.answered}
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
