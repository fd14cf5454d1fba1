package integration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/drainer/executor/kit"
	"github.com/sluicehq/sluice/integration/apitest"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/memcachedtest"
)

// kitServer serves an executor built on the kit (drainer/executor/kit) to a real sluice. The
// kit's handler needs the API's address, known only once sluice listens, and sluice needs the
// executor's URL to start: the server is started first and its handler installed later (set).
// It keeps a copy of every dispatch it receives, to replay them.
type kitServer struct {
	srv *httptest.Server
	h   atomic.Pointer[kit.Handler]

	mu       sync.Mutex
	received []sentDispatch
}

type sentDispatch struct {
	body   []byte
	header http.Header
}

func newKitServer(t *testing.T) *kitServer {
	t.Helper()
	k := &kitServer{}
	k.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		k.mu.Lock()
		k.received = append(k.received, sentDispatch{body: body, header: r.Header.Clone()})
		k.mu.Unlock()
		h := k.h.Load()
		if h == nil {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "no executor yet", http.StatusServiceUnavailable)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(k.srv.Close)
	return k
}

// set installs the executor: the kit with the harness's secret and executor token, for the API
// at apiURL. It is closed in t's cleanup, before the server.
func (k *kitServer) set(t *testing.T, apiURL string, run kit.Func, opts ...kit.Option) *kit.Handler {
	t.Helper()
	h, err := kit.New(harness.Secret, apiURL, harness.ExecutorToken, run, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	k.h.Store(h)
	return h
}

// post sends body with header to the executor, as a client other than sluice would.
func (k *kitServer) post(t *testing.T, body []byte, header http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, k.srv.URL+"/dispatch", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(msg)
}

// runs records the jobs an executor's function was called with.
type runs struct {
	mu   sync.Mutex
	jobs []kit.Job
}

func (r *runs) add(j kit.Job) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.jobs = append(r.jobs, j)
}

func (r *runs) all() []kit.Job {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]kit.Job(nil), r.jobs...)
}

// kitJobRow is what the tests check of a job.
type kitJobRow struct {
	status  string
	attempt int
	started bool
	code    string
}

func readKitJob(t *testing.T, env *harness.Env, id int64) kitJobRow {
	t.Helper()
	var r kitJobRow
	var started *time.Time
	var code *string
	if err := env.DB.QueryRowContext(context.Background(), "SELECT status, attempt, started_at, error_code FROM jobs WHERE id = ?", id).
		Scan(&r.status, &r.attempt, &started, &code); err != nil {
		t.Fatal(err)
	}
	r.started = started != nil
	if code != nil {
		r.code = *code
	}
	return r
}

// TestKitForgeryAndReplayRefused: an executor built on the kit, behind a real sluice, refuses a
// dispatch for a queued job that sluice did not sign (another secret, or sluice's signature on
// another body) and runs nothing for it; it runs the job once sluice dispatches it, and refuses
// that very dispatch replayed afterwards.
func TestKitForgeryAndReplayRefused(t *testing.T) {
	t.Parallel()
	k := newKitServer(t)
	// No drainer yet: the job stays queued while it is forged.
	env := harness.Start(t, harness.Options{API: true, Relay: true, ExecutorURL: k.srv.URL + "/dispatch"})
	var ran runs
	k.set(t, env.URL, func(ctx context.Context, j kit.Job) kit.Outcome {
		ran.add(j)
		return kit.Succeeded(map[string]string{"tenant": j.Tenant})
	})
	id := env.Admit(t, "acme", map[string]any{"n": 1})

	forged, err := json.Marshal(executor.Dispatch{JobID: id, Tenant: "acme", Payload: json.RawMessage(`{"n":1}`),
		Nonce: "forged-nonce", Deadline: time.Now().Add(time.Minute), Version: 1, Attempt: 1})
	if err != nil {
		t.Fatal(err)
	}
	other := bytes.Replace(forged, []byte(`{"n":1}`), []byte(`{"n":2}`), 1)
	for name, sig := range map[string]string{
		"signed with another secret":        executor.Sign([]byte("not-the-secret"), forged),
		"a valid signature of another body": executor.Sign([]byte(harness.Secret), other),
		"unsigned":                          "",
	} {
		h := http.Header{"Content-Type": {"application/json"}, executor.HeaderJobID: {strconv.FormatInt(id, 10)}}
		if sig != "" {
			h.Set(executor.HeaderSignature, sig)
		}
		if code, body := k.post(t, forged, h); code != http.StatusUnauthorized || !strings.Contains(body, "bad_signature") {
			t.Errorf("%s: HTTP %d %s, want 401 bad_signature", name, code, body)
		}
	}
	if n := len(ran.all()); n != 0 {
		t.Fatalf("the executor ran %d job(s) for forged dispatches", n)
	}
	if j := readKitJob(t, env, id); j.status != "queued" || j.started {
		t.Fatalf("after the forgeries the job is %+v, want queued and never started", j)
	}

	env.StartApp(t, harness.Options{Drainer: true})
	harness.WaitFor(t, 30*time.Second, "the job to succeed", func() (bool, error) {
		return readKitJob(t, env, id).status == "succeeded", nil
	})
	got := ran.all()
	if len(got) != 1 || got[0].ID != id || got[0].Tenant != "acme" || string(got[0].Payload) != `{"n":1}` || got[0].Nonce == "forged-nonce" {
		t.Fatalf("runs %+v, want job %d once, as sluice dispatched it", got, id)
	}
	r := env.Do(t, http.MethodGet, "/v1/jobs/"+strconv.FormatInt(id, 10), harness.AdminToken, nil)
	if res, _ := r.Body["result"].(map[string]any); res["tenant"] != "acme" {
		t.Errorf("the job's result is %v, want the function's", r.Body["result"])
	}

	// Replay sluice's own dispatch, byte for byte.
	k.mu.Lock()
	var genuine *sentDispatch
	for i := range k.received {
		if k.received[i].header.Get(executor.HeaderSignature) != "" && executor.Verify([]byte(harness.Secret), k.received[i].body, k.received[i].header.Get(executor.HeaderSignature)) {
			genuine = &k.received[i]
		}
	}
	k.mu.Unlock()
	if genuine == nil {
		t.Fatal("no dispatch signed by sluice was received")
	}
	if code, body := k.post(t, genuine.body, genuine.header); code != http.StatusConflict || !strings.Contains(body, "replayed") {
		t.Errorf("replayed dispatch: HTTP %d %s, want 409 replayed", code, body)
	}
	if n := len(ran.all()); n != 1 {
		t.Errorf("the job ran %d times after the replay, want 1", n)
	}
}

// TestKitVoidedDispatchNeverRun: a dispatch voided before the executor confirmed its start (its
// drainer stopped and requeued the job) is never run: the kit's /start with the voided nonce
// gets 409 dispatch_void and the function is not called. The job's next dispatch runs, once.
func TestKitVoidedDispatchNeverRun(t *testing.T) {
	t.Parallel()
	k := newKitServer(t)
	env := harness.Start(t, harness.Options{API: true, Relay: true, ExecutorURL: k.srv.URL + "/dispatch"})
	held := make(chan kit.Job, 1)
	release := make(chan struct{})
	refused := make(chan error, 1)
	var ran runs
	k.set(t, env.URL, func(ctx context.Context, j kit.Job) kit.Outcome {
		ran.add(j)
		return kit.Succeeded(nil)
	}, kit.BeforeStart(func(ctx context.Context, j kit.Job) *kit.Outcome {
		if j.Attempt == 1 {
			// A slow executor: the first dispatch waits here, before its start, until the test
			// has seen it voided (not on ctx: the drainer cancels it, and the start must come
			// after the requeue to meet a voided dispatch).
			held <- j
			select {
			case <-release:
			case <-time.After(time.Minute):
			}
		}
		return nil
	}), kit.OnStartRefused(func(j kit.Job, err error) {
		if j.Attempt == 1 {
			refused <- err
		}
	}))
	drainerApp := env.StartApp(t, harness.Options{Drainer: true})
	id := env.Admit(t, "acme", nil)
	var first kit.Job
	select {
	case first = <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the job was not dispatched within 30 s")
	}
	// Stop the drainer with no grace: it cancels the open dispatch, whose outcome is unknown and
	// whose start was never confirmed, so the job is requeued and the dispatch voided.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_ = drainerApp.Stop(ctx)
	cancel()
	if j := readKitJob(t, env, id); j.status != "queued" || j.started {
		t.Fatalf("after its drainer stopped the job is %+v, want queued again, never started", j)
	}
	close(release)
	select {
	case err := <-refused:
		if !strings.Contains(err.Error(), "dispatch_void") {
			t.Errorf("the voided start was refused with %v, want dispatch_void", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the voided dispatch's start was not refused within 30 s")
	}
	if n := len(ran.all()); n != 0 {
		t.Fatalf("the function ran %d time(s) for a voided dispatch", n)
	}

	env.StartApp(t, harness.Options{Drainer: true})
	harness.WaitFor(t, 30*time.Second, "the job's next dispatch to succeed", func() (bool, error) {
		return readKitJob(t, env, id).status == "succeeded", nil
	})
	got := ran.all()
	if len(got) != 1 || got[0].Attempt != 2 || got[0].Nonce == first.Nonce {
		t.Fatalf("runs %+v, want one, of attempt 2 with a new nonce", got)
	}
}

// failedCompletes counts the /complete calls that got no answer, and says when the first failed.
type failedCompletes struct {
	next  http.RoundTripper
	n     atomic.Int32
	first chan struct{}
	once  sync.Once
}

func (f *failedCompletes) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := f.next.RoundTrip(r)
	if err != nil && strings.HasSuffix(r.URL.Path, "/complete") {
		f.n.Add(1)
		f.once.Do(func() { close(f.first) })
	}
	return resp, err
}

// TestKitAsyncCompletionThroughAPIRestart: an async job answered 202 finishes while the API the
// executor reports to is down; the kit retries its /complete until the API is back on the same
// address, and the job ends with the function's outcome, not lost.
func TestKitAsyncCompletionThroughAPIRestart(t *testing.T) {
	t.Parallel()
	k := newKitServer(t)
	env := harness.Start(t, harness.Options{ExecutorURL: k.srv.URL + "/dispatch"})
	// The executor reports to an API process of its own, which the test restarts.
	callbacks := env.StartApp(t, harness.Options{API: true})
	addr := callbacks.Addr()
	entered := make(chan kit.Job, 1)
	finish := make(chan struct{})
	failed := &failedCompletes{next: http.DefaultTransport, first: make(chan struct{})}
	k.set(t, "http://"+addr, func(ctx context.Context, j kit.Job) kit.Outcome {
		entered <- j
		select {
		case <-finish:
		case <-ctx.Done():
			return kit.Failed("canceled", ctx.Err().Error())
		}
		return kit.Succeeded(map[string]int{"pages": 12})
	}, kit.Async(func(kit.Job) bool { return true }),
		kit.HTTPClient(&http.Client{Timeout: 10 * time.Second, Transport: failed}))

	id := env.Admit(t, "acme", nil)
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the job did not start within 30 s")
	}
	if j := readKitJob(t, env, id); j.status != "running" {
		t.Fatalf("job %+v, want running (start confirmed through the callbacks API)", j)
	}
	if err := callbacks.Stop(context.Background()); err != nil {
		t.Fatalf("stop the callbacks API: %v", err)
	}
	close(finish)
	select {
	case <-failed.first:
	case <-time.After(30 * time.Second):
		t.Fatal("no /complete was attempted while the API was down")
	}
	env.StartApp(t, harness.Options{API: true, Listen: addr})
	harness.WaitFor(t, 60*time.Second, "the job's outcome to be recorded after the API came back", func() (bool, error) {
		return readKitJob(t, env, id).status == "succeeded", nil
	})
	if n := failed.n.Load(); n < 1 {
		t.Errorf("%d failed /complete attempts, want at least one", n)
	}
	r := env.Do(t, http.MethodGet, "/v1/jobs/"+strconv.FormatInt(id, 10), harness.AdminToken, nil)
	if res, _ := r.Body["result"].(map[string]any); res["pages"] != float64(12) {
		t.Errorf("the job's result is %v, want the function's", r.Body["result"])
	}
}

// TestKitRateLimitGatesKey: an upstream 429 reported through the kit gates the job's rate key in
// sluice. Refused in BeforeStart, the job is never started and is queued again behind the gate;
// refused by the function, after its start, the job fails with rate_limited and the key is
// gated all the same. Either way the key's other jobs stay queued, undispatched, and GET
// /v1/gates lists both keys with their queued jobs.
func TestKitRateLimitGatesKey(t *testing.T) {
	t.Parallel()
	addr := memcachedtest.Shared(t)
	mc := memcache.New(addr)
	k := newKitServer(t)
	env := harness.Start(t, harness.Options{API: true, Relay: true, ExecutorURL: k.srv.URL + "/dispatch",
		Memcached: []string{addr}, GateTimeout: time.Second})
	before, hBefore := apitest.RateKey(t, mc)
	during, hDuring := apitest.RateKey(t, mc)
	var ran runs
	k.set(t, env.URL, func(ctx context.Context, j kit.Job) kit.Outcome {
		ran.add(j)
		if j.RateKeySHA256 == hDuring {
			return kit.RateLimited(time.Hour)
		}
		return kit.Succeeded(nil)
	}, kit.BeforeStart(func(ctx context.Context, j kit.Job) *kit.Outcome {
		if j.RateKeySHA256 == hBefore {
			o := kit.RateLimited(time.Hour)
			return &o
		}
		return nil
	}))
	firstBefore := gateAdmitKey(t, env, "acme", before, nil)
	firstDuring := gateAdmitKey(t, env, "globex", during, nil)
	env.StartApp(t, harness.Options{Drainer: true, Memcached: []string{addr}, GateTimeout: time.Second})
	harness.WaitFor(t, 30*time.Second, "both first jobs to meet the 429", func() (bool, error) {
		b, d := readKitJob(t, env, firstBefore), readKitJob(t, env, firstDuring)
		return b.code == "rate_limited" && d.status == "failed", nil
	})
	if j := readKitJob(t, env, firstBefore); j.status != "queued" || j.started {
		t.Errorf("the job refused before its start: %+v, want queued again and never started", j)
	}
	if j := readKitJob(t, env, firstDuring); j.code != "rate_limited" || !j.started {
		t.Errorf("the job refused after its start: %+v, want failed with rate_limited, started", j)
	}
	secondBefore := gateAdmitKey(t, env, "acme", before, nil)
	secondDuring := gateAdmitKey(t, env, "globex", during, nil)
	other := env.Admit(t, "acme", nil)
	harness.WaitFor(t, 30*time.Second, "an ungated job to succeed", func() (bool, error) {
		return readKitJob(t, env, other).status == "succeeded", nil
	})
	for _, id := range []int64{secondBefore, secondDuring} {
		if j := readKitJob(t, env, id); j.status != "queued" || j.attempt != 0 {
			t.Errorf("job %d of a gated key: %+v, want queued and never dispatched", id, j)
		}
	}
	for _, tc := range []struct {
		hash   string
		queued float64
	}{{hBefore, 2}, {hDuring, 1}} {
		g, ok := listedGate(t, env, tc.hash)
		if !ok {
			t.Errorf("GET /v1/gates does not list %s", tc.hash)
			continue
		}
		nb, err := time.Parse(time.RFC3339Nano, g["not_before"].(string))
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Until(nb); g["queued"] != tc.queued || d < 3500*time.Second || d > 3606*time.Second {
			t.Errorf("gate %v (not before in %s), want queued %v and about 3605 s", g, d, tc.queued)
		}
	}
	for _, j := range ran.all() {
		if j.RateKeySHA256 == hBefore {
			t.Errorf("the function ran job %d, which BeforeStart refused", j.ID)
		}
	}
}

// TestKitAudience: sluice run with an executor id names it in every signed dispatch. An executor
// configured for another audience refuses the dispatch before any start, so the job is never
// started there and goes back to the queue; the executor the dispatch names runs it.
//
// The refused job goes back at once and each refusal spends one of its three dispatch attempts,
// so the other audience's executor holds its first dispatch until the test has put the right one
// in its place: the test failed once (a loaded, instrumented run) when the drainer dispatched three
// times before the switch and the job failed.
func TestKitAudience(t *testing.T) {
	t.Parallel()
	k := newKitServer(t)
	env := harness.Start(t, harness.Options{ExecutorURL: k.srv.URL + "/dispatch", ExecutorID: "pool-a"})
	// Each executor has a recorder of its own: the other audience's must stay empty whenever its
	// run would have happened (OnReceive comes before the audience check).
	var ran, ranB runs
	run := func(ctx context.Context, j kit.Job) kit.Outcome { ran.add(j); return kit.Succeeded(nil) }
	runB := func(ctx context.Context, j kit.Job) kit.Outcome { ranB.add(j); return kit.Succeeded(nil) }
	var refused atomic.Int32
	switched := make(chan struct{})
	k.set(t, env.URL, runB, kit.Audience("pool-b"), kit.OnReceive(func(kit.Job) {
		if refused.Add(1) == 1 {
			<-switched
		}
	}))
	id := env.Admit(t, "acme", map[string]any{"n": 1})
	harness.WaitFor(t, 30*time.Second, "a dispatch to reach the executor of another audience", func() (bool, error) {
		return refused.Load() > 0, nil
	})
	k.set(t, env.URL, run, kit.Audience("pool-a"))
	close(switched)
	harness.WaitFor(t, 30*time.Second, "the job to succeed on its own executor", func() (bool, error) {
		return readKitJob(t, env, id).status == "succeeded", nil
	})
	if got := ran.all(); len(got) != 1 || got[0].ID != id {
		t.Fatalf("runs %+v, want job %d once", got, id)
	}
	if n := len(ranB.all()); n != 0 || refused.Load() != 1 {
		t.Fatalf("the executor of another audience ran %d job(s) of %d dispatches; want none of one", n, refused.Load())
	}
	// Its one dispatch there went back to the queue unstarted, then the job started once.
	var trail string
	if err := env.DB.QueryRowContext(context.Background(), `SELECT GROUP_CONCAT(CONCAT(from_status, '>', to_status) ORDER BY id)
		FROM audit_events WHERE job_id = ? AND from_status IS NOT NULL`, id).Scan(&trail); err != nil {
		t.Fatal(err)
	}
	if want := "queued>dispatched,dispatched>queued,queued>dispatched,dispatched>running,running>succeeded"; trail != want {
		t.Fatalf("job %d's trail: %s; want %s", id, trail, want)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, d := range k.received {
		var body executor.Dispatch
		if err := json.Unmarshal(d.body, &body); err != nil || body.Audience != "pool-a" {
			t.Fatalf("a dispatch names audience %q (%v), want pool-a", body.Audience, err)
		}
	}
}
