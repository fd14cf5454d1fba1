package drainer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/gate/rategate"
	"github.com/sluicehq/sluice/gate/store"
)

// dispatcher sends claimed jobs to the executor, one goroutine each, and deals with the answers:
// it gates the rate key an answer asks for, records a 202 itself (leaseToWall) and hands every
// other answer to the completer, then lets go of the job (leases.release) and wakes a pass when
// a slot was freed. The pass calls start; Stop calls wait and cancel. RunOnce is one dispatch,
// synchronously. It owns the dispatch goroutines, the context they run under and the count of
// answers outstanding; all of it is safe for concurrent use without a lock.
type dispatcher struct {
	cfg      *Config
	leases   *leaseKeeper
	complete completer
	wake     func()
	// timed reports whether answers are stamped with their arrival (store.Outcome.EndedAt): only
	// fair_time charges by it, so the other orderings read no clock per answer. Nil: never.
	timed func() bool

	work       context.Context // dispatches run under it; canceled by cancel (Stop, after the grace)
	cancelWork context.CancelFunc
	running    sync.WaitGroup
	// unanswered counts the dispatches sent whose answer has not yet been recorded and acted on
	// (asynchronous executors' jobs leave it at the 202). Bar the moment between an outcome's
	// commit and its decrement, which is followed by a wake, those jobs are in flight in the
	// database whatever else is; when they alone fill the global cap no claim can start anything
	// (see claimer.RunOnce).
	unanswered atomic.Int64
}

func newDispatcher(cfg *Config, leases *leaseKeeper, complete completer, wake func()) *dispatcher {
	work, cancel := context.WithCancel(context.Background())
	return &dispatcher{cfg: cfg, leases: leases, complete: complete, wake: wake, work: work, cancelWork: cancel}
}

// start sends c to the executor in a goroutine owned by the dispatcher and records the answer.
// The job is already committed as dispatched: nothing is sent before that commit.
func (s *dispatcher) start(c claimed) {
	s.running.Add(1)
	s.unanswered.Add(1)
	go func() {
		defer s.running.Done()
		s.answer(c)
	}()
}

// RunOnce sends c and deals with the answer, as start's goroutine does, and returns when done.
func (s *dispatcher) RunOnce(c claimed) {
	s.unanswered.Add(1)
	s.answer(c)
}

// answer sends c, records the answer and lets go of the job; it ends one unanswered dispatch.
func (s *dispatcher) answer(c claimed) {
	ctx, cancel := context.WithTimeout(s.work, c.wall)
	defer cancel()
	deadline := *c.row.DispatchedAt
	deadline = deadline.Add(c.wall)
	ans := s.cfg.Executor.Send(ctx, executor.Dispatch{
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
	reclaimed, err := s.recordRetrying(rctx, c, ans)
	if err != nil {
		s.cfg.Log.Error("recording dispatch outcome failed; the lease will recover the job", "job_id", c.row.ID, "error", err)
	}
	// A recorded outcome ends this drainer's hold on the job, and so does a recorded 202,
	// whose lease now runs to the wall; an unrecorded answer stops the renewal, so that
	// recovery takes the job when its lease runs out.
	s.leases.release(c)
	freed := err == nil && ans.Kind != executor.Accepted
	s.unanswered.Add(-1) // before the wake, so that the pass it starts counts the slot free
	if freed && !reclaimed {
		s.wake() // capacity freed: claim the next job now, not at the next poll
	}
	if s.cfg.Observer != nil {
		s.cfg.Observer.Recorded(c.row.ID)
	}
}

// wait waits for the dispatches under way to be answered and recorded, up to ctx's end; then it
// cancels the rest (their answers are recorded as unknown outcomes) and waits for their records.
func (s *dispatcher) wait(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		s.running.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		s.cancelWork()
		<-done
	}
}

// cancel cancels every dispatch still under way. Idempotent.
func (s *dispatcher) cancel() { s.cancelWork() }

// record applies an executor's answer, whose gate gateAnswer took (gateRetry, gated), to the job
// it was dispatched as (SPEC §8): a 202 here (leaseToWall), anything else through the completer.
// reclaimed reports that the pass that wrote the outcome claimed what it freed
// (outcomeReq.reclaimed).
func (s *dispatcher) record(ctx context.Context, c claimed, ans executor.Answer, gateRetry int, gated bool) (reclaimed bool, err error) {
	if ans.Kind == executor.Accepted {
		return false, s.leaseToWall(ctx, c)
	}
	req := &outcomeReq{c: c, ans: ans, gateRetry: gateRetry, gated: gated}
	if s.timed != nil && s.timed() {
		req.answered, _ = s.cfg.Clock.Now(ctx) // unknown (zero): the write's time is charged
	}
	err = s.complete.record(ctx, req)
	return req.reclaimed, err
}

// recordRetrying records ans (record), retrying failed attempts (a database restart, a
// dropped connection) with backoff until ctx ends (RunOnce gives it 30 s). An outcome
// that is never recorded is left to lease recovery, which cannot know it and so marks a started
// job lost; retrying carries a job through a database outage shorter than its lease (10 s by
// default) to its real outcome. Retrying is safe: every attempt is fenced on the claimed
// version, so an attempt whose COMMIT did land makes the next one a no-op ("moved on").
func (s *dispatcher) recordRetrying(ctx context.Context, c claimed, ans executor.Answer) (reclaimed bool, err error) {
	gateRetry, gated := s.gateAnswer(ctx, c, ans)
	wait := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		reclaimed, err := s.record(ctx, c, ans, gateRetry, gated)
		if err == nil {
			if attempt > 1 {
				s.cfg.Log.Info("dispatch outcome recorded after retries", "job_id", c.row.ID, "attempts", attempt)
			}
			return reclaimed, nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, err
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}

// gateAnswer gates the rate key of c's job when ans carries a gate (any answer, 202 included) or
// is a 429, and returns the gate's retry (0 for none) and whether it is in force. It runs once an
// answer, before the outcome is written and outside any transaction: the key's other jobs must
// stop being claimed whatever happens to this one, and a retried write must not push the gate
// later than now + R + 5 s from the answer (SPEC §5).
func (s *dispatcher) gateAnswer(ctx context.Context, c claimed, ans executor.Answer) (gateRetry int, gated bool) {
	if ans.Gate != nil {
		gateRetry = ans.Gate.RetryAfter
	}
	if ans.Kind == executor.RateLimited {
		// SPEC §8: a 429 always gates; without a usable Retry-After the shortest gate is used.
		gateRetry = max(gateRetry, ans.RetryAfter, 1)
	}
	if gateRetry > 0 {
		gated = s.gate(ctx, c.row, gateRetry)
	}
	return gateRetry, gated
}

// leaseToWall records a 202: the executor has the job and will report through /complete, to
// any API process, so the job must not depend on this drainer living on (SPEC §8: it stays
// dispatched or running until complete or wall). Its lease runs to the wall at once; recovery
// takes it only then, and this drainer stops renewing it. Fenced: if the job moved on (an early
// /complete), there is nothing to hold.
func (s *dispatcher) leaseToWall(ctx context.Context, c claimed) error {
	_, err := store.LeaseToWall(ctx, s.cfg.DB, store.LeaseToWallParams{
		Job: store.JobVersion{ID: c.row.ID, Version: c.row.Version}, Wall: c.row.DispatchedAt.Add(c.wall)})
	return err
}

// gate extends the gate of r's rate key by retryAfter seconds (clamped to SPEC §5's 1..86,400)
// and reports whether the gate is now in force. A failing gate store is counted, never fatal,
// and logged at debug level only: the store warns of the outage itself, at most once per 15 s
// (SPEC §5), where a line per 429 would flood the log while memcached is down.
func (s *dispatcher) gate(ctx context.Context, r store.Row, retryAfter int) bool {
	if s.cfg.RateGates == nil || r.RateKeySHA256 == nil {
		return false
	}
	retryAfter = min(max(retryAfter, rategate.MinRetryAfter), rategate.MaxRetryAfter)
	if _, err := s.cfg.RateGates.Extend(ctx, *r.RateKeySHA256, retryAfter); err != nil {
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.GateUnavailable.Inc()
		}
		s.cfg.Log.Debug("could not gate rate key; the job waits on its own not-before", "rate_key_sha256", *r.RateKeySHA256, "retry_after", retryAfter, "error", err)
		return false
	}
	return true
}
