package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// TestDevRefusesNonLoopback: `sluice dev` accepts its built-in admin token `dev`, so it refuses to
// listen (API or metrics) anywhere but on loopback, naming the setting and saying why, before any
// connection: the database and broker named do not exist, so without the check it would fail on
// them instead, with an error that names none of these.
func TestDevRefusesNonLoopback(t *testing.T) {
	unsetSettings(t, true)
	for _, tc := range []struct {
		name, flag, addr, setting string
	}{
		{"every IPv4 interface", "--listen", "0.0.0.0:0", "SLUICE_LISTEN"},
		{"every interface", "--listen", ":0", "SLUICE_LISTEN"},
		{"every IPv6 interface", "--listen", "[::]:0", "SLUICE_LISTEN"},
		{"a host name", "--listen", "example.com:7480", "SLUICE_LISTEN"},
		{"metrics on every interface", "--metrics-listen", "0.0.0.0:0", "SLUICE_METRICS_LISTEN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			args := []string{"--mysql-dsn", nowhereDSN, "--nats-url", nowhereNATS, "--listen", "127.0.0.1:0",
				"--simexec-listen", "127.0.0.1:0", "--memcached", "", "--log-level", "warn", tc.flag, tc.addr}
			err := serve(ctx, args, io.Discard, io.Discard, true)
			if err == nil || !strings.Contains(err.Error(), tc.setting) || !strings.Contains(err.Error(), "loopback") ||
				!strings.Contains(err.Error(), "`dev`") {
				t.Fatalf("sluice dev %s %s: %v; want a refusal naming %s, loopback and the dev token", tc.flag, tc.addr, err, tc.setting)
			}
		})
	}
}

// TestLoopbackAddr: what counts as loopback for `sluice dev`.
func TestLoopbackAddr(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:7480": true, "127.1.2.3:0": true, "[::1]:7480": true, "localhost:7480": true, "LocalHost:0": true,
		"[::ffff:127.0.0.1]:0": true,
		":7480":                false, "0.0.0.0:7480": false, "[::]:0": false, "10.0.0.1:7480": false, "example.com:80": false,
		"localhost.example.com:0": false, "127.0.0.1": false, "": false,
	} {
		if got := loopbackAddr(addr); got != want {
			t.Errorf("loopbackAddr(%q) = %v, want %v", addr, got, want)
		}
	}
}
