package integration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/drainer/executor/kit"
	"github.com/sluicehq/sluice/drainer/executor/simexec"
	"github.com/sluicehq/sluice/integration/harness"
)

// A dispatch starts at most once (SPEC §4, §12.2), end to end: a signed dispatch copied as it
// went by and sent again to another replica of the executor, or to a restarted one, is refused
// there, and a /start whose answer was lost is retried and the job still runs once. The
// replicas are `sluice simexec` processes, built on the kit, sharing the secret and the API but
// no memory.

// relay is the load balancer in front of the executor replicas: it forwards each dispatch to the
// replica of the moment and keeps a copy of what it forwarded, to replay it. A dispatch whose
// replica dies under it is held, unanswered, until the test ends, as a connection to a host that
// vanished hangs: sluice keeps the job in flight meanwhile.
type relay struct {
	srv    *httptest.Server
	target atomic.Pointer[string]
	hold   chan struct{} // closed when the test ends

	mu   sync.Mutex
	sent []sentDispatch
}

func newRelay(t *testing.T) *relay {
	t.Helper()
	r := &relay{hold: make(chan struct{})}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		target := r.target.Load()
		if target == nil {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "no replica yet", http.StatusServiceUnavailable)
			return
		}
		r.mu.Lock()
		r.sent = append(r.sent, sentDispatch{body: body, header: req.Header.Clone()})
		r.mu.Unlock()
		code, answer, header := postDispatch(req.Context(), *target, body, req.Header)
		if code == 599 {
			select {
			case <-r.hold:
			case <-req.Context().Done():
			}
		}
		for _, k := range []string{"Content-Type", "Retry-After"} {
			if v := header.Get(k); v != "" {
				w.Header().Set(k, v)
			}
		}
		w.WriteHeader(code)
		_, _ = w.Write(answer)
	}))
	t.Cleanup(r.srv.Close)
	t.Cleanup(func() { close(r.hold) }) // before the server's Close, which waits for held requests
	return r
}

// dispatchOf returns the copy of the dispatch of job id that the relay forwarded.
func (r *relay) dispatchOf(t *testing.T, id int64) sentDispatch {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.sent {
		if d.header.Get(executor.HeaderJobID) == strconv.FormatInt(id, 10) {
			return d
		}
	}
	t.Fatalf("no dispatch of job %d went through the relay", id)
	return sentDispatch{}
}

// postDispatch sends a dispatch's bytes and headers to url and returns the answer; a transport
// error is a 599 with the error as its body.
func postDispatch(ctx context.Context, url string, body []byte, header http.Header) (int, []byte, http.Header) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 599, []byte(err.Error()), http.Header{}
	}
	req.Header = header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 599, []byte(err.Error()), http.Header{}
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, answer, resp.Header
}

// replica is a `sluice simexec` process: an executor built on the kit.
type replica struct {
	proc *harness.Proc
	url  string // its dispatch endpoint
	base string
}

var simexecAddr = regexp.MustCompile(`simulated executor listening on http://(\S+)`)

// startReplica runs `sluice simexec` against env's API with the harness's secret and executor
// token, on a free port, and waits until it listens.
func startReplica(t *testing.T, bin string, env *harness.Env, name string) *replica {
	t.Helper()
	return startSimexec(t, bin, env.URL, name)
}

// startSimexec runs `sluice simexec` against the API at apiURL with the harness's secret and
// executor token and the settings in extraEnv, on a free port, and waits until it listens.
func startSimexec(tb testing.TB, bin, apiURL, name string, extraEnv ...string) *replica {
	tb.Helper()
	p := harness.StartProc(tb, name, bin, append([]string{
		"SLUICE_API_URL=" + apiURL,
		"SLUICE_EXECUTOR_TOKEN=" + harness.ExecutorToken,
		"SLUICE_EXECUTOR_SECRET=" + harness.Secret,
		"SLUICE_SIMEXEC_LISTEN=127.0.0.1:0",
		"SLUICE_LOG_LEVEL=warn",
	}, extraEnv...), "simexec")
	var addr string
	harness.WaitFor(tb, 30*time.Second, name+" to listen", func() (bool, error) {
		if p.Exited() {
			return false, fmt.Errorf("%s exited: %s", name, p.Output())
		}
		m := simexecAddr.FindStringSubmatch(p.Output())
		if m == nil {
			return false, nil
		}
		addr = m[1]
		return true, nil
	})
	return &replica{proc: p, url: "http://" + addr + "/dispatch", base: "http://" + addr}
}

func (r *replica) stats(t *testing.T) simexec.Stats {
	t.Helper()
	resp, err := http.Get(r.base + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s simexec.Stats
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestDispatchReplayedToAnotherReplica: the reproduction. A job that runs for a while is
// dispatched to replica A, which confirms its start; the signed dispatch, copied as it went by,
// is sent again, well within its deadline, to replica B. B's start confirmation is refused
// (nonce_used), B answers 409 and runs nothing; A's run is the only start and its outcome the
// job's.
func TestDispatchReplayedToAnotherReplica(t *testing.T) {
	t.Parallel()
	bin := harness.BuildSluice(t)
	lb := newRelay(t)
	env := harness.Start(t, harness.Options{ExecutorURL: lb.srv.URL + "/dispatch"})
	a := startReplica(t, bin, env, "replica A")
	b := startReplica(t, bin, env, "replica B")
	lb.target.Store(&a.url)

	id := env.Admit(t, "acme", map[string]any{"sleep_ms": 3000})
	harness.WaitFor(t, 30*time.Second, "the job to run on replica A", func() (bool, error) {
		return readKitJob(t, env, id).status == "running", nil
	})
	d := lb.dispatchOf(t, id)
	code, answer, _ := postDispatch(context.Background(), b.url, d.body, d.header)
	if code != http.StatusConflict || !strings.Contains(string(answer), "start_refused") || !strings.Contains(string(answer), "nonce_used") {
		t.Fatalf("the dispatch replayed to replica B: HTTP %d %s, want 409 start_refused (nonce_used)", code, answer)
	}
	harness.WaitFor(t, 30*time.Second, "the job to succeed", func() (bool, error) {
		return readKitJob(t, env, id).status == "succeeded", nil
	})
	key := strconv.FormatInt(id, 10)
	if sa, sb := a.stats(t), b.stats(t); sa.Starts[key] != 1 || sb.TotalStarts != 0 || sb.RefusedStarts != 1 {
		t.Fatalf("starts: replica A %d of job %d, replica B %d (refused %d); want 1, 0 and 1 refused",
			sa.Starts[key], id, sb.TotalStarts, sb.RefusedStarts)
	}
}

// TestDispatchReplayedAfterExecutorRestart: the replica that ran a job is SIGKILLed and started
// again, its memory of nonces gone; the job's dispatch replayed to it is refused, whether the
// job had finished or was still running (its dispatch's connection hanging) when its executor
// died.
func TestDispatchReplayedAfterExecutorRestart(t *testing.T) {
	t.Parallel()
	bin := harness.BuildSluice(t)
	lb := newRelay(t)
	env := harness.Start(t, harness.Options{ExecutorURL: lb.srv.URL + "/dispatch"})
	a := startReplica(t, bin, env, "replica A")
	lb.target.Store(&a.url)

	done := env.Admit(t, "acme", map[string]any{"sleep_ms": 0})
	harness.WaitFor(t, 30*time.Second, "the first job to succeed", func() (bool, error) {
		return readKitJob(t, env, done).status == "succeeded", nil
	})
	midRun := env.Admit(t, "acme", map[string]any{"sleep_ms": 60_000})
	harness.WaitFor(t, 30*time.Second, "the second job to run", func() (bool, error) {
		return readKitJob(t, env, midRun).status == "running", nil
	})
	a.proc.Kill()
	restarted := startReplica(t, bin, env, "replica A, restarted")
	for _, id := range []int64{done, midRun} {
		d := lb.dispatchOf(t, id)
		code, answer, _ := postDispatch(context.Background(), restarted.url, d.body, d.header)
		if code != http.StatusConflict || !strings.Contains(string(answer), "start_refused") {
			t.Errorf("job %d's dispatch replayed to the restarted replica: HTTP %d %s, want 409 start_refused", id, code, answer)
		}
	}
	if s := restarted.stats(t); s.TotalStarts != 0 || s.RefusedStarts != 2 {
		t.Fatalf("the restarted replica started %d job(s) and refused %d, want 0 and 2", s.TotalStarts, s.RefusedStarts)
	}
	if j := readKitJob(t, env, midRun); j.status != "running" || j.attempt != 1 {
		t.Fatalf("the job whose executor died: %+v, want still running its first attempt (the replay was refused while it ran)", j)
	}
}

// dropFirstStartAnswer is a transport that sends the first /start to the API and then loses its
// answer, as a connection cut after the request went out: the API recorded the start, the
// executor does not know it.
type dropFirstStartAnswer struct {
	dropped atomic.Bool
	starts  atomic.Int32
}

func (d *dropFirstStartAnswer) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || !strings.HasSuffix(req.URL.Path, "/start") {
		return resp, err
	}
	d.starts.Add(1)
	if d.dropped.CompareAndSwap(false, true) {
		resp.Body.Close()
		return nil, errors.New("connection reset after the request was sent")
	}
	return resp, nil
}

// TestStartRetriedAfterLostAnswer: the API records a start whose answer never reaches the
// executor; the kit asks again with the same start attempt, is answered 200, and runs the job
// once.
func TestStartRetriedAfterLostAnswer(t *testing.T) {
	t.Parallel()
	k := newKitServer(t)
	env := harness.Start(t, harness.Options{ExecutorURL: k.srv.URL + "/dispatch"})
	tr := &dropFirstStartAnswer{}
	var ran runs
	k.set(t, env.URL, func(ctx context.Context, j kit.Job) kit.Outcome {
		ran.add(j)
		return kit.Succeeded(nil)
	}, kit.HTTPClient(&http.Client{Transport: tr, Timeout: 10 * time.Second}))
	id := env.Admit(t, "acme", map[string]any{"n": 1})
	harness.WaitFor(t, 30*time.Second, "the job to succeed", func() (bool, error) {
		return readKitJob(t, env, id).status == "succeeded", nil
	})
	if n := len(ran.all()); n != 1 || !tr.dropped.Load() || tr.starts.Load() != 2 {
		t.Fatalf("%d run(s) after %d /start call(s) (first answer dropped: %v); want 1 run after 2 calls",
			n, tr.starts.Load(), tr.dropped.Load())
	}
	if j := readKitJob(t, env, id); j.attempt != 1 || !j.started {
		t.Fatalf("job %+v, want started once, in its first attempt", j)
	}
}
