package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/rategate"
	"github.com/sluicehq/sluice/integration/harness"
)

// TestGateCommand runs `sluice gate set|list|clear` against a running sluice.
func TestGateCommand(t *testing.T) {
	t.Parallel()
	addr := os.Getenv("SLUICE_TEST_MEMCACHED_ADDR")
	if addr == "" {
		addr = "127.0.0.1:11211"
	}
	env := harness.Start(t, harness.Options{API: true, Relay: true, Memcached: []string{addr}, GateTimeout: time.Second})
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	key := "cli-key-" + hex.EncodeToString(b[:])
	hash := gate.RateKeyHash(key)
	t.Cleanup(func() { _ = memcache.New(addr).Delete(rategate.Key(hash)) })
	if r := env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, map[string]any{"tenant": "cli", "rate_key": key}); r.Status != http.StatusAccepted {
		t.Fatalf("admit: HTTP %d %s", r.Status, r.Raw)
	}
	sluice := func(args ...string) (string, string, int) {
		var out, errOut bytes.Buffer
		code := run(append(args, "--api-url", env.URL, "--token", harness.AdminToken), &out, &errOut)
		return out.String(), errOut.String(), code
	}
	if out, errOut, code := sluice("gate", "set", "--rate-key", key, "--retry-after", "600"); code != 0 || !strings.Contains(out, hash+" gated until ") {
		t.Fatalf("gate set: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if out, errOut, code := sluice("gate", "list"); code != 0 || !strings.Contains(out, hash) || !strings.Contains(out, "QUEUED") {
		t.Fatalf("gate list: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if _, errOut, code := sluice("gate", "set", "--hash", hash, "--retry-after", "0"); code != 1 || !strings.Contains(errOut, "invalid_request") {
		t.Errorf("gate set with retry-after 0: exit %d, stderr %q; want 1 and invalid_request", code, errOut)
	}
	if out, errOut, code := sluice("gate", "clear", hash); code != 0 || !strings.Contains(out, "cleared") {
		t.Fatalf("gate clear: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if out, _, code := sluice("gate", "list"); code != 0 || strings.Contains(out, hash) {
		t.Errorf("gate list after clear: exit %d, stdout %q; want the key gone", code, out)
	}
	if _, _, code := sluice("gate", "frobnicate"); code != 1 {
		t.Errorf("gate frobnicate: exit %d, want 1", code)
	}
}
