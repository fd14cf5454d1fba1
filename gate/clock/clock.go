// Package clock gives sluice one notion of "now". Leases, the execution wall and nonce TTLs are
// judged by the database's clock (SPEC §4), so that drainers on hosts with skewed clocks agree;
// tests inject a Fake to move time without sleeping.
package clock

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"
)

// Clock tells the time. Now may block (the database clock asks the server); it returns UTC
// truncated to microseconds, the precision of the DATETIME(6) columns.
type Clock interface {
	Now(ctx context.Context) (time.Time, error)
}

// DB is the database server's clock. Safe for concurrent use.
type DB struct {
	DB *sql.DB
}

// Now returns the server's UTC_TIMESTAMP(6).
func (c DB) Now(ctx context.Context) (time.Time, error) {
	var t time.Time
	if err := c.DB.QueryRowContext(ctx, "SELECT UTC_TIMESTAMP(6)").Scan(&t); err != nil {
		return time.Time{}, fmt.Errorf("read database clock: %w", err)
	}
	return t.UTC(), nil
}

// Fake is a settable clock for tests. Safe for concurrent use.
type Fake struct {
	mu  sync.Mutex
	now time.Time
}

// NewFake returns a Fake set to t.
func NewFake(t time.Time) *Fake { return &Fake{now: Trunc(t)} }

// Now returns the fake time.
func (f *Fake) Now(context.Context) (time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now, nil
}

// Advance moves the fake time forward by d.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = Trunc(f.now.Add(d))
}

// Trunc converts t to UTC and truncates it to microseconds: MariaDB truncates extra digits
// while MySQL rounds them, so sluice never hands either of them more than it stores.
func Trunc(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }
