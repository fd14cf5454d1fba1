package app

import (
	"context"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// memcachedProbe answers "is the gate store reachable?" for /v1/status, /readyz and the metrics.
// The answer is cached for a second so that a burst of scrapes and status calls costs one ping,
// and a dead server costs at most one timeout per second. Safe for concurrent use.
type memcachedProbe struct {
	client *memcache.Client // nil: no servers configured

	mu      sync.Mutex
	at      time.Time
	last    bool
	pending chan struct{}
}

func newMemcachedProbe(servers []string) *memcachedProbe {
	if len(servers) == 0 {
		return &memcachedProbe{}
	}
	c := memcache.New(servers...)
	c.Timeout = 200 * time.Millisecond
	return &memcachedProbe{client: c}
}

// Reachable pings every configured server, or returns the answer of the last second. It waits
// at most until ctx ends.
func (p *memcachedProbe) Reachable(ctx context.Context) bool {
	if p.client == nil {
		return false
	}
	p.mu.Lock()
	if time.Since(p.at) < time.Second {
		v := p.last
		p.mu.Unlock()
		return v
	}
	if p.pending == nil {
		done := make(chan struct{})
		p.pending = done
		go func() { // owned by the probe: bounded by the client's 200 ms timeout per server
			ok := p.client.Ping() == nil
			p.mu.Lock()
			p.at, p.last, p.pending = time.Now(), ok, nil
			p.mu.Unlock()
			close(done)
		}()
	}
	done := p.pending
	p.mu.Unlock()
	select {
	case <-done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.last
	case <-ctx.Done():
		return false
	}
}
