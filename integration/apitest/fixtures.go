package apitest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/rategate"
)

// DispatchedJob inserts a job of tenant as a drainer leaves it after dispatching it with nonce,
// and returns its id: what a test of /start, /complete or an executor needs without running a
// drainer.
func DispatchedJob(ctx context.Context, db *sql.DB, tenant, nonce string) (int64, error) {
	// Every job's tenant has a row in tenants (admission writes it; the claim probes by it).
	if _, err := db.ExecContext(ctx, "INSERT IGNORE INTO tenants (tenant, created_at) VALUES (?, UTC_TIMESTAMP(6))", tenant); err != nil {
		return 0, err
	}
	res, err := db.ExecContext(ctx, `INSERT INTO jobs (tenant, status, version, attempt, queued_at, claimed_at,
		dispatched_at, lease_until, nonce_sha256, nonce_expires_at)
		VALUES (?, 'dispatched', 1, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
		UTC_TIMESTAMP(6) + INTERVAL 10 SECOND, UNHEX(SHA2(?, 256)), UTC_TIMESTAMP(6) + INTERVAL 300 SECOND)`, tenant, nonce)
	if err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

// RateKey returns a fresh raw rate key and its hash, and removes its gate from mc when the test
// ends (memcached outlives the test's database).
func RateKey(tb testing.TB, mc *memcache.Client) (raw, hash string) {
	tb.Helper()
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatal(err)
	}
	raw = "api-key-" + hex.EncodeToString(b[:])
	hash = gate.RateKeyHash(raw)
	tb.Cleanup(func() { _ = mc.Delete(rategate.Key(hash)) })
	return raw, hash
}
