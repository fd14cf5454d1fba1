package store_test

import (
	"testing"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// TestStates: the waiters' backstop read answers each existing job's status and version, and
// leaves out an id that is no job.
func TestStates(t *testing.T) {
	t.Parallel()
	k := newFixture(t)
	queued := k.insert(jobSpec{})
	running := k.insert(jobSpec{status: job.Running, version: 2})
	ended := k.insert(jobSpec{status: job.Succeeded, version: 3})
	got, err := store.States(k.ctx, k.db, []int64{queued, running, ended, ended + 1000})
	if err != nil {
		t.Fatal(err)
	}
	want := map[int64]store.JobState{
		queued:  {Status: job.Queued, Version: 0},
		running: {Status: job.Running, Version: 2},
		ended:   {Status: job.Succeeded, Version: 3},
	}
	if len(got) != len(want) {
		t.Fatalf("States = %v; want %v", got, want)
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("job %d: %+v; want %+v", id, got[id], w)
		}
	}
	if got, err := store.States(k.ctx, k.db, nil); err != nil || len(got) != 0 {
		t.Fatalf("States(nil) = %v, %v; want empty", got, err)
	}
}
