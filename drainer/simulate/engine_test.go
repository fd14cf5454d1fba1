package simulate

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
)

var t0 = time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)

func configFrom(t testing.TB, changes string) config.Config {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(changes), &m); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Apply(config.Default(), m)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func jobAt(ms int, tenant string, serviceMS int) Arrival {
	return Arrival{At: t0.Add(time.Duration(ms) * time.Millisecond), Kind: Job, Tenant: tenant, Priority: job.DefaultPriority,
		Service: time.Duration(serviceMS) * time.Millisecond}
}

// replay runs arrivals through one Engine, checking after each that nothing in flight exceeds a
// cap, and returns its result.
func replay(t *testing.T, cfg config.Config, arrivals []Arrival) *Result {
	t.Helper()
	e := New(cfg, Options{})
	for _, a := range arrivals {
		e.Arrive(a)
		if e.us.Total > cfg.GlobalInFlight {
			t.Fatalf("at %s: %d in flight past global_in_flight %d", a.At, e.us.Total, cfg.GlobalInFlight)
		}
		for tn, n := range e.us.Tenant {
			if n > cfg.TenantCap(tn) {
				t.Fatalf("at %s: tenant %s has %d in flight past its cap %d", a.At, tn, n, cfg.TenantCap(tn))
			}
		}
	}
	return e.Finish()
}

func TestFIFOWithinCaps(t *testing.T) {
	cfg := configFrom(t, `{"global_in_flight": 2, "tenant_in_flight": 2}`)
	r := replay(t, cfg, []Arrival{jobAt(0, "a", 100), jobAt(0, "a", 100), jobAt(0, "a", 100), jobAt(50, "a", 100)})
	a := r.Tenants["a"]
	if a.Started != 4 || a.Admitted != 4 || r.Total.NeverStarted != 0 {
		t.Fatalf("started %d admitted %d never %d, want 4 4 0", a.Started, a.Admitted, r.Total.NeverStarted)
	}
	// Two start at once; the third at 100 ms, the fourth (admitted at 50) at 100 ms too.
	if a.Wait.Max < 99 || a.Wait.Max > 101 {
		t.Fatalf("longest wait %.1f ms, want 100", a.Wait.Max)
	}
	if !r.End.Equal(t0.Add(200 * time.Millisecond)) {
		t.Fatalf("ended at %s, want 200 ms after the start", r.End.Sub(t0))
	}
	// Two units busy for 200 ms of a 200 ms run: all of the box.
	if r.Utilisation < 0.99 || r.Utilisation > 1.01 {
		t.Fatalf("utilisation %.3f, want 1", r.Utilisation)
	}
}

// A burst from one tenant holds the box; lowering that tenant's cap leaves room for the other,
// whose waits fall while the burst's grow.
func TestLoweringATenantCapShiftsWaits(t *testing.T) {
	var arrivals []Arrival
	for range 40 {
		arrivals = append(arrivals, jobAt(0, "burst", 100))
	}
	for i := range 20 {
		arrivals = append(arrivals, jobAt(10+50*i, "steady", 20))
	}
	cur := configFrom(t, `{"global_in_flight": 4, "tenant_in_flight": 4}`)
	cmp, err := Run(context.Background(), ptr(Slice(arrivals)), cur, map[string]json.RawMessage{"tenant_in_flight_overrides": json.RawMessage(`{"burst": 2}`)}, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*Result{cmp.Current, cmp.Changed} {
		if r.Total.Started != 60 {
			t.Fatalf("started %d of 60", r.Total.Started)
		}
	}
	sc, sn := cmp.Current.Tenants["steady"].Wait, cmp.Changed.Tenants["steady"].Wait
	bc, bn := cmp.Current.Tenants["burst"].Wait, cmp.Changed.Tenants["burst"].Wait
	if !(sn.P95 < sc.P95) || sn.Max != 0 {
		t.Fatalf("steady's p95 wait %.1f → %.1f ms (max %.1f): want it lower, and none once the burst holds 2 of 4", sc.P95, sn.P95, sn.Max)
	}
	if !(bn.P95 > bc.P95) {
		t.Fatalf("burst's p95 wait %.1f → %.1f ms: want it higher at half the units", bc.P95, bn.P95)
	}
	shifts := cmp.Shifts()
	if len(shifts) != 2 || shifts[0].Tenant != "steady" || shifts[1].Tenant != "burst" {
		t.Fatalf("shifts %+v: want steady gaining, burst losing", shifts)
	}
	var out strings.Builder
	if err := cmp.WriteTable(&out, 10); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"changes: tenant_in_flight_overrides={\"burst\": 2}", "gain: steady", "lose: burst", "executor utilisation"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func ptr[T any](v T) *T { return &v }

func TestDepthCapsRateLimitAndImmediate(t *testing.T) {
	cfg := configFrom(t, `{"global_in_flight": 1, "tenant_in_flight": 1, "tenant_queue_depth": 2, "admission_rate_per_minute": 3}`)
	var arrivals []Arrival
	for range 5 {
		// One instant, as one batch: the rate limit takes 3 units of 5 first (2 refused
		// rate_limited), then the depth cap refuses the third of those (its unit given back).
		arrivals = append(arrivals, jobAt(0, "a", 1000))
	}
	imm := jobAt(10, "b", 10)
	imm.Immediate = true // the box is full: refused at once
	// At 1.5 s both of a's have started: room in its queue, and the refused one gave its rate
	// unit back, so the third unit of the minute is granted, and the fourth is not.
	arrivals = append(arrivals, imm, jobAt(1500, "a", 1000), jobAt(1600, "a", 10), jobAt(61_000, "a", 10))
	r := replay(t, cfg, arrivals)
	a := r.Tenants["a"]
	want := map[string]int{"queue_full:tenant": 1, "rate_limited": 3}
	if fmt.Sprint(a.Refused) != fmt.Sprint(want) {
		t.Fatalf("a's refusals %v, want %v", a.Refused, want)
	}
	if got := r.Tenants["b"].Refused; fmt.Sprint(got) != fmt.Sprint(map[string]int{"capacity_exceeded:global": 1}) {
		t.Fatalf("b's refusals %v, want capacity_exceeded:global once", got)
	}
	if a.Arrivals != 8 || a.Admitted != 4 || a.Started != 4 {
		t.Fatalf("a: %d arrivals, %d admitted, %d started; want 8, 4, 4", a.Arrivals, a.Admitted, a.Started)
	}
	if a.DepthMax != 2 {
		t.Fatalf("a's deepest queue %d, want its depth cap, 2", a.DepthMax)
	}
}

// startOrder runs e to its end and returns the ids of its jobs in the order they ended: with one
// unit in the box, the order they started.
func startOrder(e *Engine) []int64 {
	e.decideBatch()
	var order []int64
	for len(e.events) > 0 {
		ev := e.events[0]
		if ev.job != nil && ev.job.runAt.IsZero() {
			order = append(order, ev.job.head.ID)
		}
		e.advance(ev.at.Add(time.Nanosecond), false)
	}
	return order
}

func TestPriorityAndInteractiveOrderATenantsQueue(t *testing.T) {
	cfg := configFrom(t, `{"global_in_flight": 1, "tenant_in_flight": 1, "priority_aging_seconds": 300}`)
	first := jobAt(0, "a", 100)
	low := jobAt(1, "a", 100)
	low.Priority = 1
	plain := jobAt(2, "a", 100)
	high := jobAt(3, "a", 100)
	high.Priority = 9
	inter := jobAt(4, "a", 100)
	inter.Interactive = true
	e := New(cfg, Options{})
	for _, a := range []Arrival{first, low, plain, high, inter} {
		e.Arrive(a)
	}
	order := startOrder(e)
	// ids in arrival order: first 1, low 2, plain 3, high 4, interactive 5.
	if fmt.Sprint(order) != "[1 5 4 3 2]" {
		t.Fatalf("started in order %v, want [1 5 4 3 2]: interactive, then priority 9, 5, 1", order)
	}
}

func TestAgedJobGoesAsIfTop(t *testing.T) {
	cfg := configFrom(t, `{"global_in_flight": 1, "tenant_in_flight": 1, "priority_aging_seconds": 1}`)
	low := jobAt(1, "a", 10)
	low.Priority = 0
	e := New(cfg, Options{})
	for _, a := range []Arrival{jobAt(0, "a", 2000), low, jobAt(1500, "a", 10)} {
		e.Arrive(a)
	}
	// At 2 s the low job (id 2) has waited past the 1 s aging and goes before the default one (3).
	if order := startOrder(e); fmt.Sprint(order) != "[1 2 3]" {
		t.Fatalf("started in order %v, want [1 2 3]: the aged low-priority job first", order)
	}
}

func TestSlotsHoldUnits(t *testing.T) {
	cfg := configFrom(t, `{"global_in_flight": 2, "tenant_in_flight": 2}`)
	held := Arrival{At: t0, Kind: Slot, ID: "s1", Tenant: "a"}
	timed := Arrival{At: t0, Kind: Slot, Tenant: "a", Service: 50 * time.Millisecond}
	refused := Arrival{At: t0.Add(time.Millisecond), Kind: Slot, Tenant: "a", Service: time.Second, Aware: true}
	arrivals := []Arrival{held, timed, refused, jobAt(2, "b", 10), {At: t0.Add(200 * time.Millisecond), Kind: SlotEnd, ID: "s1"},
		jobAt(201, "b", 10)}
	r := replay(t, cfg, arrivals)
	if a := r.Tenants["a"]; a.SlotsGranted != 2 || fmt.Sprint(a.SlotsRefused) != "map[capacity_exceeded:global:1]" {
		t.Fatalf("slots granted %d refused %v, want 2 granted and one refused at the global cap", a.SlotsGranted, a.SlotsRefused)
	}
	// b's first job waits for the timed slot (50 ms); its second finds the box empty.
	if b := r.Tenants["b"]; b.Wait.Max < 47 || b.Wait.Max > 49 {
		t.Fatalf("b's longest wait %.1f ms, want 48", b.Wait.Max)
	}
}

// A scheduled job is queued at its due time, as production writes its queued_at: its wait counts
// from then, and it goes behind the jobs queued before then.
func TestScheduledJobWaitsForItsTime(t *testing.T) {
	cfg := configFrom(t, `{"global_in_flight": 4, "tenant_in_flight": 4}`)
	later := jobAt(0, "a", 10)
	later.RunAt = t0.Add(time.Second)
	r := replay(t, cfg, []Arrival{later, jobAt(10, "a", 10)})
	if a := r.Tenants["a"]; a.Started != 2 || a.Wait.Max != 0 || !r.End.Equal(t0.Add(1010*time.Millisecond)) {
		t.Fatalf("started %d, longest wait %.1f ms, ended %s after the start: want the scheduled job started at its run_at, 1 s",
			a.Started, a.Wait.Max, r.End.Sub(t0))
	}

	cfg = configFrom(t, `{"global_in_flight": 1, "tenant_in_flight": 1}`)
	e := New(cfg, Options{})
	scheduled := jobAt(0, "a", 10)
	scheduled.RunAt = t0.Add(500 * time.Millisecond)
	for _, a := range []Arrival{jobAt(0, "a", 2000), scheduled, jobAt(100, "a", 10)} {
		e.Arrive(a)
	}
	// ids: the long job 1, the scheduled one 2 (due at 500 ms), the one queued at 100 ms 3.
	if order := startOrder(e); fmt.Sprint(order) != "[1 3 2]" {
		t.Fatalf("started in order %v, want [1 3 2]: the job queued at 100 ms before the one due at 500 ms", order)
	}
}

// A claim sees an admission's jobs ArrivalPickup after its clock reading (its commit and poke),
// not before: a pass that an outcome brings sooner finds them not there.
func TestAdmittedJobsUnseenUntilPickedUp(t *testing.T) {
	cfg := configFrom(t, `{"global_in_flight": 1, "tenant_in_flight": 1}`)
	e := New(cfg, Options{ArrivalPickup: 20 * time.Millisecond, OutcomePickup: time.Millisecond})
	// a: seen at 20 ms, runs to 30, its outcome's pass at 31; b: admitted at 25, seen at 45.
	e.Arrive(jobAt(0, "a", 10))
	e.Arrive(jobAt(25, "b", 10))
	r := e.Finish()
	if a, b := r.Tenants["a"], r.Tenants["b"]; a.Wait.Max != 20 || b.Wait.Max != 20 || !r.End.Equal(t0.Add(56*time.Millisecond)) {
		t.Fatalf("a waited %.1f ms, b %.1f ms, the run ended %s after the start: want 20, 20 (not 6: b started by the "+
			"pass a's outcome brought at 31 ms, before its admission was seen) and 56 ms (b's outcome's pass)", a.Wait.Max, b.Wait.Max, r.End.Sub(t0))
	}
}

func TestPausedTenantNeverStarts(t *testing.T) {
	cfg := configFrom(t, `{"tenant_in_flight_overrides": {"a": 0}}`)
	r := replay(t, cfg, []Arrival{jobAt(0, "a", 10), jobAt(0, "b", 10)})
	if r.Total.NeverStarted != 1 || r.Tenants["a"].NeverStarted != 1 || r.Tenants["b"].Started != 1 {
		t.Fatalf("never started %d (a %d), b started %d: want a's job left queued", r.Total.NeverStarted, r.Tenants["a"].NeverStarted, r.Tenants["b"].Started)
	}
}

func TestRunRefusesBadInput(t *testing.T) {
	one := Slice{jobAt(0, "a", 1)}
	if _, err := Run(context.Background(), &one, config.Default(), map[string]json.RawMessage{"tenant_capz": json.RawMessage(`3`)}, Options{}, nil); err == nil ||
		!strings.Contains(err.Error(), "tenant_capz") || !strings.Contains(err.Error(), "unknown key") {
		t.Fatalf("an unknown key: %v, want an error naming it", err)
	}
	if _, err := Run(context.Background(), &one, config.Default(), map[string]json.RawMessage{"global_in_flight": json.RawMessage(`"many"`)}, Options{}, nil); err == nil ||
		!strings.Contains(err.Error(), "global_in_flight") {
		t.Fatalf("a bad value: %v, want an error naming the key", err)
	}
	var none Slice
	if _, err := Run(context.Background(), &none, config.Default(), nil, Options{}, nil); !errors.Is(err, ErrNoArrivals) {
		t.Fatalf("no arrivals: %v, want ErrNoArrivals", err)
	}
}

func TestLines(t *testing.T) {
	in := `{"at": 0, "tenant": "a", "service_ms": 100}

{"at": "2026-12-06T10:00:01Z", "tenant": "b", "lanes": ["gpu", "gpu"], "priority": 9, "queue": false, "interactive": true, "service_ms": 5}
{"at": 2, "kind": "slot", "id": "s", "tenant": "a"}
{"at": 3, "kind": "slot_end", "id": "s"}
`
	src := Lines(strings.NewReader(in), t0)
	var got []Arrival
	for {
		a, err := src.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, a)
	}
	if len(got) != 4 {
		t.Fatalf("read %d arrivals, want 4", len(got))
	}
	if a := got[0]; !a.At.Equal(t0) || a.Kind != Job || a.Service != 100*time.Millisecond || a.Priority != job.DefaultPriority {
		t.Fatalf("first: %+v", a)
	}
	if b := got[1]; !b.At.Equal(t0.Add(time.Second)) || fmt.Sprint(b.Lanes) != "[gpu]" || b.Priority != 9 || !b.Immediate || !b.Interactive {
		t.Fatalf("second: %+v", b)
	}
	if got[2].Kind != Slot || got[3].Kind != SlotEnd || got[3].ID != "s" {
		t.Fatalf("slot lines: %+v %+v", got[2], got[3])
	}
}

func TestLinesNameTheProblem(t *testing.T) {
	for in, want := range map[string]string{
		`{"at": 0}`:                                                  "line 1: tenant: required",
		`{"tenant": "a"}`:                                            "line 1: at: required",
		`{"at": "yesterday", "tenant": "a"}`:                         "line 1: at: want an RFC 3339 time",
		`{"at": 0, "tenant": "a", "priority": 10}`:                   "line 1: priority: want 0 to 9, got 10",
		`{"at": 0, "tenant": "a", "service_ms": -1}`:                 "line 1: service_ms: want milliseconds ≥ 0",
		`{"at": 0, "tenant": "a", "service_ms": 1, "colour": "red"}`: `line 1: not a JSON object of the arrivals format: json: unknown field "colour"`,
		`{"at": 0, "tenant": "a", "kind": "batch"}`:                  `line 1: kind: want job, slot or slot_end, got "batch"`,
		`{"at": 0, "kind": "slot", "tenant": "a"}`:                   "line 1: hold_ms: required for a slot without an id",
		`{"at": 0, "kind": "slot_end"}`:                              "line 1: id: required for a slot_end",
		"{\"at\": 5, \"tenant\": \"a\", \"service_ms\": 1}\n{\"at\": 1, \"tenant\": \"a\", \"service_ms\": 1}": "line 2: at 2026-12-06T10:00:01Z is before the line above",
		`[1, 2]`: "line 1: not a JSON object",
	} {
		src := Lines(strings.NewReader(in), t0)
		var err error
		for err == nil {
			_, err = src.Next()
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", in, err, want)
		}
	}
}

// The engine keeps what is in the system, not what passed through it.
func TestMemoryBoundedByJobsInTheSystem(t *testing.T) {
	cfg := configFrom(t, `{"global_in_flight": 64, "tenant_in_flight": 8}`)
	e := New(cfg, Options{})
	rng := rand.New(rand.NewPCG(1, 2))
	peak := 0
	at := t0
	for i := range 200_000 {
		at = at.Add(time.Duration(rng.ExpFloat64() * float64(10*time.Millisecond)))
		e.Arrive(Arrival{At: at, Kind: Job, Tenant: fmt.Sprintf("t%d", i%50), Priority: job.DefaultPriority,
			Service: time.Duration(rng.ExpFloat64() * float64(200*time.Millisecond))})
		inSystem := e.depth + e.us.Total
		peak = max(peak, inSystem)
		if len(e.events) > inSystem+1 || len(e.tenants) > 50 || cap(e.committing.js) > 2*peak+2048 {
			t.Fatalf("after %d arrivals: %d events, %d tenants and room for %d committing jobs kept for %d jobs in the system",
				i, len(e.events), len(e.tenants), cap(e.committing.js), inSystem)
		}
		for _, q := range e.tenants {
			for p := range q.fifos[0] {
				if f := q.fifos[0][p]; cap(f.js) > 2*peak+64 {
					t.Fatalf("a tenant queue holds %d slots for at most %d jobs in the system", cap(f.js), peak)
				}
			}
		}
	}
	r := e.Finish()
	if r.Total.Started != 200_000 || len(e.tenants) != 0 || len(e.events) != 0 {
		t.Fatalf("started %d, %d tenants and %d events left", r.Total.Started, len(e.tenants), len(e.events))
	}
}

// Quantiles come from 2 %-wide buckets: within 2 % of the exact nearest rank, whatever the
// order the waits came in.
func TestHistogramQuantiles(t *testing.T) {
	var h histogram
	for _, i := range rand.New(rand.NewPCG(3, 4)).Perm(1000) {
		h.add(time.Duration(i+1) * time.Millisecond)
	}
	for _, i := range []int{0, 0, 0} {
		h.add(time.Duration(i)) // three under a microsecond
	}
	q := h.quantiles()
	near := func(got, want float64) bool { return math.Abs(got-want) <= 0.02*want }
	// 1,003 waits: the 50th percentile is the 502nd, 499 ms; the 95th the 953rd, 950 ms; the
	// 99th the 993rd, 990 ms.
	if !near(q.P50, 499) || !near(q.P95, 950) || !near(q.P99, 990) || q.Max != 1000 {
		t.Fatalf("quantiles %+v, want about 499, 950, 990 and 1000 ms", q)
	}
	var zeros histogram
	zeros.add(0)
	if q := zeros.quantiles(); q != (Quantiles{}) {
		t.Fatalf("one zero wait: %+v, want all zero", q)
	}
}

// The pickups are measured as their definitions say: a job dispatched with no outcome since
// its admission measures the one after an arrival, a job that waited past an outcome the one
// after an outcome; means, which a skewed sample sets apart from medians; the defaults without
// samples.
func TestEstimatePickups(t *testing.T) {
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	done := func(n int) sql.NullTime { return sql.NullTime{Time: ms(n), Valid: true} }
	runs := []ran{
		{queued: ms(0), dispatched: ms(4), finished: done(100)},         // arrival: 4 ms
		{queued: ms(10), dispatched: ms(16), finished: done(200)},       // arrival: 6 ms
		{queued: ms(20), dispatched: ms(34), finished: done(300)},       // arrival: 14 ms
		{queued: ms(50), dispatched: ms(102), finished: done(400)},      // waited past 100: 2 ms
		{queued: ms(60), dispatched: ms(206), finished: done(500)},      // waited past 200: 6 ms
		{queued: ms(70), dispatched: ms(301), finished: sql.NullTime{}}, // waited past 300: 1 ms
		{queued: ms(75), dispatched: ms(301), finished: done(405)},      // the same pass: 1 ms
		// Two outcomes since the pass before (at 301): the pass came 10 ms after the first, at
		// 400, which the one at 405 joined; not 5 ms after the last.
		{queued: ms(80), dispatched: ms(410), finished: sql.NullTime{}},
		// Its outcomes all came before the pass before its own (at 410), which did not take it,
		// or with it (the one at 410 below: that pass saw it): no outcome brought its pass, and
		// it measures neither pickup.
		{queued: ms(85), dispatched: ms(420), finished: sql.NullTime{}},
		{queued: ms(1), dispatched: ms(9), finished: done(410)}, // arrival: 8 ms
	}
	arrival, outcome, ok := estimatePickups(runs)
	if !ok || arrival != 8*time.Millisecond || outcome != 4*time.Millisecond {
		t.Fatalf("pickups %s after an arrival, %s after an outcome (ok %v), want 8ms and 4ms", arrival, outcome, ok)
	}
	if a, o, ok := estimatePickups(nil); ok || a != DefaultArrivalPickup || o != DefaultOutcomePickup {
		t.Fatalf("no runs: %s, %s, %v; want the defaults and not ok", a, o, ok)
	}
}
