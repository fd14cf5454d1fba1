package opsmetrics_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/gate/opsmetrics"
	"github.com/sluicehq/sluice/gate/status"
	"github.com/sluicehq/sluice/integration/wait"
)

type fakeReader struct {
	st  status.Status
	err error
}

func (f fakeReader) Read(context.Context) (status.Status, error) { return f.st, f.err }
func (f fakeReader) Local(context.Context) status.Status {
	return status.Status{Broker: status.Broker{Connected: true}, Config: status.ConfigRef{Version: 7, Stale: true}}
}

func collect(t *testing.T, r opsmetrics.Reader, top int) string {
	t.Helper()
	return collectWith(t, opsmetrics.Config{Status: r, TopTenants: top})
}

func collectWith(t *testing.T, cfg opsmetrics.Config) string {
	t.Helper()
	c, err := opsmetrics.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := ""
			for _, l := range m.GetLabel() {
				labels += fmt.Sprintf("%s=%q", l.GetName(), l.GetValue())
			}
			fmt.Fprintf(&b, "%s{%s} %g\n", mf.GetName(), labels, m.GetGauge().GetValue())
		}
	}
	return b.String()
}

// TestTopTenants: only the TopTenants deepest tenants get series; the rest are summed (depth, in
// flight) or maxed (oldest age) under "other", which always exists.
func TestTopTenants(t *testing.T) {
	t.Parallel()
	st := status.Status{Queue: status.Queue{Depth: 10}, Tenants: []status.Tenant{ // deepest first, as Read returns
		{Tenant: "a", Depth: 5, InFlight: 1, OldestAgeSeconds: 9},
		{Tenant: "b", Depth: 3, InFlight: 2, OldestAgeSeconds: 4},
		{Tenant: "c", Depth: 1, InFlight: 2, OldestAgeSeconds: 30},
		{Tenant: "d", Depth: 1, InFlight: 0, OldestAgeSeconds: 2},
	}, Drainers: []status.Drainer{{State: status.Stalled}, {State: status.Active}, {State: status.Stalled}}}
	out := collect(t, fakeReader{st: st}, 2)
	for _, want := range []string{
		`sluice_tenant_queue_depth{tenant="a"} 5`, `sluice_tenant_queue_depth{tenant="b"} 3`,
		`sluice_tenant_queue_depth{tenant="other"} 2`, `sluice_tenant_in_flight{tenant="other"} 2`,
		`sluice_tenant_queue_oldest_age_seconds{tenant="other"} 30`, `sluice_queue_depth{} 10`,
		`sluice_drainers{state="stalled"} 2`, `sluice_drainers{state="idle"} 0`, `sluice_status_read_success{} 1`,
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("missing %s in\n%s", want, out)
		}
	}
	if strings.Contains(out, `tenant="c"`) {
		t.Errorf("tenant c beyond the top 2 has its own series:\n%s", out)
	}
	if n := strings.Count(collect(t, fakeReader{st: st}, 20), "sluice_tenant_queue_depth{"); n != 5 {
		t.Errorf("%d depth series with room for 20, want 4 tenants + other", n)
	}
}

// TestNoTenantLabels: with tenant labels off (SLUICE_METRICS_TENANT_LABELS=false) no tenant
// name appears in a label; every tenant is summed under "other".
func TestNoTenantLabels(t *testing.T) {
	t.Parallel()
	st := status.Status{Queue: status.Queue{Depth: 8}, Tenants: []status.Tenant{
		{Tenant: "a", Depth: 5, InFlight: 1, OldestAgeSeconds: 9},
		{Tenant: "b", Depth: 3, InFlight: 2, OldestAgeSeconds: 4},
	}}
	out := collectWith(t, opsmetrics.Config{Status: fakeReader{st: st}, NoTenantLabels: true})
	for _, want := range []string{`sluice_tenant_queue_depth{tenant="other"} 8`, `sluice_tenant_in_flight{tenant="other"} 3`} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("missing %s in\n%s", want, out)
		}
	}
	if strings.Contains(out, `tenant="a"`) || strings.Contains(out, `tenant="b"`) {
		t.Errorf("a tenant name is a label with tenant labels off:\n%s", out)
	}
}

// TestReadFailure: a failed read exports success 0 and the process-local gauges only, never
// stale database figures.
func TestReadFailure(t *testing.T) {
	t.Parallel()
	out := collect(t, fakeReader{err: errors.New("database down")}, 20)
	for _, want := range []string{`sluice_status_read_success{} 0`, `sluice_broker_connected{} 1`, `sluice_config_version{} 7`, `sluice_config_stale{} 1`} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("missing %s in\n%s", want, out)
		}
	}
	if strings.Contains(out, "sluice_queue_depth") {
		t.Errorf("queue depth exported although the read failed:\n%s", out)
	}
}

// TestRegisterLeavesOwnedMetrics: where another component already exports a figure (the gate
// store's sluice_gated_keys, the relay's outbox backlog), Register leaves it to that component
// and exports the rest.
func TestRegisterLeavesOwnedMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_gated_keys", Help: "the gate store's"}, func() float64 { return 3 }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_outbox_unpublished", Help: "the relay's"}, func() float64 { return 9 }))
	full, err := opsmetrics.New(opsmetrics.Config{Status: fakeReader{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Register(full); err == nil {
		t.Fatal("a second sluice_gated_keys registered without error")
	}
	_, omitted, err := opsmetrics.Register(reg, opsmetrics.Config{Status: fakeReader{st: status.Status{Queue: status.Queue{Depth: 4}}}})
	if err != nil {
		t.Fatalf("Register: %v", err)
	}
	slices.Sort(omitted)
	if !slices.Equal(omitted, []string{"sluice_gated_keys", "sluice_outbox_unpublished"}) {
		t.Errorf("omitted %v, want the two owned elsewhere", omitted)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if m := mf.GetMetric(); len(m) == 1 {
			got[mf.GetName()] = m[0].GetGauge().GetValue()
		}
	}
	if got["sluice_gated_keys"] != 3 || got["sluice_outbox_unpublished"] != 9 || got["sluice_queue_depth"] != 4 {
		t.Errorf("gathered %v: want the owners' gated keys (3) and outbox (9) beside this queue depth (4)", got)
	}
}

// countingReader counts reads; each read waits for release (if set) after signalling started.
type countingReader struct {
	mu      sync.Mutex
	reads   int
	started chan struct{}
	release chan struct{}
	st      status.Status
	err     error
}

func (f *countingReader) Read(ctx context.Context) (status.Status, error) {
	f.mu.Lock()
	f.reads++
	f.mu.Unlock()
	if f.started != nil {
		select {
		case f.started <- struct{}{}:
		default: // a later read: only the first is waited for
		}
	}
	if f.release != nil {
		select {
		case <-f.release:
		case <-ctx.Done():
			return status.Status{}, ctx.Err()
		}
	}
	return f.st, f.err
}

func (f *countingReader) Local(context.Context) status.Status { return status.Status{} }

func (f *countingReader) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads
}

func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Error(err)
		return nil
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if m := mf.GetMetric(); len(m) == 1 {
			got[mf.GetName()] = m[0].GetGauge().GetValue()
		}
	}
	return got
}

// TestConcurrentScrapesShareOneRead: scrapes that arrive while a read runs get its result
// instead of reading again, so N concurrent scrapes cost one status read.
func TestConcurrentScrapesShareOneRead(t *testing.T) {
	t.Parallel()
	r := &countingReader{started: make(chan struct{}, 1), release: make(chan struct{}),
		st: status.Status{Queue: status.Queue{Depth: 5}}}
	c, err := opsmetrics.New(opsmetrics.Config{Status: r})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	const n = 8
	var wg sync.WaitGroup
	depths := make([]float64, n)
	scrape := func(i int) {
		defer wg.Done()
		depths[i] = gather(t, reg)["sluice_queue_depth"]
	}
	wg.Add(n)
	go scrape(0)
	<-r.started // the first scrape's read is in progress and blocked
	for i := 1; i < n; i++ {
		go scrape(i)
	}
	// Released once every later scrape waits for that read, or has started one of its own.
	wait.Until(t, 10*time.Second, "every scrape to wait or read", func() bool {
		return opsmetrics.Waiting(c)+r.count()-1 == n-1
	})
	close(r.release)
	wg.Wait()
	if got := r.count(); got != 1 {
		t.Errorf("%d concurrent scrapes issued %d status reads, want 1", n, got)
	}
	for i, d := range depths {
		if d != 5 {
			t.Errorf("scrape %d saw queue depth %g, want 5", i, d)
		}
	}
}

// TestScrapeCache: a scrape within CacheFor of a successful read reuses it; one after reads
// again; a failed read is never reused.
func TestScrapeCache(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	r := &countingReader{st: status.Status{Queue: status.Queue{Depth: 3}}}
	c, err := opsmetrics.New(opsmetrics.Config{Status: r, CacheFor: 2 * time.Second, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	for _, step := range []struct {
		advance time.Duration
		reads   int
	}{{0, 1}, {0, 1}, {1999 * time.Millisecond, 1}, {time.Millisecond, 2}, {time.Second, 2}} {
		advance(step.advance)
		if got := gather(t, reg)["sluice_queue_depth"]; got != 3 {
			t.Errorf("depth %g, want 3", got)
		}
		if got := r.count(); got != step.reads {
			t.Errorf("after +%v: %d reads, want %d", step.advance, got, step.reads)
		}
	}
	f := &countingReader{err: errors.New("database down")}
	c, err = opsmetrics.New(opsmetrics.Config{Status: f, CacheFor: time.Hour, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	reg = prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	gather(t, reg)
	if got := gather(t, reg)["sluice_status_read_success"]; got != 0 || f.count() != 2 {
		t.Errorf("after two scrapes of a failing read: success %g, %d reads; want 0 and 2 (failures not cached)", got, f.count())
	}
}

// TestOtherFromTotals: with the status listing only some tenants, "other" is the queue's total
// less the top tenants, and its oldest age is the queue's oldest when no top tenant holds it.
func TestOtherFromTotals(t *testing.T) {
	t.Parallel()
	st := status.Status{Queue: status.Queue{Depth: 1000, OldestAgeSeconds: 50}, InFlight: 9, Tenants: []status.Tenant{
		{Tenant: "a", Depth: 400, InFlight: 2, OldestAgeSeconds: 10},
		{Tenant: "b", Depth: 100, InFlight: 3, OldestAgeSeconds: 20},
		{Tenant: "c", Depth: 50, InFlight: 1, OldestAgeSeconds: 5},
	}}
	out := collect(t, fakeReader{st: st}, 2)
	for _, want := range []string{`sluice_tenant_queue_depth{tenant="other"} 500`, `sluice_tenant_in_flight{tenant="other"} 4`,
		`sluice_tenant_queue_oldest_age_seconds{tenant="other"} 50`} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("missing %s in\n%s", want, out)
		}
	}
	st.Tenants[0].OldestAgeSeconds = 50 // the oldest job is a's
	out = collect(t, fakeReader{st: st}, 2)
	if want := `sluice_tenant_queue_oldest_age_seconds{tenant="other"} 5`; !strings.Contains(out, want+"\n") {
		t.Errorf("missing %s in\n%s", want, out)
	}
}
