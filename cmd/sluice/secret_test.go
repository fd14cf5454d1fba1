package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/integration/harness"
)

// nowhereDSN and nowhereNATS name a database and a broker that do not exist (port 1 on
// loopback), for tests of refusals that must come before any connection.
const nowhereDSN, nowhereNATS = "u:p@tcp(127.0.0.1:1)/nowhere", "nats://127.0.0.1:1"

// TestServeRefusesWeakExecutorSecret: `sluice serve` refuses to start with a signing secret
// shorter than 32 bytes or with the placeholder of deploy/sluice.env.example, naming the setting
// and never echoing the secret. The refusal comes before any connection: the database and the
// broker named here do not exist, so without the check serve would fail on them instead, with an
// error that does not name the setting.
func TestServeRefusesWeakExecutorSecret(t *testing.T) {
	unsetSettings(t, true)
	for name, secret := range map[string]string{
		"short":                     "s3cr3t",
		"one byte short":            strings.Repeat("k", 31),
		"the example":               "CHANGE-ME-long-random-string",
		"the example, made longer":  "CHANGE-ME-long-random-string-0123456789abcdef",
		"the example, in lowercase": "change-me-0123456789abcdef0123456789abcdef",
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			var stderr harness.SyncBuffer
			// serveArgs' own secret is valid; the last --executor-secret wins.
			args := append(serveArgs(nowhereDSN, nowhereNATS), "--log-level", "warn", "--executor-secret", secret)
			err := serve(ctx, args, &stderr, &stderr, false)
			if err == nil || !strings.Contains(err.Error(), "SLUICE_EXECUTOR_SECRET") {
				t.Fatalf("serve with secret %q: %v; want a refusal naming SLUICE_EXECUTOR_SECRET", secret, err)
			}
			if strings.Contains(err.Error(), secret) || strings.Contains(stderr.String(), secret) {
				t.Errorf("the refusal shows the secret: %v\n%s", err, &stderr)
			}
		})
	}
}
