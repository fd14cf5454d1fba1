package integration_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/integration/harness"
)

// callStart sends the executor's POST /v1/jobs/{id}/start with a wrong nonce on a connection of
// its own (a fresh transport: an idle connection kept from an earlier call would hide a listener
// that accepts no more), and fails t unless the handler answered within timeout. The handler's
// answer to a wrong nonce is a 409; what matters is that it came.
func callStart(t *testing.T, env *harness.Env, id int64, timeout time.Duration) {
	t.Helper()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: timeout}
	req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/v1/jobs/%d/start", env.URL, id),
		strings.NewReader(`{"nonce":"not-the-nonce"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+harness.ExecutorToken)
	began := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("the executor's /start got no answer within %s: %v", timeout, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("/start with a wrong nonce: HTTP %d, want 409", resp.StatusCode)
	}
	t.Logf("/start answered in %s", time.Since(began).Round(time.Millisecond))
}

// TestIdleFloodLeavesCallbacks: unauthenticated clients holding idle keep-alive connections from
// several addresses take at most MaxConnsPerSource each and MaxConns-ReservedConns together; the
// executor's address (ExecutorSources) still gets a connection and /start answers at once. Before
// the connection limiter knew sources, the flood's connections took every slot of the listener
// for the whole idle timeout, the executor's connection waited in the kernel's backlog and its
// /start timed out: the job failed dispatch_failed (issue 30, finding 4).
func TestIdleFloodLeavesCallbacks(t *testing.T) {
	t.Parallel()
	const maxConns, reserved, perSource = 32, 8, 4
	env := harness.Start(t, harness.Options{API: true, MaxConns: maxConns, ReservedConns: reserved,
		MaxConnsPerSource: perSource, ExecutorSources: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
	id := env.Admit(t, "acme", map[string]any{})

	// 6 other loopback addresses, 8 connections each: 48, more than the listener holds, twice
	// each source's bound. Each sends one request and keeps its connection idle.
	const sources, each = 6, 8
	type outcome struct {
		source   int
		answered bool // else the server closed it
	}
	outcomes := make(chan outcome, sources*each)
	var conns []net.Conn
	var readers sync.WaitGroup
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close() // ends a reader still waiting
		}
		readers.Wait()
	})
	for s := range sources {
		d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+s))}}
		for range each {
			c, err := d.Dial("tcp", env.App.Addr())
			if err != nil {
				t.Fatalf("dial from source %d: %v", s, err)
			}
			conns = append(conns, c)
			if _, err := fmt.Fprint(c, "GET /healthz HTTP/1.1\r\nHost: sluice\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			readers.Add(1)
			go func() { // owned by the test: ends with its deadline or when the cleanup closes c
				defer readers.Done()
				_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err == nil {
					resp.Body.Close()
					outcomes <- outcome{source: s, answered: true}
					return
				}
				var ne net.Error
				if !errors.As(err, &ne) || !ne.Timeout() {
					outcomes <- outcome{source: s} // closed by the server
				}
			}()
		}
	}
	var answered, refused int
	perSourceAnswered := map[int]int{}
	collect := func() {
		for {
			select {
			case o := <-outcomes:
				if o.answered {
					answered++
					perSourceAnswered[o.source]++
				} else {
					refused++
				}
			default:
				return
			}
		}
	}
	// The flood holds its share once that many have been answered; with the old listener it held
	// every slot by then, since all 48 were queued before the executor dials.
	harness.WaitFor(t, 20*time.Second, "the flood to hold its share of the listener", func() (bool, error) {
		collect()
		return answered >= maxConns-reserved, nil
	})

	callStart(t, env, id, 3*time.Second)

	harness.WaitFor(t, 20*time.Second, "every flood connection answered or refused", func() (bool, error) {
		collect()
		return answered+refused == sources*each, nil
	})
	if answered > maxConns-reserved {
		t.Errorf("%d flood connections answered; want at most MaxConns-ReservedConns = %d", answered, maxConns-reserved)
	}
	for s, n := range perSourceAnswered {
		if n > perSource {
			t.Errorf("source 127.0.0.%d held %d connections; want at most %d", 2+s, n, perSource)
		}
	}
}

// TestReadyzFloodLeavesCallbacks: /readyz, which needs no token and no request slot, answers from a
// probe at most a second old, run by one request at a time; a flood of it while the database is
// slow to answer the probe holds one database connection, not the whole pool, and /start answers
// at once. Before, each /readyz read schema_migrations on the pool /start uses, and while a lock
// kept those reads waiting, the flood held every connection of it (issue 30, finding 4).
func TestReadyzFloodLeavesCallbacks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := harness.Start(t, harness.Options{API: true})
	id := env.Admit(t, "acme", map[string]any{})

	// The probe's statement waits on this lock (at most the probe's 2 s timeout).
	lock, err := env.DB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.ExecContext(ctx, "LOCK TABLES schema_migrations WRITE"); err != nil {
		t.Fatal(err)
	}
	unlocked := false
	unlock := func() {
		if !unlocked {
			unlocked = true
			_, _ = lock.ExecContext(ctx, "UNLOCK TABLES")
			lock.Close()
		}
	}
	t.Cleanup(unlock)

	// 48 callers, more than the pool's 32 connections, each asking up to 5 times: the flood
	// stops by itself, or sooner once /start has been tried.
	const callers, rounds = 48, 5
	stop := make(chan struct{})
	var flood sync.WaitGroup
	var asked atomic.Int64
	tr := &http.Transport{MaxIdleConnsPerHost: callers}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	stopFlood := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		flood.Wait()
		tr.CloseIdleConnections()
	}
	t.Cleanup(stopFlood)
	for range callers {
		flood.Add(1)
		go func() { // owned by the test: at most rounds requests, stopped by stopFlood
			defer flood.Done()
			for range rounds {
				select {
				case <-stop:
					return
				default:
				}
				asked.Add(1)
				if resp, err := client.Get(env.URL + "/readyz"); err == nil {
					resp.Body.Close()
				}
			}
		}()
	}
	harness.WaitFor(t, 20*time.Second, "a readiness probe waiting on the lock", func() (bool, error) {
		var n int
		err := env.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.processlist
			WHERE db = ? AND state = 'Waiting for table metadata lock'`, env.DB.Name).Scan(&n)
		return n > 0 && asked.Load() >= callers, err
	})

	callStart(t, env, id, 1500*time.Millisecond)

	stopFlood()
	unlock()
	harness.WaitFor(t, 20*time.Second, "/readyz ready again once the lock is gone", func() (bool, error) {
		r := env.Do(t, http.MethodGet, "/readyz", "", nil)
		return r.Status == http.StatusOK, nil
	})
	t.Logf("%d /readyz requests sent", asked.Load())
}
