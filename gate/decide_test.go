package gate

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// opt shapes a test item.
type opt func(*item)

func keyed(k string) opt   { return func(it *item) { it.req.IdempotencyKey = &k } }
func by(caller string) opt { return func(it *item) { it.caller = caller } }
func payload(p string) opt {
	return func(it *item) { it.req.Payload = []byte(p); it.fp = it.req.fingerprint() }
}
func gated(seconds int) opt { return func(it *item) { it.gatedFor = seconds } }
func invalid() opt          { return func(it *item) { it.invalid = job.Invalid("tenant", "bad") } }
func redrive(of int64) opt  { return func(it *item) { it.retryOf, it.noRate = &of, true } }
func notQueued() opt        { return func(it *item) { q := false; it.req.Queue = &q } }
func newTestItem(t string, opts ...opt) *item {
	it := &item{req: Request{Tenant: t}, caller: "alpha"}
	it.fp = it.req.fingerprint()
	for _, o := range opts {
		o(it)
	}
	return it
}

// existing is a stored job holding idempotency key k of tenant t for caller, made from the
// request payload p.
func existing(t, k, caller, p string) *store.Row {
	r := Request{Tenant: t, Payload: []byte(p)}
	r.IdempotencyKey = &k
	return &store.Row{Job: job.Job{ID: 7, Tenant: t, Status: job.Running}, Caller: caller,
		RequestSHA256: r.fingerprint()}
}

// outcome is a one-line summary of an item's decision.
func outcome(it *item) string {
	var je *job.Error
	switch {
	case it.invalid != nil:
		return "invalid"
	case errors.As(it.err, &je):
		switch je.Code {
		case job.CodeCapacityExceeded:
			return fmt.Sprintf("%s %v %v paused=%v", je.Code, je.Detail["scope"], je.Detail["retry_after"], je.Detail["paused"])
		case job.CodeRateLimited:
			return fmt.Sprintf("%s %v", je.Code, je.Detail["retry_after"])
		}
		return string(je.Code)
	case it.err != nil:
		return "error " + it.err.Error()
	case it.scope != "":
		return fmt.Sprintf("queue_full %s %q", it.scope, it.res.Decision)
	case it.res.Replayed:
		return fmt.Sprintf("replay %q", it.res.Decision)
	case it.dupOf != nil:
		return "dup"
	case it.insert:
		return fmt.Sprintf("%q pos=%d", it.res.Decision, *it.res.Job.Position)
	}
	return "undecided"
}

func TestDecide(t *testing.T) {
	const wait = 9 // a rate reservation's retry_after
	cases := []struct {
		name   string
		cfg    func(*config.Config)
		st     func(*state)
		items  []*item
		want   []string
		refund map[string]int
		shadow []shadowed
	}{
		{name: "admitted, positions after the tenant's queue",
			st:    func(s *state) { s.tenantDepth["a"] = 4 },
			items: []*item{newTestItem("a"), newTestItem("b")},
			want:  []string{`"admitted" pos=5`, `"admitted" pos=1`}},

		// Idempotent replay.
		{name: "same caller, same request: replay",
			st:    func(s *state) { s.keyed[keyOf("a", "k")] = existing("a", "k", "alpha", "") },
			items: []*item{newTestItem("a", keyed("k"))},
			want:  []string{`replay "admitted"`}},
		{name: "same caller, different request: idempotency_conflict",
			st:    func(s *state) { s.keyed[keyOf("a", "k")] = existing("a", "k", "alpha", `"x"`) },
			items: []*item{newTestItem("a", keyed("k"))},
			want:  []string{"idempotency_conflict"}},
		{name: "another caller: forbidden",
			st:    func(s *state) { s.keyed[keyOf("a", "k")] = existing("a", "k", "beta", "") },
			items: []*item{newTestItem("a", keyed("k"))},
			want:  []string{"forbidden"}},
		{name: "a key twice in one batch: the second repeats the first, or conflicts",
			items: []*item{newTestItem("a", keyed("k")), newTestItem("a", keyed("k")),
				newTestItem("a", keyed("k"), payload(`"x"`)), newTestItem("a", keyed("k"), by("beta"))},
			want: []string{`"admitted" pos=1`, "dup", "idempotency_conflict", "idempotency_conflict"}},
		{name: "a key of another tenant is another key",
			st:    func(s *state) { s.keyed[keyOf("a", "k")] = existing("a", "k", "beta", "") },
			items: []*item{newTestItem("b", keyed("k"))},
			want:  []string{`"admitted" pos=1`}},
		{name: "redrive done before: replay",
			st:    func(s *state) { s.redriven[3] = &store.Row{Job: job.Job{ID: 8, Tenant: "a", Status: job.Queued}} },
			items: []*item{newTestItem("a", redrive(3)), newTestItem("a", redrive(4))},
			want:  []string{`replay "admitted"`, `"admitted" pos=1`}},
		{name: "replay in off mode: no decision header",
			cfg:   func(c *config.Config) { c.AdmissionMode = config.ModeOff },
			st:    func(s *state) { s.keyed[keyOf("a", "k")] = existing("a", "k", "alpha", "") },
			items: []*item{newTestItem("a", keyed("k"))},
			want:  []string{`replay ""`}},

		// Admission rate limit.
		{name: "rate limited beyond the granted units",
			cfg:   func(c *config.Config) { c.AdmissionRatePerMinute = 10 },
			st:    func(s *state) { s.rate["a"] = rateGrant{granted: 1, retryAfter: wait} },
			items: []*item{newTestItem("a"), newTestItem("a"), newTestItem("b")},
			want:  []string{`"admitted" pos=1`, "rate_limited 9", `"admitted" pos=1`}},
		{name: "rate limit in shadow mode: admitted, recorded",
			cfg: func(c *config.Config) {
				c.AdmissionRatePerMinute, c.AdmissionMode = 10, config.ModeShadow
			},
			st:     func(s *state) { s.rate["a"] = rateGrant{granted: 0, retryAfter: wait} },
			items:  []*item{newTestItem("a")},
			want:   []string{`"shadow-refused" pos=1`},
			shadow: []shadowed{{rate: true}}},
		{name: "no reservation (limiter failed): fail open",
			cfg:   func(c *config.Config) { c.AdmissionRatePerMinute = 1 },
			items: []*item{newTestItem("a"), newTestItem("a")},
			want:  []string{`"admitted" pos=1`, `"admitted" pos=2`}},
		{name: "redrive is exempt from the rate limit",
			cfg:   func(c *config.Config) { c.AdmissionRatePerMinute = 1 },
			st:    func(s *state) { s.rate["a"] = rateGrant{granted: 0, retryAfter: wait} },
			items: []*item{newTestItem("a", redrive(3))},
			want:  []string{`"admitted" pos=1`}},

		// Depth caps.
		{name: "queue_full tenant: a rejected row, its rate unit refunded",
			cfg: func(c *config.Config) { c.TenantQueueDepth, c.AdmissionRatePerMinute = 500, 10 },
			st: func(s *state) {
				s.tenantDepth["a"], s.globalDepth = 500, 500
				s.rate["a"] = rateGrant{granted: 1}
			},
			items:  []*item{newTestItem("a")},
			want:   []string{`queue_full tenant "refused"`},
			refund: map[string]int{"a": 1}},
		{name: "queue_full global",
			st:    func(s *state) { s.tenantDepth["a"], s.globalDepth = 3, 2000 },
			items: []*item{newTestItem("a")},
			want:  []string{`queue_full global "refused"`}},
		{name: "depth cap in shadow mode: admitted, recorded",
			cfg:    func(c *config.Config) { c.AdmissionMode = config.ModeShadow },
			st:     func(s *state) { s.tenantDepth["a"], s.globalDepth = 500, 500 },
			items:  []*item{newTestItem("a")},
			want:   []string{`"shadow-refused" pos=501`},
			shadow: []shadowed{{scope: "tenant"}}},
		{name: "off mode: no checks, no decision",
			cfg: func(c *config.Config) {
				c.AdmissionMode, c.AdmissionRatePerMinute, c.GlobalInFlight = config.ModeOff, 1, 0
			},
			st: func(s *state) {
				s.tenantDepth["a"], s.globalDepth = 500, 2000
				s.rate["a"] = rateGrant{granted: 0, retryAfter: wait}
			},
			items: []*item{newTestItem("a", notQueued(), gated(40)), newTestItem("a")},
			want:  []string{`"" pos=501`, `"" pos=502`}},

		// Immediate-or-refuse.
		{name: "queue=false admitted when it could be claimed now",
			items: []*item{newTestItem("a", notQueued())},
			want:  []string{`"admitted" pos=1`}},
		{name: "queue=false behind the tenant's queue: min(30, 5×(ahead+1))",
			st: func(s *state) {
				s.tenantDepth["a"], s.tenantDepth["b"], s.globalDepth = 3, 10, 13
			},
			items: []*item{newTestItem("a", notQueued()), newTestItem("b", notQueued())},
			want:  []string{"capacity_exceeded tenant 20 paused=false", "capacity_exceeded tenant 30 paused=false"}},
		{name: "queue=false with the tenant at its in-flight cap",
			st:    func(s *state) { busy(s, "a", 2) },
			items: []*item{newTestItem("a", notQueued())},
			want:  []string{"capacity_exceeded tenant 5 paused=false"}},
		{name: "queue=false with the global in-flight cap reached",
			st:    func(s *state) { busy(s, "x", 2); busy(s, "y", 2); s.globalDepth = 1 },
			items: []*item{newTestItem("a", notQueued())},
			want:  []string{"capacity_exceeded global 10 paused=false"}},
		{name: "queue=false while a limit is 0: 120 s, paused",
			cfg:   func(c *config.Config) { c.TenantInFlightOverrides = map[string]int{"a": 0} },
			items: []*item{newTestItem("a", notQueued()), newTestItem("b", notQueued())},
			want:  []string{"capacity_exceeded tenant 120 paused=true", `"admitted" pos=1`}},
		{name: "queue=false while the global cap is 0",
			cfg:   func(c *config.Config) { c.GlobalInFlight = 0 },
			items: []*item{newTestItem("a", notQueued())},
			want:  []string{"capacity_exceeded global 120 paused=true"}},
		{name: "queue=false on a gated key: the gate's remaining time, unless another wait is longer",
			st:    func(s *state) { s.tenantDepth["b"], s.globalDepth = 3, 3 },
			items: []*item{newTestItem("a", notQueued(), gated(42)), newTestItem("b", notQueued(), gated(3))},
			want:  []string{"capacity_exceeded rate_key 42 paused=false", "capacity_exceeded tenant 20 paused=false"}},
		{name: "queue=false refused: its rate unit refunded",
			cfg:    func(c *config.Config) { c.AdmissionRatePerMinute = 10 },
			st:     func(s *state) { s.tenantDepth["a"], s.rate["a"] = 1, rateGrant{granted: 2} },
			items:  []*item{newTestItem("a", notQueued()), newTestItem("a")},
			want:   []string{"capacity_exceeded tenant 10 paused=false", `"admitted" pos=2`},
			refund: map[string]int{"a": 1}},
		{name: "queue=false in shadow mode: admitted, recorded",
			cfg:    func(c *config.Config) { c.AdmissionMode = config.ModeShadow },
			st:     func(s *state) { s.tenantDepth["a"] = 2 },
			items:  []*item{newTestItem("a", notQueued())},
			want:   []string{`"shadow-refused" pos=3`},
			shadow: []shadowed{{immediate: true}}},

		// Check order: validation, replay, rate limit, depth caps, immediate.
		{name: "validation comes first: an invalid item is not decided",
			cfg:   func(c *config.Config) { c.AdmissionRatePerMinute = 10 },
			st:    func(s *state) { s.keyed[keyOf("a", "k")] = existing("a", "k", "beta", "") },
			items: []*item{newTestItem("a", keyed("k"), invalid()), newTestItem("a", invalid())},
			want:  []string{"invalid", "invalid"}},
		{name: "replay before the rate limit and the depth cap",
			cfg: func(c *config.Config) { c.AdmissionRatePerMinute = 10 },
			st: func(s *state) {
				s.keyed[keyOf("a", "k")] = existing("a", "k", "alpha", "")
				s.tenantDepth["a"], s.globalDepth = 500, 500
				s.rate["a"] = rateGrant{granted: 0, retryAfter: wait}
			},
			items: []*item{newTestItem("a", keyed("k"))},
			want:  []string{`replay "admitted"`}},
		{name: "rate limit before the depth cap",
			cfg: func(c *config.Config) { c.AdmissionRatePerMinute = 10 },
			st: func(s *state) {
				s.tenantDepth["a"], s.globalDepth = 500, 500
				s.rate["a"] = rateGrant{granted: 0, retryAfter: wait}
			},
			items: []*item{newTestItem("a")},
			want:  []string{"rate_limited 9"}},
		{name: "depth cap before immediate-or-refuse",
			st:    func(s *state) { s.tenantDepth["a"], s.globalDepth = 500, 500 },
			items: []*item{newTestItem("a", notQueued())},
			want:  []string{`queue_full tenant "refused"`}},

		// Items of one transaction count against each other.
		{name: "the tenant cap stays exact within a batch",
			cfg: func(c *config.Config) { c.TenantQueueDepth = 3 },
			st:  func(s *state) { s.tenantDepth["a"], s.globalDepth = 1, 1 },
			items: []*item{newTestItem("a"), newTestItem("b"), newTestItem("a"), newTestItem("a"),
				newTestItem("b")},
			want: []string{`"admitted" pos=2`, `"admitted" pos=1`, `"admitted" pos=3`,
				`queue_full tenant "refused"`, `"admitted" pos=2`}},
		{name: "the global cap within a batch",
			cfg:   func(c *config.Config) { c.GlobalQueueDepth = 2 },
			st:    func(s *state) { s.globalDepth = 1 },
			items: []*item{newTestItem("a"), newTestItem("b")},
			want:  []string{`"admitted" pos=1`, `queue_full global "refused"`}},
		{name: "queue=false jobs of one transaction take each other's free slots",
			st:    func(s *state) { busy(s, "x", 2) },
			items: []*item{newTestItem("a", notQueued()), newTestItem("b", notQueued()), newTestItem("c", notQueued())},
			want:  []string{`"admitted" pos=1`, `"admitted" pos=1`, "capacity_exceeded global 15 paused=false"}},
		{name: "a queued job of the tenant ahead refuses its later queue=false job",
			items: []*item{newTestItem("a"), newTestItem("a", notQueued())},
			want:  []string{`"admitted" pos=1`, "capacity_exceeded tenant 10 paused=false"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := config.Default()
			if c.cfg != nil {
				c.cfg(&cfg)
			}
			st := newState()
			st.rate = map[string]rateGrant{}
			st.now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
			if c.st != nil {
				c.st(st)
			}
			replays(c.items, cfg, st)
			refund := decide(c.items, cfg, st)
			var got []string
			var shadow []shadowed
			for _, it := range c.items {
				got = append(got, outcome(it))
				if it.shadow != (shadowed{}) {
					shadow = append(shadow, it.shadow)
				}
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("decisions\n got %q\nwant %q", got, c.want)
			}
			if !reflect.DeepEqual(refund, c.refund) {
				t.Errorf("refunds %v, want %v", refund, c.refund)
			}
			if !reflect.DeepEqual(shadow, c.shadow) {
				t.Errorf("shadowed %+v, want %+v", shadow, c.shadow)
			}
		})
	}
}

// TestDecideHeaders: an admission's result carries its tenant's cap and in-flight count; a
// rate-limited one too.
func TestDecideHeaders(t *testing.T) {
	cfg := config.Default()
	cfg.TenantInFlightOverrides = map[string]int{"a": 5}
	cfg.AdmissionRatePerMinute = 1
	st := newState()
	st.rate = map[string]rateGrant{}
	st.tenantInFlight["a"] = 3
	st.rate["a"] = rateGrant{granted: 1, retryAfter: 2}
	items := []*item{newTestItem("a"), newTestItem("a")}
	decide(items, cfg, st)
	for i, it := range items {
		if it.res.Limit != 5 || it.res.InFlight != 3 {
			t.Errorf("item %d: limit %d in flight %d, want 5 and 3", i, it.res.Limit, it.res.InFlight)
		}
	}
	if !items[0].reserved || items[1].reserved || items[1].res.Decision != Refused {
		t.Errorf("reserved %v %v, second decision %q", items[0].reserved, items[1].reserved, items[1].res.Decision)
	}
}

// TestRateCharges: one unit per pending item, per tenant in order of first appearance; none for
// replays, invalid items and redrives, nor while the limit or the rollout mode is off.
func TestRateCharges(t *testing.T) {
	cfg := config.Default()
	cfg.AdmissionRatePerMinute = 10
	st := newState()
	st.rate = map[string]rateGrant{}
	st.keyed[keyOf("a", "k")] = existing("a", "k", "alpha", "")
	items := []*item{newTestItem("b"), newTestItem("a", keyed("k")), newTestItem("a"), newTestItem("b"),
		newTestItem("c", invalid()), newTestItem("c", redrive(1)), newTestItem("a")}
	replays(items, cfg, st)
	want := []rateCharge{{"b", 2}, {"a", 2}}
	if got := rateCharges(items, cfg); !reflect.DeepEqual(got, want) {
		t.Errorf("charges %+v, want %+v", got, want)
	}
	for _, mode := range []func(*config.Config){
		func(c *config.Config) { c.AdmissionRatePerMinute = 0 },
		func(c *config.Config) { c.AdmissionMode = config.ModeOff },
	} {
		c := cfg
		mode(&c)
		if got := rateCharges(items, c); got != nil {
			t.Errorf("charges %+v, want none", got)
		}
	}
}

// busy counts n jobs of tenant in flight in s, as the admission read would (default tiers).
func busy(s *state, tenant string, n int) {
	s.usage.Add(config.Default(), config.Unit{Tenant: tenant}, n)
	s.tenantInFlight[tenant] += n
}

// TestLateError: refuse_if_late refuses a start_by at or before the job's due time, or before its
// estimated start: the tenant's queued jobs beyond its free capacity, in waves of its cap, each a
// recent service time long. Without a service time only the due time counts; a paused tenant
// never starts.
func TestLateError(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *string { s := now.Add(d).Format(time.RFC3339Nano); return &s }
	yes := true
	cases := []struct {
		name             string
		runAt, startBy   *string
		depth, inFlight  int
		cap              int
		service          time.Duration
		late             bool
		estimatedSeconds float64 // of a refusal: estimated_start - now
	}{
		{name: "start_by passed", startBy: at(-time.Second), cap: 2, late: true},
		{name: "start_by now", startBy: at(0), cap: 2, late: true},
		{name: "free capacity", startBy: at(time.Second), cap: 2, service: time.Hour},
		{name: "start_by before run_at", runAt: at(time.Hour), startBy: at(time.Minute), cap: 2, late: true, estimatedSeconds: 3600},
		{name: "start_by after run_at", runAt: at(time.Minute), startBy: at(time.Hour), cap: 2},
		// 5 queued, 2 in flight, cap 2: the job is 6th beyond no free unit, three waves of 10 s.
		{name: "behind its queue", startBy: at(25 * time.Second), depth: 5, inFlight: 2, cap: 2, service: 10 * time.Second, late: true, estimatedSeconds: 30},
		{name: "behind its queue, time enough", startBy: at(31 * time.Second), depth: 5, inFlight: 2, cap: 2, service: 10 * time.Second},
		{name: "no service time known", startBy: at(time.Second), depth: 500, inFlight: 2, cap: 2},
		{name: "paused tenant", startBy: at(time.Hour), cap: 0, service: time.Second, late: true, estimatedSeconds: 3600},
	}
	for _, c := range cases {
		cfg := config.Default()
		cfg.TenantInFlight = c.cap
		st := newState()
		st.now = now
		st.tenantDepth["acme"], st.tenantInFlight["acme"] = c.depth, c.inFlight
		it := &item{req: Request{Tenant: "acme", RunAt: c.runAt, StartBy: c.startBy, RefuseIfLate: &yes}, service: c.service}
		err := lateError(it, cfg, st)
		if (err != nil) != c.late {
			t.Errorf("%s: %v; want late %v", c.name, err, c.late)
			continue
		}
		if err == nil {
			continue
		}
		je := err.(*job.Error)
		if je.Code != job.CodeDeadlineUnreachable {
			t.Errorf("%s: code %s", c.name, je.Code)
		}
		if c.estimatedSeconds > 0 {
			est, _ := time.Parse(time.RFC3339Nano, je.Detail["estimated_start"].(string))
			if got := est.Sub(now).Seconds(); got != c.estimatedSeconds {
				t.Errorf("%s: estimated start %v s after now; want %v", c.name, got, c.estimatedSeconds)
			}
		}
	}
}
