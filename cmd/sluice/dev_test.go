package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/drainer/executor/simexec"
	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/integration/testdb"
	"github.com/sluicehq/sluice/outbox"
)

// devRun is a `sluice dev` running in the test's process.
type devRun struct {
	t      *testing.T
	stdout *harness.SyncBuffer
	stderr *harness.SyncBuffer
	done   chan struct{}
	err    error // serve's return, once done is closed
	db     *testdb.DB
	// API is the API URL the banner printed.
	API string
}

// startDev runs `sluice dev` in-process, the API and the simulated executor on OS-chosen ports
// (SLUICE_LISTEN and SLUICE_SIMEXEC_LISTEN 127.0.0.1:0), over a database and a broker of the
// test's own, with env set on top, and waits for its banner. Settings left in the developer's
// environment are cleared first, so the test cannot run in parallel.
func startDev(t *testing.T, env map[string]string) *devRun {
	t.Helper()
	unsetSettings(t, true)
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
	d := &devRun{t: t, stdout: &harness.SyncBuffer{}, stderr: &harness.SyncBuffer{}, done: make(chan struct{}), db: db}
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
// the console's address on it, and the built-in executor confirms starts against it, so a job
// admitted with the dev token succeeds.
func TestDevOnFreePorts(t *testing.T) {
	d := startDev(t, nil)
	if strings.HasSuffix(d.API, ":0") {
		t.Fatalf("the banner shows the API at %s, not the address it listens on", d.API)
	}
	if !strings.Contains(d.stdout.String(), "console:    "+d.API+"/ui/\n") {
		t.Errorf("the banner does not show the console at %s/ui/:\n%s", d.API, d.stdout)
	}
	res, err := http.Get(d.API + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") {
		t.Errorf("GET /ui/: HTTP %d %s, want the console's page", res.StatusCode, res.Header.Get("Content-Type"))
	}
	d.runJob("dev", "acme", map[string]any{"sleep_ms": 10})
}

// TestDevEmbedsNATS: with SLUICE_NATS_URL unset, `sluice dev` runs a NATS server of its own
// (SPEC §9, §11). The banner names it, and the job's pokes reach its JetStream stream.
func TestDevEmbedsNATS(t *testing.T) {
	d := startDev(t, map[string]string{"SLUICE_NATS_URL": ""})
	m := regexp.MustCompile(`NATS:\s+(nats://\S+)\s+\(embedded`).FindStringSubmatch(d.stdout.String())
	if m == nil {
		t.Fatalf("the banner names no embedded NATS server:\n%s", d.stdout)
	}
	d.runJob("dev", "acme", nil)
	// The enqueue and the release poke are published only once the stream acknowledged them.
	var rows int
	harness.WaitFor(t, 10*time.Second, "the outbox to be published", func() (bool, error) {
		var open int
		err := d.db.QueryRow("SELECT COUNT(*), COALESCE(SUM(published_at = "+outbox.Unpublished+"), 0) FROM outbox").Scan(&rows, &open)
		return rows >= 2 && open == 0, err
	})
	s, err := natstest.JetStreamAt(t, m[1]).Stream(context.Background(), "SLUICE")
	if err != nil {
		t.Fatalf("the embedded server has no SLUICE stream: %v", err)
	}
	if n := s.CachedInfo().State.Msgs; n != uint64(rows) {
		t.Errorf("the embedded stream holds %d messages, want one per outbox row (%d)", n, rows)
	}
}

// TestDevWithConfiguredTokens: tokens configured for `sluice dev` work next to the dev admin
// token, which the built-in executor uses for its starts.
func TestDevWithConfiguredTokens(t *testing.T) {
	d := startDev(t, map[string]string{
		"SLUICE_TOKENS": `[{"name":"portal","token":"portal-token-0123456789abcdef012345","role":"producer","tenants":["acme"]}]`,
	})
	j := d.runJob("portal-token-0123456789abcdef012345", "acme", nil)
	// The dev token is still an admin: it reads the producer's job and lists every tenant's.
	if _, err := client.New(d.API, "dev").Job(context.Background(), j.ID); err != nil {
		t.Fatalf("the dev token cannot read the producer's job: %v", err)
	}
	d.runJob("dev", "globex", nil)
	if _, _, err := client.New(d.API, "portal-token-0123456789abcdef012345").Admit(context.Background(), client.AdmitRequest{Tenant: "globex"}); client.Code(err) != job.CodeForbidden {
		t.Errorf("the producer token admitted for a tenant it does not hold: %v", err)
	}
}

// TestDevUnconfirmedAsync: with starts not confirmed, the built-in executor still has the API,
// so an async job reports through /complete instead of being lost at the wall.
func TestDevUnconfirmedAsync(t *testing.T) {
	d := startDev(t, map[string]string{"SLUICE_EXECUTOR_CONFIRM_START": "false"})
	d.runJob("dev", "acme", map[string]any{"async": true, "sleep_ms": 10})
}

// TestDevOwnExecutor: with SLUICE_EXECUTOR_URL set, the banner names that executor and prints
// no stats URL, the built-in executor not running.
func TestDevOwnExecutor(t *testing.T) {
	const secret = "own-secret-0123456789abcdef01234567"
	ex := simexec.New(simexec.Config{Secret: []byte(secret)})
	srv := httptest.NewServer(ex.Handler())
	t.Cleanup(func() { srv.Close(); ex.Close() })
	d := startDev(t, map[string]string{"SLUICE_EXECUTOR_URL": srv.URL + "/dispatch", "SLUICE_EXECUTOR_SECRET": secret})
	banner := d.stdout.String()
	if !strings.Contains(banner, "executor:   "+srv.URL+"/dispatch") {
		t.Errorf("the banner does not name the configured executor:\n%s", banner)
	}
	if strings.Contains(banner, "stats:") {
		t.Errorf("the banner prints a stats URL for an executor it did not start:\n%s", banner)
	}
	ex.SetAPI(d.API, "dev")
	d.runJob("dev", "acme", nil)
}

// TestDevTokenCollision: a configured token that takes the dev token's name or value with
// another meaning is refused; the dev admin token itself is accepted as configured.
func TestDevTokenCollision(t *testing.T) {
	for _, tc := range []struct {
		name, tokens string
		ok           bool
	}{
		{"producer", `[{"name":"portal","token":"portal-token-0123456789abcdef012345","role":"producer","tenants":["*"]}]`, true},
		{"the dev token itself", `[{"name":"dev","token":"dev","role":"admin"}]`, true},
		{"the dev value as another admin", `[{"name":"ops","token":"dev","role":"admin"}]`, true},
		{"the dev value as a producer", `[{"name":"portal","token":"dev","role":"producer","tenants":["*"]}]`, false},
		{"the dev name on another token", `[{"name":"dev","token":"other","role":"admin"}]`, false},
		{"the dev name after the dev value", `[{"name":"ops","token":"dev","role":"admin"},{"name":"dev","token":"other","role":"executor"}]`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &settingValues{values: map[string]string{"tokens": tc.tokens}}
			toks, err := loadTokens(c, true)
			if !tc.ok {
				if err == nil || !strings.Contains(err.Error(), `"dev"`) {
					t.Fatalf("loadTokens = %v; want a refusal naming dev", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest("GET", "/", nil)
			r.Header.Set("Authorization", "Bearer dev")
			if caller, ok := toks.Authenticate(r); !ok || caller.Role != "admin" {
				t.Errorf("the dev token authenticates as %+v, %v; want an admin", caller, ok)
			}
		})
	}
}

// TestSimexecNeedsToken: `sluice simexec` without an executor token refuses to start, naming
// the setting, whether it confirms starts or only reports async jobs; with one it serves.
func TestSimexecNeedsToken(t *testing.T) {
	unsetSettings(t, true)
	for _, confirm := range []string{"true", "false"} {
		// Without the check the command would serve until the deadline and return nil.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := simexecCmd(ctx, []string{"--simexec-listen", "127.0.0.1:0", "--executor-confirm-start", confirm}, io.Discard, io.Discard)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "SLUICE_EXECUTOR_TOKEN") {
			t.Errorf("confirm-start %s without a token: %v; want an error naming SLUICE_EXECUTOR_TOKEN", confirm, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out harness.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- simexecCmd(ctx, []string{"--simexec-listen", "127.0.0.1:0", "--executor-token", "exec-token"}, &out, io.Discard)
	}()
	harness.WaitFor(t, 10*time.Second, "the simulated executor to listen", func() (bool, error) {
		select {
		case err := <-done:
			t.Fatalf("simexec with a token exited: %v", err)
		default:
		}
		return strings.Contains(out.String(), "listening on"), nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("simexec stopped with %v", err)
	}
}
