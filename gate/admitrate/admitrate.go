// Package admitrate is the per-tenant admission rate limit of SPEC §5, kept in memcached: one
// counter per tenant per wall-clock minute. Admission reserves units before it writes and
// refunds the ones whose write did not commit, so a tenant is charged only for admissions that
// exist. memcached is a hint store here: when it is unreachable the limiter reports an error and
// admission fails open.
package admitrate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// Config configures a Limiter. Field docs give the defaults.
type Config struct {
	// Client is the memcached client. Its Timeout bounds every call (gomemcache's default is
	// 100 ms); set MaxIdleConns to the expected admission concurrency. Default: a client for
	// Servers.
	Client *memcache.Client
	// Servers are the memcached servers (SLUICE_MEMCACHED) when Client is nil; one of the two
	// is required.
	Servers []string
	// Timeout bounds each memcached call of a client built from Servers. Default 50 ms: the
	// limiter fails open, so a slow memcached must not slow admissions down.
	Timeout time.Duration
	// Prefix starts every key. Default "sluice:admit:".
	Prefix string
	// Backoff is how long the limiter skips memcached after an error, so that a dead server
	// costs one timeout per Backoff instead of one per admission (PITFALLS: memcached).
	// Default 1 s.
	Backoff time.Duration
}

// Limiter counts admissions per tenant per minute. Safe for concurrent use.
type Limiter struct {
	cfg Config

	mu        sync.Mutex
	downUntil time.Time
}

// ErrSkipped is returned while the limiter backs off after a memcached error.
var ErrSkipped = errors.New("admitrate: memcached recently failed; skipping it")

// New returns a Limiter, or an "invalid config" error naming the field.
func New(cfg Config) (*Limiter, error) {
	if cfg.Client == nil {
		if len(cfg.Servers) == 0 {
			return nil, errors.New("invalid config: Client or Servers: required")
		}
		if cfg.Timeout <= 0 {
			cfg.Timeout = 50 * time.Millisecond
		}
		cfg.Client = memcache.New(cfg.Servers...)
		cfg.Client.Timeout = cfg.Timeout
		cfg.Client.MaxIdleConns = 64
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "sluice:admit:"
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = time.Second
	}
	return &Limiter{cfg: cfg}, nil
}

// Key returns the memcached key counting tenant's admissions in the minute containing now. The
// tenant is hashed because memcached keys may not hold spaces or control bytes and are at most
// 250 bytes.
func (l *Limiter) Key(tenant string, now time.Time) string {
	sum := sha256.Sum256([]byte(tenant))
	return l.cfg.Prefix + hex.EncodeToString(sum[:]) + ":" + strconv.FormatInt(window(now), 10)
}

// window is the minute containing now, which one counter counts.
func window(now time.Time) int64 { return now.Unix() / 60 }

// retryAfter is the number of seconds from now until the next window (1 to 60).
func retryAfter(now time.Time) int { return 60 - int(now.Unix()%60) }

// grant is how many of n units a budget of limit a minute grants when prev were taken before.
func grant(prev, n, limit int) int { return max(0, min(n, limit-prev)) }

// Local is the limiter's rule on counters in memory, for a caller that replays admissions on a
// virtual clock (sluice simulate): the same windows and the same grants as Reserve, with no
// memcached and nothing kept of a window once a later one is counted. Not safe for concurrent
// use.
type Local struct {
	window int64
	counts map[string]int
}

// Reserve takes up to n units from tenant's budget of limit per minute at now: it returns the
// units granted and, for those refused, the seconds until the window resets. now must not go
// back in time.
func (l *Local) Reserve(tenant string, n, limit int, now time.Time) (granted, retry int) {
	if w := window(now); w != l.window || l.counts == nil {
		l.window, l.counts = w, map[string]int{}
	}
	granted = grant(l.counts[tenant], n, limit)
	l.counts[tenant] += granted
	return granted, retryAfter(now)
}

// Refund gives k units back to tenant's budget of the window last counted.
func (l *Local) Refund(tenant string, k int) {
	if l.counts != nil {
		l.counts[tenant] = max(0, l.counts[tenant]-k)
	}
}

// Reservation is a number of units taken from one tenant's minute. Refund gives units back; the
// total refunded never exceeds what was granted, so a unit is refunded at most once. Not safe
// for concurrent use (one admission owns it).
type Reservation struct {
	l        *Limiter
	key      string
	at       time.Time // the reservation's clock reading, for the back-off of a failed refund
	granted  int
	refunded int
	// RetryAfter is the number of seconds until the window that refused units resets (≥ 1).
	RetryAfter int
}

// Granted returns the units reserved.
func (r *Reservation) Granted() int {
	if r == nil {
		return 0
	}
	return r.granted
}

// Refund returns up to k units to the budget, even when ctx is done (a refund usually follows a
// failure). Errors are ignored: a lost refund over-charges
// the tenant for the rest of the minute, never under-charges it.
func (r *Reservation) Refund(ctx context.Context, k int) {
	if r == nil || k <= 0 {
		return
	}
	k = min(k, r.granted-r.refunded)
	if k <= 0 {
		return
	}
	r.refunded += k
	if _, err := r.l.cfg.Client.Decrement(r.key, uint64(k)); err != nil {
		r.l.failedAt(r.at)
	}
}

// Reserve takes up to n units from tenant's budget of limit per minute at now and returns the
// reservation: Granted() may be less than n when the budget is spent. A memcached failure
// returns an error (the caller fails open) and makes the limiter skip memcached for Backoff.
func (l *Limiter) Reserve(ctx context.Context, tenant string, n, limit int, now time.Time) (*Reservation, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	down := now.Before(l.downUntil)
	l.mu.Unlock()
	if down {
		return nil, ErrSkipped
	}
	key := l.Key(tenant, now)
	v, err := l.cfg.Client.Increment(key, uint64(n))
	if errors.Is(err, memcache.ErrCacheMiss) {
		// Two minutes of TTL: the window is one minute; the second covers clock skew between
		// API processes.
		err = l.cfg.Client.Add(&memcache.Item{Key: key, Value: []byte(strconv.Itoa(n)), Expiration: 120})
		if err == nil {
			v = uint64(n)
		} else if errors.Is(err, memcache.ErrNotStored) {
			v, err = l.cfg.Client.Increment(key, uint64(n))
		}
	}
	if err != nil {
		l.failedAt(now)
		return nil, fmt.Errorf("admitrate: reserve %d for tenant: %w", n, err)
	}
	granted := grant(int(v)-n, n, limit)
	if excess := n - granted; excess > 0 {
		if _, err := l.cfg.Client.Decrement(key, uint64(excess)); err != nil {
			l.failedAt(now)
		}
	}
	return &Reservation{l: l, key: key, at: now, granted: granted, RetryAfter: retryAfter(now)}, nil
}

// Count returns the units currently charged to tenant in the minute containing now (0 when the
// counter does not exist). For tests and operators.
func (l *Limiter) Count(tenant string, now time.Time) (int, error) {
	it, err := l.cfg.Client.Get(l.Key(tenant, now))
	if errors.Is(err, memcache.ErrCacheMiss) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("admitrate: read count: %w", err)
	}
	n, err := strconv.Atoi(string(trimSpace(it.Value)))
	if err != nil {
		return 0, fmt.Errorf("admitrate: count %q: %w", it.Value, err)
	}
	return n, nil
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\r' || b[len(b)-1] == '\n') {
		b = b[:len(b)-1]
	}
	return b
}

func (l *Limiter) failedAt(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.downUntil = now.Add(l.cfg.Backoff)
}
