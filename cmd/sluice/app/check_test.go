package app

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/gate/api"
)

// TestCheckExecutorSecret: with an executor URL, the signing secret must be at least 32 bytes
// and not the settings example's placeholder; the refusal names the setting, never the secret.
func TestCheckExecutorSecret(t *testing.T) {
	tokens, err := api.NewTokens([]api.Token{{Name: "ops", Token: strings.Repeat("a", api.MinTokenLength), Role: api.Admin}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, url, secret string
		ok                bool
	}{
		{"32 bytes", "http://127.0.0.1:1/", strings.Repeat("k", 32), true},
		{"31 bytes", "http://127.0.0.1:1/", strings.Repeat("k", 31), false},
		{"empty", "http://127.0.0.1:1/", "", false},
		{"the example", "http://127.0.0.1:1/", "CHANGE-ME-to-the-output-of-openssl-rand-hex-32", false},
		{"the README's", "http://127.0.0.1:1/", "change-me" + strings.Repeat("0", 32), false},
		{"no executor: not used", "", "short", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := Options{MySQLDSN: "x", NATSURL: "x", API: true, Relay: true, Tokens: tokens,
				Drainer: tc.url != "", ExecutorURL: tc.url, ExecutorSecret: tc.secret}
			err := opts.check()
			if tc.ok != (err == nil) {
				t.Fatalf("check() = %v, want ok %v", err, tc.ok)
			}
			if err != nil && (!strings.Contains(err.Error(), "SLUICE_EXECUTOR_SECRET") || tc.secret != "" && strings.Contains(err.Error(), tc.secret)) {
				t.Errorf("check() = %v: want the setting named and the secret not shown", err)
			}
		})
	}
}

// TestCheckMetricsToken: the metrics token of the example settings, which ships uncommented, is
// refused by name without being shown; any other token, or none, is taken as before.
func TestCheckMetricsToken(t *testing.T) {
	for _, tc := range []struct {
		token string
		ok    bool
	}{
		{"CHANGE-ME-long-random-string", false},
		{"", true},
		{"short", true},
		{strings.Repeat("m", 40), true},
	} {
		opts := Options{MySQLDSN: "x", NATSURL: "x", Relay: true, MetricsToken: tc.token}
		err := opts.check()
		if tc.ok != (err == nil) {
			t.Fatalf("token %q: check() = %v, want ok %v", tc.token, err, tc.ok)
		}
		if err != nil && (!strings.Contains(err.Error(), "SLUICE_METRICS_TOKEN") || strings.Contains(err.Error(), tc.token)) {
			t.Errorf("check() = %v: want the setting named and the token not shown", err)
		}
	}
}
