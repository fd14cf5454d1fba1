package integration_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/integration/harness"
)

// BenchmarkSoak runs a whole sluice (API, relay and drainer, with the simulated executor) for
// SLUICE_SOAK (a Go duration; default 10m) under steady honest admissions, and in every other
// tenth of that time adds a hostile share on the same listener: clients that trickle request
// bodies and headers, a flood of bad tokens, oversized batches, and scrapes of /metrics,
// /v1/status, /v1/tenants and 1,000-job listings. It reports the honest admissions' latency
// (p50, p99, max) in the calm windows and in the hostile ones of the same run, their ratio, the
// honest refusals in each (there should be none), and what the hostile clients sent and got.
// Run: SLUICE_SOAK=30s go test -run '^$' -bench Soak -benchtime 1x ./integration/
func BenchmarkSoak(b *testing.B) {
	total := 10 * time.Minute
	if v := os.Getenv("SLUICE_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 10*time.Second {
			b.Fatalf("SLUICE_SOAK=%q: want a Go duration of at least 10s", v)
		}
		total = d
	}
	env := harness.Start(b, harness.Options{})
	// Room for the honest rate: the drain keeps up, so no honest admission meets a cap.
	if r := env.Do(b, http.MethodPatch, "/v1/config", harness.AdminToken, map[string]any{"changes": map[string]any{
		"global_in_flight": 64, "tenant_in_flight": 8, "tenant_queue_depth": 5000, "global_queue_depth": 50000}}); r.Status != http.StatusOK {
		b.Fatalf("config: HTTP %d %s", r.Status, r.Raw)
	}
	for range b.N {
		s := newSoak(env)
		const windows = 10
		window := total / windows
		for w := range windows {
			storm := w%2 == 1
			ctx, cancel := context.WithTimeout(context.Background(), window)
			var wg sync.WaitGroup
			s.honest(ctx, &wg, storm)
			if storm {
				s.hostile(ctx, &wg)
			}
			wg.Wait()
			cancel()
		}
		calm, stormy := s.lat[0], s.lat[1]
		calmP, stormP := harness.Percentiles(calm, 50, 99, 100), harness.Percentiles(stormy, 50, 99, 100)
		ratio := 0.0
		if calmP[1] > 0 {
			ratio = benchRound3(stormP[1] / calmP[1])
		}
		hostile := map[string]any{}
		for kind, c := range s.sent {
			hostile[kind] = map[string]any{"sent": c.sent.Load(), "answers": c.statuses(), "errors": c.errs.Load()}
		}
		harness.Emit("soak", map[string]any{"duration_s": total.Seconds(), "windows": windows,
			"calm_admissions": len(calm), "calm_p50_ms": calmP[0], "calm_p99_ms": calmP[1], "calm_max_ms": calmP[2],
			"calm_refused":       s.refused[0].Load(),
			"hostile_admissions": len(stormy), "hostile_p50_ms": stormP[0], "hostile_p99_ms": stormP[1], "hostile_max_ms": stormP[2],
			"hostile_refused": s.refused[1].Load(), "p99_ratio": ratio, "hostile": hostile})
	}
}

// soak is BenchmarkSoak's traffic and what it measured. lat and refused are indexed by window
// kind: 0 calm, 1 hostile.
type soak struct {
	env     *harness.Env
	addr    string
	mu      sync.Mutex
	lat     [2][]time.Duration
	refused [2]atomic.Int64
	sent    map[string]*soakCount
	big     []byte // an oversized batch body
}

// soakCount counts one kind of hostile request and its answers.
type soakCount struct {
	sent, errs atomic.Int64
	mu         sync.Mutex
	byStatus   map[int]int
}

func (c *soakCount) answered(status int) {
	c.mu.Lock()
	c.byStatus[status]++
	c.mu.Unlock()
}

func (c *soakCount) statuses() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for s, n := range c.byStatus {
		out[fmt.Sprint(s)] = n
	}
	return out
}

func newSoak(env *harness.Env) *soak {
	s := &soak{env: env, addr: strings.TrimPrefix(env.URL, "http://"), sent: map[string]*soakCount{}}
	for _, k := range []string{"slow_body", "slow_headers", "bad_token", "oversized_batch", "scrape"} {
		s.sent[k] = &soakCount{byStatus: map[int]int{}}
	}
	// 33 MiB: one more than a batch may carry.
	s.big = append([]byte(`{"jobs":[`), bytes.Repeat([]byte(`{"tenant":"hostile"},`), 33<<20/21+1)...)
	s.big = append(s.big[:len(s.big)-1], "]}"...)
	return s
}

// honest runs four producers admitting single jobs over 16 tenants, each every 20 ms, until ctx
// ends, and records each admission's latency under the window's kind.
func (s *soak) honest(ctx context.Context, wg *sync.WaitGroup, storm bool) {
	kind := 0
	if storm {
		kind = 1
	}
	for g := range 4 {
		wg.Go(func() {
			hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 2}}
			defer hc.CloseIdleConnections()
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for n := 0; ; n++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				body := fmt.Sprintf(`{"tenant":"honest-%02d","payload":{"n":%d}}`, (g+4*n)%16, n)
				start := time.Now()
				status, err := soakPost(hc, s.env.URL+"/v1/jobs", harness.ProducerToken, []byte(body))
				d := time.Since(start)
				if err != nil || status != http.StatusAccepted {
					s.refused[kind].Add(1)
					continue
				}
				s.mu.Lock()
				s.lat[kind] = append(s.lat[kind], d)
				s.mu.Unlock()
			}
		})
	}
}

// hostile runs the hostile share until ctx ends.
func (s *soak) hostile(ctx context.Context, wg *sync.WaitGroup) {
	// 48 clients that send their headers and then a byte of body every 500 ms.
	for range 48 {
		wg.Go(func() { s.trickle(ctx, "slow_body") })
	}
	// 16 that send their headers a line a second.
	for range 16 {
		wg.Go(func() { s.trickle(ctx, "slow_headers") })
	}
	// 4 that admit with bad tokens as fast as they are answered.
	for g := range 4 {
		wg.Go(func() {
			hc := &http.Client{Timeout: 30 * time.Second}
			defer hc.CloseIdleConnections()
			for n := 0; ctx.Err() == nil; n++ {
				s.count("bad_token", func() (int, error) {
					return soakPost(hc, s.env.URL+"/v1/jobs", fmt.Sprintf("bad-token-%d-%d-0123456789abcdef0123456789", g, n),
						[]byte(`{"tenant":"hostile"}`))
				})
			}
		})
	}
	// 2 that post 33 MiB batches.
	for range 2 {
		wg.Go(func() {
			hc := &http.Client{Timeout: 30 * time.Second}
			defer hc.CloseIdleConnections()
			for ctx.Err() == nil {
				s.count("oversized_batch", func() (int, error) {
					return soakPost(hc, s.env.URL+"/v1/jobs:batch", harness.ProducerToken, s.big)
				})
			}
		})
	}
	// 8 scrapers of the reads anyone or an admin can ask for.
	paths := []struct{ path, token string }{{"/metrics", ""}, {"/v1/status", harness.AdminToken},
		{"/v1/tenants?limit=1000", harness.AdminToken}, {"/v1/jobs?limit=1000", harness.ProducerToken}}
	for g := range 8 {
		wg.Go(func() {
			hc := &http.Client{Timeout: 30 * time.Second}
			defer hc.CloseIdleConnections()
			for n := g; ctx.Err() == nil; n++ {
				p := paths[n%len(paths)]
				s.count("scrape", func() (int, error) { return soakGet(hc, s.env.URL+p.path, p.token) })
			}
		})
	}
}

// count sends one hostile request of kind through send and counts it and its answer.
func (s *soak) count(kind string, send func() (int, error)) {
	c := s.sent[kind]
	c.sent.Add(1)
	status, err := send()
	if err != nil {
		c.errs.Add(1)
		return
	}
	c.answered(status)
}

// trickle holds one connection open, sending a request slowly (kind slow_body: the headers,
// then a byte of body every 500 ms; slow_headers: a header line a second), until the server
// answers or closes it, or ctx ends; then it starts again.
func (s *soak) trickle(ctx context.Context, kind string) {
	for ctx.Err() == nil {
		c := s.sent[kind]
		c.sent.Add(1)
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", s.addr)
		if err != nil {
			c.errs.Add(1)
			return
		}
		stop := context.AfterFunc(ctx, func() { conn.Close() })
		status, err := trickleOn(conn, kind)
		stop()
		conn.Close()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			c.errs.Add(1)
		default:
			c.answered(status)
		}
	}
}

// trickleOn sends one slow request on conn and returns the status of the answer.
func trickleOn(conn net.Conn, kind string) (int, error) {
	answered := make(chan int, 1)
	go func() { // reads the answer, if any, while the request trickles
		var line [64]byte
		n, _ := io.ReadAtLeast(conn, line[:], 12)
		var status int
		if n >= 12 {
			fmt.Sscanf(string(line[9:12]), "%d", &status)
		}
		answered <- status
	}()
	headers := []string{"POST /v1/jobs HTTP/1.1", "Host: sluice", "Authorization: Bearer " + harness.ProducerToken,
		"Content-Type: application/json", "Content-Length: 100000"}
	gap := 500 * time.Millisecond
	if kind == "slow_headers" {
		gap = time.Second
		for _, h := range headers {
			if _, err := conn.Write([]byte(h + "\r\n")); err != nil {
				return <-answered, nil
			}
			select {
			case st := <-answered:
				return st, nil
			case <-time.After(gap):
			}
		}
	} else if _, err := conn.Write([]byte(strings.Join(headers, "\r\n") + "\r\n\r\n")); err != nil {
		return 0, err
	}
	for {
		if _, err := conn.Write([]byte(" ")); err != nil {
			return <-answered, nil
		}
		select {
		case st := <-answered:
			return st, nil
		case <-time.After(gap):
		}
	}
}

func soakPost(hc *http.Client, url, token string, body []byte) (int, error) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	return soakDo(hc, req)
}

func soakGet(hc *http.Client, url, token string) (int, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return soakDo(hc, req)
}

func soakDo(hc *http.Client, req *http.Request) (int, error) {
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}
