package store_test

import (
	"maps"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// TestMetrics checks the job-lifecycle collectors: every terminal state's series exists at zero
// from the start, only terminal states count, execution time is observed only for jobs that were
// dispatched, a second registration on the same registry is an error rather than a panic, and a
// nil *Metrics counts nothing.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := store.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	finished := func() map[string]float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() != "sluice_jobs_finished_total" {
				continue
			}
			for _, c := range mf.GetMetric() {
				out[c.GetLabel()[0].GetValue()] = c.GetCounter().GetValue()
			}
		}
		return out
	}
	want := map[string]float64{"succeeded": 0, "failed": 0, "canceled": 0, "rejected": 0, "lost": 0, "expired": 0, "replaced": 0}
	if got := finished(); !maps.Equal(got, want) {
		t.Errorf("fresh registry: sluice_jobs_finished_total %v, want %v", got, want)
	}

	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	dispatched := now.Add(-1500 * time.Millisecond)
	m.Dispatched(now.Add(-2*time.Second), dispatched)
	m.Finished(job.Succeeded, &dispatched, now)
	m.Finished(job.Lost, &dispatched, now)
	m.Finished(job.Rejected, nil, now)
	m.Finished(job.Queued, &dispatched, now) // a requeue is no end
	m.Finished(job.Running, nil, now)
	want["succeeded"], want["lost"], want["rejected"] = 1, 1, 1
	if got := finished(); !maps.Equal(got, want) {
		t.Errorf("after one of each: sluice_jobs_finished_total %v, want %v", got, want)
	}
	hist := func(name string) (count uint64, sum float64) {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				h := mf.GetMetric()[0].GetHistogram()
				return h.GetSampleCount(), h.GetSampleSum()
			}
		}
		t.Fatalf("%s is not registered", name)
		return 0, 0
	}
	if n, sum := hist("sluice_execution_seconds"); n != 2 || sum != 3 {
		t.Errorf("sluice_execution_seconds: %d observations summing to %v, want 2 summing to 3 (succeeded and lost, 1.5 s each)", n, sum)
	}
	if n, sum := hist("sluice_dispatch_wait_seconds"); n != 1 || sum != 0.5 {
		t.Errorf("sluice_dispatch_wait_seconds: %d observations summing to %v, want 1 of 0.5", n, sum)
	}

	// The same counts, per step, for GET /v1/status: three ends (the requeue and the move to
	// running are none) and one dispatch that waited 0.5 s, in the step of their times.
	var ends, dispatches int
	var p50 *float64
	for _, p := range m.Recent().Series(now.Add(time.Minute)).Points {
		ends, dispatches = ends+p.Finished, dispatches+p.Dispatched
		if p.DispatchWaitP50Seconds != nil {
			p50 = p.DispatchWaitP50Seconds
		}
	}
	if ends != 3 || dispatches != 1 || p50 == nil || *p50 < 0.5/1.5 || *p50 > 0.5*1.5 {
		t.Errorf("recent: %d ends and %d dispatches (median wait %v), want 3 and 1 of about 0.5 s", ends, dispatches, p50)
	}

	if _, err := store.NewMetrics(reg); err == nil {
		t.Error("a second NewMetrics on the same registry succeeded; want an error")
	}
	var none *store.Metrics
	none.Finished(job.Succeeded, &dispatched, now)
	none.Dispatched(dispatched, now)
	if none.Recent() != nil {
		t.Error("a nil *Metrics has a recent window")
	}
}

// TestTerminalStates checks that job.TerminalStates, the label values created at zero, lists
// exactly the states Terminal accepts.
func TestTerminalStates(t *testing.T) {
	all := []job.Status{job.Queued, job.Claimed, job.Dispatched, job.Running, job.Succeeded,
		job.Failed, job.Canceled, job.Rejected, job.Lost, job.Expired}
	listed := map[job.Status]bool{}
	for _, s := range job.TerminalStates() {
		listed[s] = true
	}
	for _, s := range all {
		if s.Terminal() != listed[s] {
			t.Errorf("%s: Terminal() = %v, listed in TerminalStates = %v", s, s.Terminal(), listed[s])
		}
	}
	if len(listed) != len(job.TerminalStates()) {
		t.Errorf("TerminalStates has duplicates: %v", job.TerminalStates())
	}
}
