// Package rategate is the rate-gate store of SPEC §5: a "not before T" cooldown per rate key,
// kept in memcached in a documented format so that an executor written in any language can set
// one by writing memcached directly. Gates only ever grow (compare-and-swap), and every failure
// of memcached fails open: a caller is told the store is unavailable and proceeds as if no key
// were gated, because memcached costs gate precision, never work (SPEC §3).
package rategate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/gate/clock"
)

// KeyPrefix starts every gate's memcached key; the rest is the rate key's SHA-256 in lowercase
// hex.
const KeyPrefix = "sluice:gate:"

// MinRetryAfter and MaxRetryAfter bound retry_after, in whole seconds (SPEC §5).
const (
	MinRetryAfter = 1
	MaxRetryAfter = 86400
)

// Margin is added to every retry_after: a gate set with retry_after R ends at now + R + Margin,
// so that the executor's upstream has surely reset when the first job goes again.
const Margin = 5 * time.Second

// ErrUnavailable is returned (wrapped) when memcached could not be used: it is down, slow, or
// being skipped after recent errors. Callers fail open.
var ErrUnavailable = errors.New("rategate: memcached unavailable")

// ErrInvalid is returned (wrapped) for a malformed rate key hash or an out-of-range retry_after.
var ErrInvalid = errors.New("rategate: invalid argument")

// Key returns the memcached key of the gate of the rate key whose SHA-256 hex is hash.
func Key(hash string) string { return KeyPrefix + hash }

// TTL returns the memcached expiry of a gate set with retryAfter seconds: max(300 s,
// retryAfter + 120 s). The gate's value, not its expiry, says when it ends; the expiry only
// cleans up, with room for clock skew between the hosts that read it.
func TTL(retryAfter int) time.Duration {
	return max(300*time.Second, time.Duration(retryAfter)*time.Second+120*time.Second)
}

// Value encodes a not-before instant as memcached stores it: Unix milliseconds, decimal text.
func Value(notBefore time.Time) []byte {
	return []byte(strconv.FormatInt(notBefore.UnixMilli(), 10))
}

// ParseValue decodes a gate value written by Value (or by any executor following SPEC §5).
func ParseValue(v []byte) (time.Time, error) {
	ms, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil || ms < 0 {
		return time.Time{}, fmt.Errorf("%w: gate value %q is not Unix milliseconds", ErrInvalid, v)
	}
	return time.UnixMilli(ms).UTC(), nil
}

// ValidHash reports whether h is a rate key hash as sluice stores it: 64 lowercase hex digits.
func ValidHash(h string) bool {
	if len(h) != 64 {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ValidRetryAfter checks retryAfter against SPEC §5: whole seconds, 1 to 86,400.
func ValidRetryAfter(retryAfter int) error {
	if retryAfter < MinRetryAfter || retryAfter > MaxRetryAfter {
		return fmt.Errorf("%w: retry_after must be %d to %d seconds, got %d", ErrInvalid, MinRetryAfter, MaxRetryAfter, retryAfter)
	}
	return nil
}

// Config configures a Store. Field docs give the defaults.
type Config struct {
	// Servers are memcached addresses (host:port). Required.
	Servers []string
	// Clock gives "now" for new gates and for deciding whether a gate still holds. Default: this
	// host's clock, the clock that executors writing memcached directly use too.
	Clock clock.Clock
	// Timeout bounds every dial, read and write to memcached. Default 50 ms: far longer than a
	// gate lookup on a healthy memcached takes, and a slow memcached must not slow the drain pass
	// by more than this.
	Timeout time.Duration
	// MaxIdleConns is how many idle connections are kept per server. Default 16 (gomemcache keeps
	// 2, which makes concurrent dispatch outcomes and API writes dial on every call).
	MaxIdleConns int
	// SkipFor is how long the store skips memcached after an error, answering ErrUnavailable at
	// once, so that a dead server costs the timeout at most once per window rather than on every
	// pass. The skip covers the whole store: with several servers, one dead server makes every
	// key fail open for the window. Default 1 s (the drainer's poll period).
	SkipFor time.Duration
	// WarnEvery bounds the "memcached unavailable" warning to one per period. Default 15 s.
	WarnEvery time.Duration
	// CASAttempts bounds the compare-and-swap retries of one Extend under contention. Default 16.
	CASAttempts int
	// Log receives the rate-limited unavailability warning. Default: discard.
	Log *slog.Logger
}

// Store reads and writes gates. Safe for concurrent use. Its calls block for at most about the
// Timeout per memcached round trip; gomemcache takes no context, so ctx is checked between
// round trips only.
type Store struct {
	cfg Config
	mc  *memcache.Client

	mu        sync.Mutex
	skipUntil time.Time // breaker: memcached is not tried before this (host time)
	down      bool      // the last round trip failed
	lastWarn  time.Time
	failures  int // fail-opens since the last warning
}

// New returns a Store, or an "invalid config" error naming the field.
func New(cfg Config) (*Store, error) {
	if len(cfg.Servers) == 0 {
		return nil, errors.New("invalid config: Servers: at least one memcached address is required")
	}
	if cfg.Timeout < 0 || cfg.SkipFor < 0 || cfg.WarnEvery < 0 || cfg.MaxIdleConns < 0 || cfg.CASAttempts < 0 {
		return nil, errors.New("invalid config: Timeout, SkipFor, WarnEvery, MaxIdleConns and CASAttempts must not be negative")
	}
	if cfg.Clock == nil {
		cfg.Clock = hostClock{}
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 50 * time.Millisecond
	}
	if cfg.MaxIdleConns == 0 {
		cfg.MaxIdleConns = 16
	}
	if cfg.SkipFor == 0 {
		cfg.SkipFor = time.Second
	}
	if cfg.WarnEvery == 0 {
		cfg.WarnEvery = 15 * time.Second
	}
	if cfg.CASAttempts == 0 {
		cfg.CASAttempts = 16
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	var sl memcache.ServerList
	if err := sl.SetServers(cfg.Servers...); err != nil {
		return nil, fmt.Errorf("invalid config: Servers: %w", err)
	}
	mc := memcache.NewFromSelector(&sl)
	mc.Timeout = cfg.Timeout
	mc.MaxIdleConns = cfg.MaxIdleConns
	return &Store{cfg: cfg, mc: mc}, nil
}

type hostClock struct{}

func (hostClock) Now(context.Context) (time.Time, error) { return clock.Trunc(time.Now()), nil }

// Now returns the store's notion of now (its Clock).
func (s *Store) Now(ctx context.Context) (time.Time, error) { return s.cfg.Clock.Now(ctx) }

// available reports whether memcached may be tried now (the breaker is closed or its window
// has passed).
func (s *Store) available() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !time.Now().Before(s.skipUntil)
}

// Reachable reports whether the last round trip to memcached succeeded (true before the first),
// without making one: for status pages.
func (s *Store) Reachable() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.down
}

// succeeded records a round trip that reached memcached.
func (s *Store) succeeded() {
	s.mu.Lock()
	s.down = false
	s.mu.Unlock()
}

// failed records a memcached error: open the breaker and warn, at most once per WarnEvery.
// It returns err wrapped as ErrUnavailable.
func (s *Store) failed(op string, err error) error {
	s.mu.Lock()
	now := time.Now()
	s.skipUntil = now.Add(s.cfg.SkipFor)
	s.down = true
	s.failures++
	warn := now.Sub(s.lastWarn) >= s.cfg.WarnEvery
	n := s.failures
	if warn {
		s.lastWarn = now
		s.failures = 0
	}
	s.mu.Unlock()
	if warn {
		s.cfg.Log.Warn("memcached unavailable: rate gates fail open (keys are treated as not gated)",
			"op", op, "error", err, "failures_since_last_warning", n, "skip_for", s.cfg.SkipFor.String())
	}
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, op, err)
}

// skipped is the error of a call made while the breaker is open.
func (s *Store) skipped(op string) error {
	s.mu.Lock()
	s.failures++
	s.mu.Unlock()
	return fmt.Errorf("%w: %s: skipped after a recent error", ErrUnavailable, op)
}

// transient reports whether err is a memcached protocol answer rather than a failure to reach
// it: such answers keep the breaker closed.
func transient(err error) bool {
	return errors.Is(err, memcache.ErrCacheMiss) || errors.Is(err, memcache.ErrCASConflict) ||
		errors.Is(err, memcache.ErrNotStored)
}

// NotBefore returns the gate instant of each key among hashes that has a gate, in one round trip
// per server (GetMulti). Expired gates (not after now) are included; callers compare. A gate
// further ahead than the longest one SPEC §5 allows (now + MaxRetryAfter + Margin), which only a
// direct write to memcached can make, is read as that longest one: whoever can reach memcached
// may delay a key by a day at a time, not forever. On a memcached failure it returns what it
// could read and an error wrapping ErrUnavailable: treat the missing keys as not gated (fail
// open).
func (s *Store) NotBefore(ctx context.Context, hashes []string) (map[string]time.Time, error) {
	out := map[string]time.Time{}
	if len(hashes) == 0 {
		return out, nil
	}
	if err := ctx.Err(); err != nil {
		return out, err
	}
	now, err := s.cfg.Clock.Now(ctx)
	if err != nil {
		return out, fmt.Errorf("get gates: %w", err)
	}
	longest := now.Add(MaxRetryAfter*time.Second + Margin)
	if !s.available() {
		return out, s.skipped("get gates")
	}
	keys := make([]string, 0, len(hashes))
	for _, h := range hashes {
		if ValidHash(h) {
			keys = append(keys, Key(h))
		}
	}
	items, err := s.mc.GetMulti(keys)
	for k, it := range items {
		nb, perr := ParseValue(it.Value)
		if perr != nil {
			continue // not a gate sluice understands: not gated
		}
		if nb.After(longest) {
			// Written by something else than sluice, which never gates past the longest
			// retry_after: read as the longest, and rewritten so (best effort: a failure is
			// rewritten at the next read) with the longest gate's expiry, so that an item
			// stored without one does not gate the key a day at a time forever.
			nb = longest
			it.Value, it.Expiration = Value(longest), int32(TTL(MaxRetryAfter)/time.Second)
			_ = s.mc.CompareAndSwap(it)
		}
		out[k[len(KeyPrefix):]] = nb
	}
	if err != nil && !transient(err) {
		return out, s.failed("get gates", err)
	}
	s.succeeded()
	return out, nil
}

// Get returns the gate of hash and whether one is stored (it may have passed already).
func (s *Store) Get(ctx context.Context, hash string) (time.Time, bool, error) {
	m, err := s.NotBefore(ctx, []string{hash})
	nb, ok := m[hash]
	return nb, ok, err
}

// Extend gates hash until now + retryAfter + Margin, unless it is already gated longer: a gate
// only ever grows. It returns the gate now in force (the longer of the two). The write is a
// Gets + CompareAndSwap loop (Add when there is no gate), so concurrent writers cannot shorten
// each other's gates. Errors wrap ErrInvalid or ErrUnavailable.
func (s *Store) Extend(ctx context.Context, hash string, retryAfter int) (time.Time, error) {
	if !ValidHash(hash) {
		return time.Time{}, fmt.Errorf("%w: rate_key_sha256 must be 64 lowercase hex digits", ErrInvalid)
	}
	if err := ValidRetryAfter(retryAfter); err != nil {
		return time.Time{}, err
	}
	key := Key(hash)
	exp := int32(TTL(retryAfter) / time.Second)
	for attempt := 0; attempt < s.cfg.CASAttempts; attempt++ {
		if err := ctx.Err(); err != nil {
			return time.Time{}, err
		}
		if !s.available() {
			return time.Time{}, s.skipped("extend gate")
		}
		now, err := s.cfg.Clock.Now(ctx)
		if err != nil {
			return time.Time{}, err
		}
		// Millisecond precision is what the value holds; truncating here makes the returned
		// instant equal to what a reader decodes.
		want := now.Add(time.Duration(retryAfter)*time.Second + Margin).Truncate(time.Millisecond).UTC()
		it, err := s.mc.Get(key)
		switch {
		case errors.Is(err, memcache.ErrCacheMiss):
			err = s.mc.Add(&memcache.Item{Key: key, Value: Value(want), Expiration: exp})
			switch {
			case err == nil:
				s.succeeded()
				return want, nil
			case errors.Is(err, memcache.ErrNotStored):
				continue // another writer added one first: compare with it
			default:
				return time.Time{}, s.failed("add gate", err)
			}
		case err != nil:
			return time.Time{}, s.failed("read gate", err)
		}
		// A gate past the longest sluice writes is not one of sluice's (NotBefore): overwritten
		// like a value it cannot parse, never returned as the gate in force.
		longest := now.Add(MaxRetryAfter*time.Second + Margin)
		if cur, perr := ParseValue(it.Value); perr == nil && !cur.Before(want) && !cur.After(longest) {
			s.succeeded()
			return cur, nil
		}
		it.Value, it.Expiration = Value(want), exp
		err = s.mc.CompareAndSwap(it)
		switch {
		case err == nil:
			s.succeeded()
			return want, nil
		case errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrNotStored):
			continue // changed or deleted since our read: read again
		default:
			return time.Time{}, s.failed("extend gate", err)
		}
	}
	return time.Time{}, fmt.Errorf("rategate: extend gate %s: still contended after %d compare-and-swap attempts", hash, s.cfg.CASAttempts)
}

// Clear removes the gate of hash (an operator's override). Clearing a key without a gate is not
// an error.
func (s *Store) Clear(ctx context.Context, hash string) error {
	if !ValidHash(hash) {
		return fmt.Errorf("%w: rate_key_sha256 must be 64 lowercase hex digits", ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if !s.available() {
		return s.skipped("clear gate")
	}
	if err := s.mc.Delete(Key(hash)); err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
		return s.failed("clear gate", err)
	}
	s.succeeded()
	return nil
}
