package simulate

import (
	"math"
	"sort"
	"time"

	"github.com/sluicehq/sluice/gate/config"
)

// Result is what one simulation saw.
type Result struct {
	Start time.Time `json:"start"`
	End   time.Time `json:"end"` // the last thing that happened
	// Tenants are the figures of each tenant that arrived; Total all of them together.
	Tenants map[string]*TenantResult `json:"tenants"`
	Total   TenantResult             `json:"total"`
	// Utilisation is the units in flight (jobs and counted slots), integrated over the run, as
	// a share of global_in_flight over the same time.
	Utilisation float64 `json:"utilisation"`
	// Depth is the most jobs queued in each period of Options.DepthEvery from Start.
	Depth      []int         `json:"depth"`
	DepthEvery time.Duration `json:"depth_every_ns"`
	DepthMax   int           `json:"depth_max"`

	global float64 // global_in_flight
	busy   float64 // unit-seconds in flight
	last   int     // the depth last sampled
}

// TenantResult are one tenant's figures (or all tenants').
type TenantResult struct {
	Arrivals int `json:"arrivals"` // job admissions asked
	Admitted int `json:"admitted"` // queued (admitted, or shadow-refused and let through)
	Started  int `json:"started"`
	// NeverStarted are admitted jobs still queued when nothing more could happen.
	NeverStarted int `json:"never_started"`
	// Refused counts refusals by "code" or "code:scope" (queue_full:tenant, rate_limited,
	// capacity_exceeded:global, ...).
	Refused      map[string]int `json:"refused,omitempty"`
	Slots        int            `json:"slots"`
	SlotsGranted int            `json:"slots_granted"`
	SlotsRefused map[string]int `json:"slots_refused,omitempty"`
	// Wait is the time from admission to claim, quantiles and the longest, of the jobs admitted:
	// for one that never started, to the end of the run.
	Wait     Quantiles `json:"wait"`
	DepthMax int       `json:"depth_max"`

	waits histogram
}

// Quantiles of a duration, in milliseconds.
type Quantiles struct {
	P50 float64 `json:"p50_ms"`
	P95 float64 `json:"p95_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

func newResult(cfg config.Config, every time.Duration) *Result {
	return &Result{Tenants: map[string]*TenantResult{}, global: float64(cfg.GlobalInFlight), DepthEvery: every}
}

func (r *Result) tenant(t string) *TenantResult {
	tr := r.Tenants[t]
	if tr == nil {
		tr = &TenantResult{}
		r.Tenants[t] = tr
	}
	return tr
}

func refusal(code, scope string) string {
	if scope == "" {
		return code
	}
	return code + ":" + scope
}

func (r *Result) refuse(t, code, scope string) {
	k := refusal(code, scope)
	for _, tr := range []*TenantResult{r.tenant(t), &r.Total} {
		if tr.Refused == nil {
			tr.Refused = map[string]int{}
		}
		tr.Refused[k]++
	}
}

func (r *Result) refuseSlot(t, code, scope string) {
	k := refusal(code, scope)
	for _, tr := range []*TenantResult{r.tenant(t), &r.Total} {
		if tr.SlotsRefused == nil {
			tr.SlotsRefused = map[string]int{}
		}
		tr.SlotsRefused[k]++
	}
}

func (r *Result) started(t string, wait time.Duration) {
	tr := r.tenant(t)
	tr.Started++
	tr.waits.add(wait)
	r.Total.Started++
	r.Total.waits.add(wait)
}

// waited counts the wait of a job that never started, to the end of the run, in the quantiles.
func (r *Result) waited(t string, wait time.Duration) {
	r.tenant(t).waits.add(wait)
	r.Total.waits.add(wait)
}

func (tr *TenantResult) noteDepth(d int) { tr.DepthMax = max(tr.DepthMax, d) }

// sampleDepth notes depth at now in its period, carrying the depth before it through the
// periods in which nothing changed.
func (r *Result) sampleDepth(now time.Time, depth int) {
	if r.DepthEvery <= 0 {
		return
	}
	i := int(now.Sub(r.Start) / r.DepthEvery)
	for len(r.Depth) <= i {
		r.Depth = append(r.Depth, r.last)
	}
	r.Depth[i] = max(r.Depth[i], depth)
	r.last = depth
	r.DepthMax = max(r.DepthMax, depth)
	r.Total.DepthMax = r.DepthMax
}

func (r *Result) finish() {
	if span := r.End.Sub(r.Start).Seconds(); span > 0 && r.global > 0 {
		r.Utilisation = r.busy / (r.global * span)
	}
	for _, tr := range r.Tenants {
		tr.Wait = tr.waits.quantiles()
	}
	r.Total.Wait = r.Total.waits.quantiles()
}

// only is r with the tenants ts alone (the totals stay all tenants').
func (r *Result) only(ts []string) *Result {
	o := *r
	o.Tenants = make(map[string]*TenantResult, len(ts))
	for _, t := range ts {
		if tr, ok := r.Tenants[t]; ok {
			o.Tenants[t] = tr
		}
	}
	return &o
}

// Tops returns the tenants with the most arrivals (then by name), at most n of them (n ≤ 0: all).
func (r *Result) Tops(n int) []string {
	ts := make([]string, 0, len(r.Tenants))
	for t := range r.Tenants {
		ts = append(ts, t)
	}
	sort.Slice(ts, func(i, j int) bool {
		a, b := r.Tenants[ts[i]], r.Tenants[ts[j]]
		if a.Arrivals+a.Slots != b.Arrivals+b.Slots {
			return a.Arrivals+a.Slots > b.Arrivals+b.Slots
		}
		return ts[i] < ts[j]
	})
	if n > 0 && len(ts) > n {
		ts = ts[:n]
	}
	return ts
}

// histogram counts durations in buckets 2 % wide (log-spaced from 1 µs), so that its memory is
// bounded by the range of the waits, not by their number; a quantile is exact to within 2 %. The
// buckets are a slice over the range seen so far.
type histogram struct {
	zero   int   // waits under a microsecond
	lo     int32 // the bucket of counts[0]
	counts []int
	n      int
	max    time.Duration
}

const bucketBase = 1.02

var logBase = math.Log(bucketBase)

func (h *histogram) add(d time.Duration) {
	h.n++
	h.max = max(h.max, d)
	us := float64(d) / float64(time.Microsecond)
	if us < 1 {
		h.zero++
		return
	}
	b := int32(math.Log(us) / logBase)
	switch {
	case len(h.counts) == 0:
		h.lo, h.counts = b, append(h.counts, 0)
	case b < h.lo:
		grown := make([]int, int(h.lo-b)+len(h.counts))
		copy(grown[h.lo-b:], h.counts)
		h.lo, h.counts = b, grown
	case int(b-h.lo) >= len(h.counts):
		h.counts = append(h.counts, make([]int, int(b-h.lo)+1-len(h.counts))...)
	}
	h.counts[b-h.lo]++
}

// quantiles returns the 50th, 95th and 99th percentiles (nearest rank, each a bucket's middle,
// at most the longest wait) and the longest, in milliseconds.
func (h *histogram) quantiles() Quantiles {
	if h.n == 0 {
		return Quantiles{}
	}
	maxMS := float64(h.max) / float64(time.Millisecond)
	at := func(q float64) float64 {
		rank := int(math.Ceil(q * float64(h.n)))
		seen := h.zero
		if rank <= seen {
			return 0
		}
		for i, c := range h.counts {
			if seen += c; seen >= rank {
				us := math.Pow(bucketBase, float64(h.lo)+float64(i)+0.5)
				return min(us/1000, maxMS)
			}
		}
		return maxMS
	}
	return Quantiles{P50: at(0.50), P95: at(0.95), P99: at(0.99), Max: maxMS}
}
