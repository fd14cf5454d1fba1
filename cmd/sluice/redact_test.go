package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/integration/testdb"
)

// natsPassword is the password the tests put in SLUICE_NATS_URL; it must show nowhere.
const natsPassword = "nats-pa55word-0123"

// TestNATSURLCredentialsRedacted: a NATS URL's password is in no error a failed connection
// returns, from serve or from an operator's command, whether the URL cannot be parsed (url.Parse
// quotes it) or the broker cannot be reached.
func TestNATSURLCredentialsRedacted(t *testing.T) {
	unsetSettings(t, true)
	db := testdb.New(t)
	bad := "nats://sluice:" + natsPassword + "@127.0.0.1:bad"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out harness.SyncBuffer
	err := serve(ctx, append(serveArgs(db.DSN, bad), "--log-level", "debug"), &out, &out, false)
	if err == nil || !strings.Contains(err.Error(), "nats://***@127.0.0.1:bad") {
		t.Errorf("serve with NATS at %s: %v; want a refusal naming the URL without its password", bad, err)
	}
	if err != nil && strings.Contains(err.Error(), natsPassword) || strings.Contains(out.String(), natsPassword) {
		t.Errorf("serve with NATS at %s shows the password: %v\n%s", bad, err, &out)
	}
	for _, u := range []string{
		bad,
		"nats://sluice:" + natsPassword + "@127.0.0.1:1", // nothing listens on port 1
		"nats://" + natsPassword + "@127.0.0.1:1",        // a token
	} {
		err = natsCmd(context.Background(), []string{"init", "--nats-url", u}, io.Discard, io.Discard)
		if err == nil || strings.Contains(err.Error(), natsPassword) || !strings.Contains(err.Error(), "***@127.0.0.1:") {
			t.Errorf("sluice nats init with NATS at %s: %v; want an error naming the URL without the password", u, err)
		}
	}
}

// serveArgs are the arguments of a serve with every role, valid but for what a test adds.
func serveArgs(dsn, natsURL string) []string {
	return []string{"--mysql-dsn", dsn, "--nats-url", natsURL, "--listen", "127.0.0.1:0", "--memcached", "",
		"--executor-url", "http://127.0.0.1:1/dispatch", "--executor-secret", harness.Secret,
		"--tokens", `[{"name":"ops","token":"` + harness.AdminToken + `","role":"admin"}]`}
}

// TestServeLogRedactsNATSURL: with a token in SLUICE_NATS_URL (nats://token@host), the log
// line of a reconnection names the broker without it.
func TestServeLogRedactsNATSURL(t *testing.T) {
	unsetSettings(t, true)
	db := testdb.New(t)
	ns := natstest.Start(t) // it takes any token
	u := strings.Replace(ns.URL(), "nats://", "nats://"+natsPassword+"@", 1)
	ctx, cancel := context.WithCancel(context.Background())
	var out harness.SyncBuffer
	done := make(chan error, 1)
	go func() { done <- serve(ctx, append(serveArgs(db.DSN, u), "--log-level", "debug"), &out, &out, false) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Errorf("serve did not stop within 30 s")
		}
	})
	waitLog := func(what, line string) {
		harness.WaitFor(t, 30*time.Second, what, func() (bool, error) {
			select {
			case err := <-done:
				t.Fatalf("serve exited: %v\n%s", err, &out)
			default:
			}
			return strings.Contains(out.String(), line), nil
		})
	}
	waitLog("serve to start", `"msg":"sluice started"`)
	ns.Stop()
	ns.Restart(t)
	waitLog("the reconnection's log line", `"msg":"NATS reconnected"`)
	if strings.Contains(out.String(), natsPassword) || !strings.Contains(out.String(), "nats://***@127.0.0.1:") {
		t.Errorf("the log shows the NATS token, or no redacted URL:\n%s", &out)
	}
}

// TestDevBannerRedactsNATSURL: the banner of `sluice dev` names the broker without the password
// of its URL, and the log does not show it either.
func TestDevBannerRedactsNATSURL(t *testing.T) {
	ns := natstest.Start(t) // it takes any user and password
	u := strings.Replace(ns.URL(), "nats://", "nats://sluice:"+natsPassword+"@", 1)
	d := startDev(t, map[string]string{"SLUICE_NATS_URL": u, "SLUICE_LOG_LEVEL": "debug"})
	want := strings.Replace(ns.URL(), "nats://", "nats://sluice:***@", 1)
	if !strings.Contains(d.stdout.String(), "NATS:       "+want+"\n") {
		t.Errorf("the banner does not name the broker as %s:\n%s", want, d.stdout)
	}
	if strings.Contains(d.stdout.String(), natsPassword) || strings.Contains(d.stderr.String(), natsPassword) {
		t.Errorf("sluice dev shows the NATS password:\n%s\n%s", d.stdout, d.stderr)
	}
}
