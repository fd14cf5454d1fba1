package drainer

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer/executor"
)

// fakeCompleter keeps what it is asked to record.
type fakeCompleter struct{ got []*outcomeReq }

func (f *fakeCompleter) record(_ context.Context, req *outcomeReq) error {
	f.got = append(f.got, req)
	return nil
}

// answering answers every dispatch with ans.
type answering struct{ ans executor.Answer }

func (a answering) Send(context.Context, executor.Dispatch) executor.Answer { return a.ans }

// TestDispatcherRunOnce drives one dispatch without goroutines: the answer goes to the
// completer with the gate it asked for, the job is let go, a pass is woken for the freed slot
// and the Observer hears of it.
func TestDispatcherRunOnce(t *testing.T) {
	cases := []struct {
		ans       executor.Answer
		gateRetry int
	}{
		{executor.Answer{Kind: executor.Done, Status: "succeeded"}, 0},
		// Without a gate store a 429 is not gated; the outcome then sets the job's own not-before.
		{executor.Answer{Kind: executor.RateLimited}, 1},
	}
	for _, c := range cases {
		var recorded []int64
		cfg := &Config{Executor: answering{c.ans}, Log: slog.New(slog.DiscardHandler),
			Observer: ObserverFuncs{OnRecorded: func(id int64) { recorded = append(recorded, id) }}}
		leases := &leaseKeeper{cfg: cfg, config: &configView{}, held: map[int64]int64{}}
		fc := &fakeCompleter{}
		woken := 0
		s := newDispatcher(cfg, leases, fc, func() { woken++ })
		at := time.Now()
		job := claimed{wall: time.Minute}
		job.row.ID, job.row.Version, job.row.DispatchedAt = 7, 2, &at
		leases.hold([]claimed{job})

		s.RunOnce(job)

		if len(fc.got) != 1 || fc.got[0].c.row.ID != 7 || fc.got[0].ans.Kind != c.ans.Kind ||
			fc.got[0].gateRetry != c.gateRetry || fc.got[0].gated {
			t.Errorf("%v: completer got %+v", c.ans.Kind, fc.got)
		}
		if n := leases.count(); n != 0 {
			t.Errorf("%v: %d job(s) still held after the answer", c.ans.Kind, n)
		}
		if woken != 1 || s.unanswered.Load() != 0 || len(recorded) != 1 || recorded[0] != 7 {
			t.Errorf("%v: woken %d, unanswered %d, recorded %v; want 1, 0, [7]", c.ans.Kind, woken, s.unanswered.Load(), recorded)
		}
	}
}
