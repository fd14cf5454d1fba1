package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/integration/testdb"
)

// devRun is a `sluice dev` running in the test's process.
type devRun struct {
	t      *testing.T
	stdout *syncBuffer
	stderr *syncBuffer
	done   chan struct{}
	err    error // serve's return, once done is closed
	// API is the API URL the banner printed.
	API string
}

// startDev runs `sluice dev` in-process, the API and the simulated executor on OS-chosen ports
// (SLUICE_LISTEN and SLUICE_SIMEXEC_LISTEN 127.0.0.1:0), over a database and a broker of the
// test's own, with env set on top, and waits for its banner. Settings left in the developer's
// environment are cleared first, so the test cannot run in parallel.
func startDev(t *testing.T, env map[string]string) *devRun {
	t.Helper()
	for _, s := range settings {
		unsetEnv(t, s.env)
	}
	unsetEnv(t, "SLUICE_CONFIG")
	db := testdb.New(t)
	ns := natstest.Start(t)
	base := map[string]string{
		"SLUICE_MYSQL_DSN": db.DSN, "SLUICE_NATS_URL": ns.URL(), "SLUICE_LISTEN": "127.0.0.1:0",
		"SLUICE_SIMEXEC_LISTEN": "127.0.0.1:0", "SLUICE_SHUTDOWN_GRACE": "5s", "SLUICE_LOG_LEVEL": "warn",
	}
	for k, v := range env {
		base[k] = v
	}
	for k, v := range base {
		t.Setenv(k, v)
	}
	d := &devRun{t: t, stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer close(d.done)
		d.err = serve(ctx, nil, d.stdout, d.stderr, true)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-d.done:
		case <-time.After(30 * time.Second):
			t.Errorf("sluice dev did not stop within 30 s")
		}
	})
	harness.WaitFor(t, 60*time.Second, "the sluice dev banner", func() (bool, error) {
		select {
		case <-d.done:
			t.Fatalf("sluice dev exited during start-up: %v\nstdout:\n%s\nstderr:\n%s", d.err, d.stdout, d.stderr)
		default:
		}
		return strings.Contains(d.stdout.String(), "Press Ctrl-C to stop."), nil
	})
	m := regexp.MustCompile(`API:\s+(http://\S+)`).FindStringSubmatch(d.stdout.String())
	if m == nil {
		t.Fatalf("no API URL in the banner:\n%s", d.stdout)
	}
	d.API = m[1]
	return d
}

// runJob admits a job for tenant with token and waits until it ends; the job must succeed.
func (d *devRun) runJob(token, tenant string, payload any) job.Job {
	d.t.Helper()
	ctx := context.Background()
	j, _, err := client.New(d.API, token).Admit(ctx, client.AdmitRequest{Tenant: tenant, Payload: payload})
	if err != nil {
		d.t.Fatalf("admit with token %q: %v", token, err)
	}
	harness.WaitFor(d.t, 30*time.Second, "the job to end", func() (bool, error) {
		if j, err = client.New(d.API, token).Job(ctx, j.ID); err != nil {
			return false, err
		}
		return j.Status.Terminal(), nil
	})
	if j.Status != job.Succeeded {
		code := ""
		if j.ErrorCode != nil {
			code = *j.ErrorCode
		}
		d.t.Fatalf("job %d ended %s (%s), want succeeded\nstderr:\n%s", j.ID, j.Status, code, d.stderr)
	}
	return j
}

// TestDevOnFreePorts: with the API on an OS-chosen port, the banner shows the port it got and
// the built-in executor confirms starts against it, so a job admitted with the dev token
// succeeds.
func TestDevOnFreePorts(t *testing.T) {
	d := startDev(t, nil)
	if strings.HasSuffix(d.API, ":0") {
		t.Fatalf("the banner shows the API at %s, not the address it listens on", d.API)
	}
	d.runJob("dev", "acme", map[string]any{"sleep_ms": 10})
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
