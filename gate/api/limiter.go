package api

import (
	"container/list"
	"math"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// Defaults of the failed-authentication limit (Config.FailedAuthPerMinute, FailedAuthSources).
const (
	// DefaultFailedAuthPerMinute is how many failed authentications a source address may make
	// per minute, in a burst or spread out, before its failing requests answer 429.
	DefaultFailedAuthPerMinute = 20
	// DefaultFailedAuthSources bounds the source addresses remembered: about 100 bytes each.
	DefaultFailedAuthSources = 10000
)

// Defaults of the release limit (Config.ReleasesPerMinute).
const (
	// DefaultReleasesPerMinute is how many capacity-release events (POST /v1/releases) one
	// caller may write per minute, in a burst or spread out: 100 a second, far above what an
	// executor frees, while a runaway one cannot fill the outbox.
	DefaultReleasesPerMinute = 6000
	// releaseCallers bounds the callers remembered; tokens are few, so it is rarely reached.
	releaseCallers = 1000
)

// bucketLimiter is a token bucket per key (a source address, a caller): a key that draws more
// than perMinute times a minute is refused until its bucket refills, one draw's worth every
// minute/perMinute. The failed-authentication limit keys it by source address and draws only on
// a failure, so a request with a valid token never touches it and a client sharing an address
// (a NAT, a proxy) with a guesser keeps working; the release limit keys it by caller. At most
// maxSources keys are remembered; when a new one arrives at the bound, the one that drew least
// recently is forgotten (it would have had a full bucket the soonest). Safe for concurrent use.
type bucketLimiter struct {
	perMinute  int
	maxSources int
	now        func() time.Time

	mu      sync.Mutex
	sources map[string]*list.Element // of *bucket, most recently failing at the front
	order   *list.List
}

type bucket struct {
	source string
	tokens float64 // failures still allowed, refilled continuously up to perMinute
	at     time.Time
}

// newBucketLimiter returns a limiter, or nil (no limit) when perMinute is negative; perMinute 0
// means DefaultFailedAuthPerMinute.
func newBucketLimiter(perMinute, maxSources int, now func() time.Time) *bucketLimiter {
	if perMinute < 0 {
		return nil
	}
	if perMinute == 0 {
		perMinute = DefaultFailedAuthPerMinute
	}
	if maxSources <= 0 {
		maxSources = DefaultFailedAuthSources
	}
	if now == nil {
		now = time.Now
	}
	return &bucketLimiter{perMinute: perMinute, maxSources: maxSources, now: now,
		sources: map[string]*list.Element{}, order: list.New()}
}

// take draws one from source's bucket. It reports whether the draw is over the limit and, if
// so, how many seconds remain until the source may draw again (at least 1).
func (l *bucketLimiter) take(source string) (retryAfter int, limited bool) {
	if l == nil {
		return 0, false
	}
	now := l.now()
	rate := float64(l.perMinute) / time.Minute.Seconds() // draws per second
	l.mu.Lock()
	defer l.mu.Unlock()
	var b *bucket
	if e, ok := l.sources[source]; ok {
		b = e.Value.(*bucket)
		if d := now.Sub(b.at).Seconds(); d > 0 {
			b.tokens = math.Min(float64(l.perMinute), b.tokens+d*rate)
		}
		b.at = now
		l.order.MoveToFront(e)
	} else {
		for l.order.Len() >= l.maxSources {
			oldest := l.order.Back()
			delete(l.sources, oldest.Value.(*bucket).source)
			l.order.Remove(oldest)
		}
		b = &bucket{source: source, tokens: float64(l.perMinute), at: now}
		l.sources[source] = l.order.PushFront(b)
	}
	if b.tokens >= 1 {
		b.tokens--
		return 0, false
	}
	return max(1, int(math.Ceil((1-b.tokens)/rate))), true
}

// len returns how many sources are remembered (for tests).
func (l *bucketLimiter) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.order.Len()
}

// sourceOf is the address a request's failures are counted against: SourceOf the peer's IP
// (behind a proxy, the proxy's: failing requests through it then share one bucket).
func sourceOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	return SourceOf(ip)
}

// SourceOf is the one notion of a client's source, for every per-source limit (failed
// authentications here, connections in cmd/sluice/app): an IPv4 address (an IPv4-mapped IPv6
// one counts as IPv4) by itself, an IPv6 address by its /64, since one host commonly holds a
// whole /64.
func SourceOf(ip netip.Addr) string {
	ip = ip.Unmap()
	if ip.Is4() {
		return ip.String()
	}
	p, err := ip.WithZone("").Prefix(64)
	if err != nil {
		return ip.String()
	}
	return p.String()
}
