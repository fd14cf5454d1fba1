package testdb

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/store"
)

// PatchLimits writes a new runtime config version with changes (limit key: value, as the body
// of PATCH /v1/config) applied to the version in force, the way an operator's PATCH does
// (config.Patch: validated, serialised on config_lock, changed by "test"), and returns the version
// in force afterwards. Values already in force write nothing; no changes at all is an error. Processes pick the new version
// up at their next claim (caps) or reload. Fails tb on an invalid change or a database error.
func PatchLimits(tb testing.TB, db *sql.DB, changes map[string]any) config.Versioned {
	tb.Helper()
	raw := make(map[string]json.RawMessage, len(changes))
	for k, v := range changes {
		b, err := json.Marshal(v)
		if err != nil {
			tb.Fatalf("testdb: limit %s: %v", k, err)
		}
		raw[k] = b
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, _, err := config.Patch(ctx, db, nil, "test", raw, "set by test")
	if err != nil {
		tb.Fatalf("testdb: set limits %v: %v", changes, err)
	}
	return v
}

// SetLimits is PatchLimits with the changes that edit makes to the config in force; if edit
// changes nothing, nothing is written.
func SetLimits(tb testing.TB, db *sql.DB, edit func(*config.Config)) config.Versioned {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cur, err := config.Load(ctx, db)
	if err != nil {
		tb.Fatalf("testdb: set limits: %v", err)
	}
	next := cur.Config
	edit(&next)
	before, after := limitMap(tb, cur.Config), limitMap(tb, next)
	changes := map[string]any{}
	for k, v := range after {
		if string(before[k]) != string(v) {
			changes[k] = v
		}
	}
	if len(changes) == 0 {
		return cur
	}
	return PatchLimits(tb, db, changes)
}

func limitMap(tb testing.TB, c config.Config) map[string]json.RawMessage {
	tb.Helper()
	raw, err := json.Marshal(c)
	if err != nil {
		tb.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		tb.Fatal(err)
	}
	return m
}

// RecountQueues recounts the queue state of tenants (every tenant when none is named:
// store.RecountQueues), for a test that inserted queued jobs itself: admission counts the jobs it
// inserts, a raw INSERT does not, and no claim sees a job its tenant's state does not count.
func (d *DB) RecountQueues(tb testing.TB, tenants ...string) {
	tb.Helper()
	if err := store.RecountQueues(context.Background(), d.DB, tenants...); err != nil {
		tb.Fatal(err)
	}
}

// HeldElsewhere reports whether another transaction holds the row that q (a SELECT of one row,
// without a locking clause) reads, without waiting for it: for a test that waits until a
// transaction it started has reached a lock.
func (d *DB) HeldElsewhere(ctx context.Context, q string, args ...any) (bool, error) {
	var one int
	err := d.QueryRowContext(ctx, q+" FOR UPDATE NOWAIT", args...).Scan(&one)
	var me *mysql.MySQLError
	if errors.As(err, &me) && (me.Number == 1205 || me.Number == 3572) {
		return true, nil
	}
	return false, err
}
