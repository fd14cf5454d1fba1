package drainer_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/drainertest"
)

// TestOutcomeCompleters records the same answers through both completers, the batched one (the
// default) and the inline one (OutcomeBatch 1): every job ends in the state its answer gave, and
// the Observer hears each claim before the answer to it.
func TestOutcomeCompleters(t *testing.T) {
	for _, batch := range []int{0, 1} {
		t.Run(fmt.Sprintf("OutcomeBatch=%d", batch), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, clk, now := drainertest.NewDB(t, func(c *config.Config) { c.GlobalInFlight, c.TenantInFlight = 8, 8 })
			var ids []int64
			for range 6 {
				ids = append(ids, drainertest.QueueOneJob(t, db, now))
			}
			want := map[int64]string{}
			for i, id := range ids {
				want[id] = []string{"succeeded", "failed"}[i%2]
			}
			var mu sync.Mutex
			var claimed []int64
			recorded := make(chan int64, len(ids))
			s := &answerByJob{status: want}
			d := drainertest.NewDrainer(t, drainer.Config{DB: db.DB, Executor: s, Clock: clk, ID: "completers",
				OutcomeBatch: batch, Observer: drainer.ObserverFuncs{
					OnClaimed: func(got []int64) {
						mu.Lock()
						defer mu.Unlock()
						claimed = append(claimed, got...)
					},
					OnRecorded: func(id int64) {
						mu.Lock()
						seen := slices.Contains(claimed, id)
						mu.Unlock()
						if !seen {
							t.Errorf("job %d recorded before the Observer heard of its claim", id)
						}
						recorded <- id
					},
				}}, 10*time.Second)
			if p, err := d.RunOnce(ctx); err != nil || p.Claimed != len(ids) {
				t.Fatalf("pass: %+v, %v; want %d claimed", p, err, len(ids))
			}
			drainertest.AwaitRecorded(t, recorded, len(ids))
			for _, id := range ids {
				if got := drainertest.ReadJob(t, db.DB, id).Status; got != want[id] {
					t.Errorf("job %d is %s, want %s", id, got, want[id])
				}
			}
		})
	}
}

// answerByJob answers each dispatch with the terminal status it maps the job to.
type answerByJob struct{ status map[int64]string }

func (s *answerByJob) Send(_ context.Context, d executor.Dispatch) executor.Answer {
	return executor.Answer{Kind: executor.Done, Status: s.status[d.JobID]}
}
