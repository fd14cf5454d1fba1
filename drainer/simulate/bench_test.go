package simulate

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/job"
)

// traffic is a Source of synthetic arrivals: rate a second on average, from tenants of uneven
// weight (tenant i arrives i+1 times as often as tenant 0), a burst of 50 jobs from one tenant
// every minute, service times exponential about mean, a twentieth of jobs interactive and a
// twentieth at priority 9. It makes them as they are read: a day of them is never held at once.
type traffic struct {
	rng     *rand.Rand
	at      time.Time
	end     time.Time
	rate    float64
	mean    time.Duration
	tenants []string
	weights int
	burst   int // arrivals left in the current burst
	burster string
	next    time.Time // the next burst
}

func newTraffic(span time.Duration, rate float64, tenants int, mean time.Duration) *traffic {
	tr := &traffic{rng: rand.New(rand.NewPCG(7, 11)), at: t0, end: t0.Add(span), rate: rate, mean: mean, next: t0.Add(time.Minute)}
	for i := range tenants {
		tr.tenants = append(tr.tenants, fmt.Sprintf("tenant-%03d", i))
		tr.weights += i + 1
	}
	return tr
}

func (tr *traffic) Next() (Arrival, error) {
	if tr.burst == 0 {
		tr.at = tr.at.Add(time.Duration(tr.rng.ExpFloat64() / tr.rate * float64(time.Second)))
		if !tr.at.Before(tr.next) {
			tr.at, tr.next = tr.next, tr.next.Add(time.Minute)
			tr.burst, tr.burster = 50, tr.tenants[tr.rng.IntN(len(tr.tenants))]
		}
	}
	if !tr.at.Before(tr.end) {
		return Arrival{}, io.EOF
	}
	a := Arrival{At: tr.at, Kind: Job, Priority: job.DefaultPriority,
		Service: time.Duration(tr.rng.ExpFloat64() * float64(tr.mean))}
	if tr.burst > 0 {
		tr.burst--
		a.Tenant = tr.burster
		return a, nil
	}
	w := tr.rng.IntN(tr.weights)
	for i := range tr.tenants {
		if w -= i + 1; w < 0 {
			a.Tenant = tr.tenants[i]
			break
		}
	}
	switch r := tr.rng.IntN(20); {
	case r == 0:
		a.Interactive = true
	case r == 1:
		a.Priority = 9
	}
	return a, nil
}

// BenchmarkSimulateDay replays a day at 100 jobs/s (8.72 M arrivals with the bursts, 200 tenants, a burst a
// minute, mean service 300 ms against global_in_flight 64) under a configuration and a change,
// both in one reading of the arrivals and with the default pickup delays, as `sluice simulate`
// does. Issue 35 asks for a day in
// under a minute on one core, in memory bounded by the jobs in the system at once.
//
//	go test ./drainer/simulate -run '^$' -bench SimulateDay -benchtime 1x -cpu 1
func BenchmarkSimulateDay(b *testing.B) {
	cfg := configFrom(b, `{"global_in_flight": 64, "tenant_in_flight": 8, "ordering": "fair"}`)
	changes := map[string]json.RawMessage{"tenant_in_flight": json.RawMessage(`4`)}
	for b.Loop() {
		src := newTraffic(24*time.Hour, 100, 200, 300*time.Millisecond)
		var peak uint64
		cmp, err := Run(context.Background(), src, cfg, changes, Options{ArrivalPickup: DefaultArrivalPickup, OutcomePickup: DefaultOutcomePickup}, func(int) {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
		})
		if err != nil {
			b.Fatal(err)
		}
		n := cmp.Current.Total.Arrivals
		b.ReportMetric(float64(n), "arrivals")
		b.ReportMetric(b.Elapsed().Seconds()/float64(max(b.N, 1)), "s/day")
		b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
		b.ReportMetric(100*cmp.Current.Utilisation, "util-%")
	}
}
