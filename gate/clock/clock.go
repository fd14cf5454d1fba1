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

// Host is this host's clock, for times that no database keeps: rate-limit windows and gate
// instants in memcached, refresh periods, log pacing. Safe for concurrent use.
type Host struct{}

// Now returns this host's time; it never fails.
func (Host) Now(context.Context) (time.Time, error) { return Trunc(time.Now()), nil }

// DB is the database server's clock. Safe for concurrent use.
type DB struct {
	DB *sql.DB
}

// Now returns the server's UTC_TIMESTAMP(6).
func (c DB) Now(ctx context.Context) (time.Time, error) { return Read(ctx, c.DB) }

// Querier reads a row: a *sql.DB, *sql.Tx or *sql.Conn.
type Querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Read returns the database server's UTC_TIMESTAMP(6), read through q. Inside a transaction it is
// the one timestamp the transaction's writes use, the database's, as every other writer's are
// (leases and TTLs are judged by it).
func Read(ctx context.Context, q Querier) (time.Time, error) {
	var t time.Time
	if err := q.QueryRowContext(ctx, "SELECT UTC_TIMESTAMP(6)").Scan(&t); err != nil {
		return time.Time{}, fmt.Errorf("read database clock: %w", err)
	}
	return t.UTC(), nil
}

// DefaultSyncEvery is how often a Synced clock re-reads its source.
const DefaultSyncEvery = 10 * time.Second

// maxSyncRTT is the longest reading a Synced clock keeps: its estimate may run ahead of the
// source by up to the reading's round trip.
const maxSyncRTT = 10 * time.Millisecond

// Synced follows the database's clock without asking it on every call: it reads the source at
// most every Every and carries the reading forward on this host's monotonic clock. Each
// reading is dated from when its request was sent, so the estimate is never behind the source.
// It can be ahead by at most the reading's round trip (readings slower than 10 ms are used
// once and not kept), which can end a lease or a nonce that much early; leases and nonces last
// seconds. A step of the database server's clock shows within Every. Readings
// never go backwards. Safe for concurrent use.
type Synced struct {
	source Clock
	every  time.Duration
	local  func() time.Time // this host's clock; its monotonic reading is what counts

	mu    sync.Mutex
	base  time.Time // the source's time at the kept reading
	sent  time.Time // local time the kept reading was requested
	kept  bool
	since time.Time // the latest time returned
}

// NewSynced returns a clock that follows source, re-reading it every every (DefaultSyncEvery if
// zero or negative).
func NewSynced(source Clock, every time.Duration) *Synced {
	if every <= 0 {
		every = DefaultSyncEvery
	}
	return &Synced{source: source, every: every, local: time.Now}
}

// NewDBSynced returns a Synced clock following db's UTC_TIMESTAMP(6).
func NewDBSynced(db *sql.DB) *Synced { return NewSynced(DB{DB: db}, 0) }

// Now returns the estimate of the source's time, reading the source when the kept reading is
// older than Every.
func (s *Synced) Now(ctx context.Context) (time.Time, error) {
	s.mu.Lock()
	if s.kept {
		if d := s.local().Sub(s.sent); d >= 0 && d < s.every {
			t := s.forward(Trunc(s.base.Add(d)))
			s.mu.Unlock()
			return t, nil
		}
	}
	s.mu.Unlock()
	sent := s.local()
	t, err := s.source.Now(ctx)
	if err != nil {
		return time.Time{}, err
	}
	rtt := s.local().Sub(sent)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kept = rtt >= 0 && rtt <= maxSyncRTT
	if s.kept {
		s.base, s.sent = t, sent
	}
	return s.forward(Trunc(t)), nil
}

func (s *Synced) forward(t time.Time) time.Time {
	if t.Before(s.since) {
		return s.since
	}
	s.since = t
	return t
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
