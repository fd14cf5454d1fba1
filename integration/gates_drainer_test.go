package integration_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/rategate"
	"github.com/sluicehq/sluice/integration/apitest"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/memcachedtest"
)

// TestGateMemcachedOutage is SPEC §12 invariant 7 with a test-owned memcached: while it is up a
// gated key's jobs wait; stopped mid-run, every job dispatches (fail open, counted in
// sluice_gate_unavailable_total); started again on the same port, gates work again. The drainer
// is driven one pass at a time, and no pass may take longer than the gate timeout plus one poll
// period.
func TestGateMemcachedOutage(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{API: true, Relay: true}) // the test runs the drainer
	mcs := memcachedtest.Start(t)
	// 250 ms rather than the 50 ms default: the phases that assert a gate holds must not fail
	// open on a loaded machine, and the mute phase still shows that the timeout bounds a pass.
	const timeout, poll = 250 * time.Millisecond, time.Second
	const skipFor = 300 * time.Millisecond
	store, err := rategate.New(rategate.Config{Servers: []string{mcs.Addr()}, Timeout: timeout, SkipFor: skipFor})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	d := drainertest.NewDrainer(t, drainer.Config{DB: env.DB.DB, Executor: executor.NewClient(env.ExecURL, []byte(harness.Secret)),
		RateGates: store, Metrics: drainer.NewMetrics(reg), ID: "outage-test", PollInterval: poll}, 10*time.Second)
	ctx := context.Background()
	var slowest time.Duration
	passes, timedOut := 0, 0
	drive := func(what string, cond func() (bool, error)) {
		t.Helper()
		harness.WaitFor(t, 30*time.Second, what, func() (bool, error) {
			t0 := time.Now()
			if _, err := d.RunOnce(ctx); err != nil {
				return false, err
			}
			took := time.Since(t0)
			slowest = max(slowest, took)
			if took >= timeout {
				timedOut++
			}
			passes++
			return cond()
		})
	}
	succeeded := func(hash string, n int) func() (bool, error) {
		return func() (bool, error) {
			c, err := gateKeyStates(ctx, env, hash)
			return c["succeeded"] == n, err
		}
	}
	mc := memcache.New(mcs.Addr())
	kG, hG := apitest.RateKey(t, mc)
	kO, hO := apitest.RateKey(t, mc)
	work := map[string]any{"sleep_ms": 5}

	// memcached up: the gated key waits, the other drains.
	if _, err := store.Extend(ctx, hG, 3600); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		gateAdmitKey(t, env, "t4", kG, work)
		gateAdmitKey(t, env, "t4", kO, work)
	}
	drive("the ungated key's 4 jobs to succeed", succeeded(hO, 4))
	if c, err := gateKeyStates(ctx, env, hG); err != nil || c["queued"] != 4 {
		t.Fatalf("gated key's jobs with memcached up: %v (%v), want 4 queued", c, err)
	}
	if n := harness.Counter(t, reg, "sluice_gate_unavailable_total"); n != 0 {
		t.Errorf("sluice_gate_unavailable_total = %v with memcached up, want 0", n)
	}

	// memcached stopped: dispatch continues, the gated key included (fail open).
	mcs.Stop()
	for i := 0; i < 4; i++ {
		gateAdmitKey(t, env, "t4", kO, work)
	}
	drive("every job to dispatch and succeed with memcached down", func() (bool, error) {
		g, err := gateKeyStates(ctx, env, hG)
		if err != nil {
			return false, err
		}
		o, err := gateKeyStates(ctx, env, hO)
		return g["succeeded"] == 4 && o["succeeded"] == 8, err
	})
	if n := harness.Counter(t, reg, "sluice_gate_unavailable_total"); n < 1 {
		t.Errorf("sluice_gate_unavailable_total = %v after passes with memcached down, want at least 1", n)
	}

	// A server that accepts and never answers, on the same port: the costly failure, where a try
	// pays the full timeout. 8 jobs of 200 ms at the tenant cap of 2 keep jobs queued for about
	// 800 ms, longer than the store's 300 ms skip window, so some pass must meet the mute server
	// (the phase waits for one); jobs still dispatch and no pass waits longer than the bound.
	mute := gateMuteServer(t, mcs.Addr())
	slow := map[string]any{"sleep_ms": 200}
	for i := 0; i < 8; i++ {
		gateAdmitKey(t, env, "t4", kO, slow)
	}
	before := timedOut
	drive("jobs to dispatch while memcached is mute, and a pass to meet it", func() (bool, error) {
		ok, err := succeeded(hO, 16)()
		return ok && timedOut > before, err
	})
	mute()

	// memcached back on the same port (empty): gates work again once the store's skip window
	// has passed.
	mcs.Restart()
	harness.WaitFor(t, 10*time.Second, "the gate store to write memcached again", func() (bool, error) {
		_, err := store.Extend(ctx, hG, 3600)
		return err == nil, nil
	})
	for i := 0; i < 4; i++ {
		gateAdmitKey(t, env, "t4", kG, work)
		gateAdmitKey(t, env, "t4", kO, work)
	}
	drive("the ungated key's 4 new jobs to succeed", succeeded(hO, 20))
	if c, err := gateKeyStates(ctx, env, hG); err != nil || c["queued"] != 4 || c["succeeded"] != 4 {
		t.Errorf("gated key's jobs after memcached came back: %v (%v), want the 4 new ones queued", c, err)
	}
	if st := env.Exec.Stats(); st.DuplicateStarts != 0 {
		t.Errorf("%d duplicate starts", st.DuplicateStarts)
	}
	if slowest > timeout+poll {
		t.Errorf("the slowest of %d passes took %s, want at most the gate timeout plus one poll period (%s)", passes, slowest, timeout+poll)
	}
	t.Logf("%d passes, %d of them paid the %s gate timeout, slowest %s", passes, timedOut, timeout, slowest.Round(time.Microsecond))
	harness.Emit("gate_outage_slowest_pass", map[string]any{"passes": passes, "timed_out_passes": timedOut, "slowest_ms": float64(slowest.Microseconds()) / 1000,
		"bound_ms": (timeout + poll).Milliseconds()})
}

// byTenant returns an executor for the answers the simulated one cannot give (a 202 or a 2xx
// carrying a gate): it answers each dispatch as answers says for the job's tenant, finishes the
// jobs of other tenants "succeeded", and records what it was sent. forget drops a tenant's
// answer while the drainer runs (answers is byTenant's from then on).
func byTenant(answers map[string]executor.Answer) (stub *drainertest.Executor, forget func(tenant string)) {
	var mu sync.Mutex
	stub = &drainertest.Executor{Record: true, Answer: func(_ context.Context, _ int, d executor.Dispatch) executor.Answer {
		mu.Lock()
		defer mu.Unlock()
		if a, ok := answers[d.Tenant]; ok {
			return a
		}
		return executor.Answer{Kind: executor.Done, HTTPStatus: 200, Status: "succeeded"}
	}}
	return stub, func(tenant string) {
		mu.Lock()
		defer mu.Unlock()
		delete(answers, tenant)
	}
}

// TestGateDispatchAnswers covers the other gate writers of SPEC §6 and §8: the gate field of a
// 202 and of a 2xx answer, a 429 with Retry-After (the job is requeued, never started, held by
// the gate and not by a not-before of its own, and not claimed again while gated), a 429 for a
// job without a rate key (held by its own not-before instead), and the gate field of /complete.
func TestGateDispatchAnswers(t *testing.T) {
	t.Parallel()
	addr := memcachedtest.Shared(t)
	env := harness.Start(t, harness.Options{API: true, Relay: true, Memcached: []string{addr}, GateTimeout: time.Second})
	store := env.App.RateGates()
	mc := memcache.New(addr)
	stub, forget := byTenant(map[string]executor.Answer{
		"accepts":  {Kind: executor.Accepted, HTTPStatus: 202, Gate: &executor.Gate{RetryAfter: 120}},
		"limited":  {Kind: executor.RateLimited, HTTPStatus: 429, RetryAfter: 30},
		"keyless":  {Kind: executor.RateLimited, HTTPStatus: 429, RetryAfter: 30},
		"finishes": {Kind: executor.Done, HTTPStatus: 200, Status: "succeeded", Gate: &executor.Gate{RetryAfter: 60}},
	})
	d := drainertest.NewDrainer(t, drainer.Config{DB: env.DB.DB, Executor: stub, RateGates: store, ID: "answers-test"}, 10*time.Second)
	ctx := context.Background()
	kA, hA := apitest.RateKey(t, mc)
	kB, hB := apitest.RateKey(t, mc)
	kD, hD := apitest.RateKey(t, mc)
	a := gateAdmitKey(t, env, "accepts", kA, nil)
	b := gateAdmitKey(t, env, "limited", kB, nil)
	c := env.Admit(t, "keyless", nil)
	dj := gateAdmitKey(t, env, "finishes", kD, nil)
	if p, err := d.RunOnce(ctx); err != nil || p.Claimed != 4 {
		t.Fatalf("first pass: %+v, %v; want 4 claimed", p, err)
	}
	row := func(id int64) (status string, code *string, notBefore *time.Time, err error) {
		err = env.DB.QueryRowContext(ctx, "SELECT status, error_code, not_before FROM jobs WHERE id = ?", id).Scan(&status, &code, &notBefore)
		return
	}
	gateIn := func(hash string, lo, hi time.Duration) {
		t.Helper()
		nb, ok, err := store.Get(ctx, hash)
		if err != nil || !ok {
			t.Errorf("no gate for %s: %v", hash, err)
			return
		}
		if d := time.Until(nb); d < lo || d > hi {
			t.Errorf("gate of %s ends in %s, want between %s and %s", hash, d, lo, hi)
		}
	}
	harness.WaitFor(t, 10*time.Second, "the 429s and the 2xx to be recorded", func() (bool, error) {
		sb, _, _, err := row(b)
		if err != nil {
			return false, err
		}
		sc, _, _, err := row(c)
		if err != nil {
			return false, err
		}
		sd, _, _, err := row(dj)
		return sb == "queued" && sc == "queued" && sd == "succeeded", err
	})
	// 202 with a gate: the key is gated, the job stays dispatched until /complete.
	gateIn(hA, 60*time.Second, 126*time.Second)
	// 2xx with a gate.
	gateIn(hD, 30*time.Second, 66*time.Second)
	// 429 with Retry-After 30 on a key: gated; the job is queued, never started, no not-before.
	gateIn(hB, 20*time.Second, 36*time.Second)
	if s, code, nb, _ := row(b); s != "queued" || code == nil || *code != "rate_limited" || nb != nil {
		t.Errorf("429'd job: status %s, error_code %v, not_before %v; want queued, rate_limited, none", s, code, nb)
	}
	// 429 without a rate key: nothing to gate, so the job waits on a not-before of its own.
	if s, code, nb, _ := row(c); s != "queued" || code == nil || *code != "rate_limited" || nb == nil {
		t.Errorf("keyless 429'd job: status %s, error_code %v, not_before %v; want queued, rate_limited, set", s, code, nb)
	}
	// Another pass claims neither: one is gated, the other not yet due.
	if _, err := d.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n, m := len(stub.Sent(b)), len(stub.Sent(c)); n != 1 || m != 1 {
		t.Errorf("after a second pass the 429'd jobs were dispatched %d and %d times, want once each", n, m)
	}
	// Clearing the gate releases the 429'd job.
	if err := store.Clear(ctx, hB); err != nil {
		t.Fatal(err)
	}
	forget("limited") // its upstream quota is back
	harness.WaitFor(t, 10*time.Second, "the 429'd job to run once its gate was cleared", func() (bool, error) {
		if _, err := d.RunOnce(ctx); err != nil {
			return false, err
		}
		s, _, _, err := row(b)
		return s == "succeeded", err
	})

	// /complete with a gate: validated before anything is written, then applied.
	nonce := stub.Sent(a)[0].Nonce
	path := "/v1/jobs/" + strconv.FormatInt(a, 10) + "/complete"
	r := env.Do(t, http.MethodPost, path, harness.ExecutorToken, map[string]any{"nonce": nonce, "status": "succeeded", "gate": map[string]any{"retry_after": 0}})
	if r.Status != http.StatusBadRequest || r.Body["field"] != "gate.retry_after" {
		t.Errorf("/complete with gate.retry_after 0: HTTP %d %s, want 400 naming gate.retry_after", r.Status, r.Raw)
	}
	if s, _, _, _ := row(a); s != "dispatched" {
		t.Errorf("a refused /complete changed the job to %s", s)
	}
	r = env.Do(t, http.MethodPost, path, harness.ExecutorToken, map[string]any{"nonce": nonce, "status": "succeeded", "gate": map[string]any{"retry_after": 600}})
	if r.Status != http.StatusOK || r.Body["status"] != "succeeded" {
		t.Fatalf("/complete with a gate: HTTP %d %s", r.Status, r.Raw)
	}
	gateIn(hA, 590*time.Second, 606*time.Second)
}

// TestGateManyGatedKeysAtTenantHead: a tenant's queue starts with jobs of many different gated
// keys, then one job of an ungated key; gated keys never hide a tenant's other keys (SPEC §5,
// §13.3). With 10 (more than one read of its heads holds) the first pass claims that job and
// nothing else. With 40, more than one pass looks up (about 26), it is claimed within three
// passes, because each pass starts by excluding the keys the last ones found gated; without that
// memory every pass looked up the same first keys and the job waited until the gates ended.
func TestGateManyGatedKeysAtTenantHead(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ keys, passes int }{{10, 1}, {40, 3}} {
		t.Run(fmt.Sprintf("%d keys", c.keys), func(t *testing.T) {
			t.Parallel()
			addr := memcachedtest.Shared(t)
			env := harness.Start(t, harness.Options{API: true, Relay: true, Memcached: []string{addr}, GateTimeout: time.Second})
			store := env.App.RateGates()
			mc := memcache.New(addr)
			stub, _ := byTenant(map[string]executor.Answer{})
			d := drainertest.NewDrainer(t, drainer.Config{DB: env.DB.DB, Executor: stub, RateGates: store, ID: "heads-test",
				PollInterval: time.Minute}, 10*time.Second)
			ctx := context.Background()
			var gatedIDs []int64
			for range c.keys {
				k, h := apitest.RateKey(t, mc)
				if _, err := store.Extend(ctx, h, 3600); err != nil {
					t.Fatal(err)
				}
				gatedIDs = append(gatedIDs, gateAdmitKey(t, env, "crowded", k, nil))
			}
			kO, _ := apitest.RateKey(t, mc)
			free := gateAdmitKey(t, env, "crowded", kO, nil)
			for pass := 1; ; pass++ {
				if pass > c.passes {
					t.Fatalf("the ungated job behind %d gated keys was not claimed in %d passes", c.keys, c.passes)
				}
				p, err := d.RunOnce(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if p.Claimed > 1 {
					t.Fatalf("pass %d claimed %d jobs, want only the ungated one", pass, p.Claimed)
				}
				if p.Claimed == 1 {
					break
				}
			}
			harness.WaitFor(t, 10*time.Second, "the ungated job to succeed", func() (bool, error) {
				var s string
				err := env.DB.QueryRowContext(ctx, "SELECT status FROM jobs WHERE id = ?", free).Scan(&s)
				return s == "succeeded", err
			})
			for _, id := range gatedIDs {
				if n := len(stub.Sent(id)); n != 0 {
					t.Errorf("gated job %d was dispatched %d times", id, n)
				}
			}
		})
	}
}

// gateMuteServer listens on addr, accepts connections and never answers, until the returned stop
// function (also run at cleanup) closes everything.
func gateMuteServer(tb testing.TB, addr string) func() {
	tb.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		tb.Fatalf("mute server on %s: %v", addr, err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			l.Close()
			<-done
			mu.Lock()
			defer mu.Unlock()
			for _, c := range conns {
				c.Close()
			}
		})
	}
	tb.Cleanup(stop)
	return stop
}

// TestGateExpiresOnInjectedClock: a 429 with Retry-After 60 gates the key until now + 65 s on
// the drainer's and the store's shared clock; the job is not claimed 64 s later and is claimed
// 66 s later, with no sleeping: the clock is moved.
func TestGateExpiresOnInjectedClock(t *testing.T) {
	t.Parallel()
	addr := memcachedtest.Shared(t)
	env := harness.Start(t, harness.Options{API: true, Relay: true})
	mc := memcache.New(addr)
	fake := clock.NewFake(time.Now())
	store, err := rategate.New(rategate.Config{Servers: []string{addr}, Clock: fake, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	stub, forget := byTenant(map[string]executor.Answer{
		"hourly": {Kind: executor.RateLimited, HTTPStatus: 429, RetryAfter: 60},
	})
	d := drainertest.NewDrainer(t, drainer.Config{DB: env.DB.DB, Executor: stub, RateGates: store, Clock: fake, ID: "clock-test"}, 10*time.Second)
	ctx := context.Background()
	k, h := apitest.RateKey(t, mc)
	id := gateAdmitKey(t, env, "hourly", k, nil)
	status := func() (string, error) {
		var s string
		err := env.DB.QueryRowContext(ctx, "SELECT status FROM jobs WHERE id = ?", id).Scan(&s)
		return s, err
	}
	if p, err := d.RunOnce(ctx); err != nil || p.Claimed != 1 {
		t.Fatalf("first pass: %+v, %v; want the job claimed", p, err)
	}
	harness.WaitFor(t, 10*time.Second, "the 429 to requeue the job", func() (bool, error) {
		s, err := status()
		return s == "queued", err
	})
	forget("hourly") // the next dispatch succeeds
	start, _ := fake.Now(ctx)
	nb, ok, err := store.Get(ctx, h)
	if err != nil || !ok || !nb.Equal(start.Add(65*time.Second).Truncate(time.Millisecond)) {
		t.Fatalf("gate = %v (%v, %v), want now + 60 s + 5 s = %v", nb, ok, err, start.Add(65*time.Second))
	}
	fake.Advance(64 * time.Second)
	if p, err := d.RunOnce(ctx); err != nil || p.Claimed != 0 {
		t.Fatalf("pass at +64 s: %+v, %v; want nothing claimed (gated until +65 s)", p, err)
	}
	fake.Advance(2 * time.Second)
	if p, err := d.RunOnce(ctx); err != nil || p.Claimed != 1 {
		t.Fatalf("pass at +66 s: %+v, %v; want the job claimed (its gate has passed)", p, err)
	}
	harness.WaitFor(t, 10*time.Second, "the job to succeed after its gate passed", func() (bool, error) {
		s, err := status()
		return s == "succeeded", err
	})
	if n := len(stub.Sent(id)); n != 2 {
		t.Errorf("the job was dispatched %d times, want 2 (the 429, then the run)", n)
	}
}

// TestGateWriteFailuresLogOnce: while memcached is down, each 429 that cannot gate its key is
// counted, and the job waits on a not-before of its own, but the log says so once per 15 s
// (SPEC §5), not once a job.
func TestGateWriteFailuresLogOnce(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{API: true}) // the test runs the drainer
	mcs := memcachedtest.Start(t)
	mcs.Stop()
	logs := &harness.SyncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	store, err := rategate.New(rategate.Config{Servers: []string{mcs.Addr()}, SkipFor: time.Millisecond, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	d := drainertest.NewDrainer(t, drainer.Config{DB: env.DB.DB, Executor: executor.NewClient(env.ExecURL, []byte(harness.Secret)),
		RateGates: store, Metrics: drainer.NewMetrics(reg), Log: log, ID: "gate-logs"}, 10*time.Second)
	mc := memcache.New(mcs.Addr())
	const jobs = 6
	for i := range jobs {
		k, _ := apitest.RateKey(t, mc)
		gateAdmitKey(t, env, fmt.Sprintf("t%d", i), k, map[string]any{"retry_after": 60})
	}
	ctx := context.Background()
	harness.WaitFor(t, 30*time.Second, "every job to be answered 429 and wait on its own", func() (bool, error) {
		if _, err := d.RunOnce(ctx); err != nil {
			return false, err
		}
		c, err := env.CountJobsWhere(ctx, "error_code = 'rate_limited' AND not_before IS NOT NULL")
		return c["queued"] == jobs, err
	})
	if n := harness.Counter(t, reg, "sluice_gate_unavailable_total"); n < jobs {
		t.Errorf("sluice_gate_unavailable_total = %v after %d gates that could not be written, want at least %d", n, jobs, jobs)
	}
	var lines int
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(l, "memcached") || strings.Contains(l, "gate") {
			lines++
		}
	}
	if lines != 1 {
		t.Errorf("%d log lines about the gate store for %d failed gates, want the one warning:\n%s", lines, jobs, logs)
	}
}

// countingGates is a gate store that holds nothing and counts the gates written.
type countingGates struct{ extends atomic.Int32 }

func (g *countingGates) NotBefore(context.Context, []string) (map[string]time.Time, error) {
	return nil, nil
}

func (g *countingGates) Extend(_ context.Context, _ string, retryAfter int) (time.Time, error) {
	g.extends.Add(1)
	return time.Now().Add(time.Duration(retryAfter) * time.Second), nil
}

// TestGateOnceForARetriedOutcome: a 429 gates its key once. Writing its outcome is retried when
// the database connection breaks, and each retry used to write the gate again, moving it to
// now + R + 5 s from the retry instead of from the answer (SPEC §5).
func TestGateOnceForARetriedOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, clk, t0 := drainertest.NewDB(t, func(*config.Config) {})
	proxy, viaProxy := apitest.DBThroughCutter(t, db)
	id := drainertest.QueueOneJob(t, db, t0)
	if _, err := db.ExecContext(ctx, "UPDATE jobs SET rate_key_sha256 = ? WHERE id = ?", gate.RateKeyHash("k"), id); err != nil {
		t.Fatal(err)
	}
	gates := &countingGates{}
	sender := drainertest.NewHeld()
	recorded := make(chan int64, 2)
	d := drainertest.NewDrainer(t, drainer.Config{DB: viaProxy, Executor: sender, Clock: clk, RateGates: gates, ID: "retried",
		Observer: drainer.ObserverFuncs{OnRecorded: func(id int64) { recorded <- id }}}, 10*time.Second)
	if p, err := d.RunOnce(ctx); err != nil || p.Claimed != 1 {
		t.Fatalf("pass: %+v, %v; want one claim", p, err)
	}
	sender.Next(t)
	proxy.Armed.Store(true) // the outcome's COMMIT is cut: its write is retried
	sender.Replies <- executor.Answer{Kind: executor.RateLimited, HTTPStatus: 429, RetryAfter: 60}
	drainertest.AwaitRecorded(t, recorded, 1)
	if proxy.Cuts.Load() != 1 {
		t.Fatalf("the proxy cut %d connections, want the outcome's", proxy.Cuts.Load())
	}
	var status, code string
	if err := db.QueryRowContext(ctx, "SELECT status, error_code FROM jobs WHERE id = ?", id).Scan(&status, &code); err != nil {
		t.Fatal(err)
	}
	if n := gates.extends.Load(); n != 1 || status != "queued" || code != "rate_limited" {
		t.Errorf("after a 429 whose outcome write was retried: %d gates written, job %s/%s; want 1, queued/rate_limited", n, status, code)
	}
}
