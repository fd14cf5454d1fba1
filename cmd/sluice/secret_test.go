package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/integration/testdb"
)

// TestServeRefusesWeakExecutorSecret: `sluice serve` refuses to start with a signing secret
// shorter than 32 bytes or with the placeholder of deploy/sluice.env.example, naming the setting
// and never echoing the secret. Everything else is valid, so without the check the process would
// start and serve until the deadline.
func TestServeRefusesWeakExecutorSecret(t *testing.T) {
	unsetSettings(t, true)
	db := testdb.New(t)
	ns := natstest.Start(t)
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
			err := serve(ctx, []string{"--mysql-dsn", db.DSN, "--nats-url", ns.URL(), "--listen", "127.0.0.1:0",
				"--memcached", "", "--log-level", "warn",
				"--executor-url", "http://127.0.0.1:1/dispatch", "--executor-secret", secret,
				"--tokens", `[{"name":"ops","token":"` + harness.AdminToken + `","role":"admin"}]`}, &stderr, &stderr, false)
			if err == nil || !strings.Contains(err.Error(), "SLUICE_EXECUTOR_SECRET") {
				t.Fatalf("serve with secret %q: %v; want a refusal naming SLUICE_EXECUTOR_SECRET", secret, err)
			}
			if strings.Contains(err.Error(), secret) || strings.Contains(stderr.String(), secret) {
				t.Errorf("the refusal shows the secret: %v\n%s", err, &stderr)
			}
		})
	}
}
