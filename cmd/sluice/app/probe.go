package app

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/gate/api"
)

// memcachedProbe answers "is the gate store reachable?" for /v1/status, /readyz and the metrics,
// from a ping at most probeMaxAge old (probe): a burst of scrapes and status calls costs one
// ping, and a dead server at most one timeout a second. Safe for concurrent use.
type memcachedProbe struct {
	pings *probe // nil: no servers configured
}

func newMemcachedProbe(servers []string) *memcachedProbe {
	if len(servers) == 0 {
		return &memcachedProbe{}
	}
	c := memcache.New(servers...)
	c.Timeout = 200 * time.Millisecond // per server: it bounds the ping
	return &memcachedProbe{pings: newProbe(func(context.Context) error { return c.Ping() })}
}

// Reachable reports whether every configured server answered the last ping, waiting at most
// until ctx ends.
func (p *memcachedProbe) Reachable(ctx context.Context) bool {
	return p.pings != nil && p.pings.Read(ctx) == nil
}

// probeMaxAge is how old an answer of probe may be: /readyz needs no token and no request slot,
// so a flood of it costs at most one database round trip a second.
const probeMaxAge = time.Second

// probe answers a check (/readyz's database check, memcached's ping) from a reading at most
// probeMaxAge old, taken by one caller at a time while the others wait for it. Without it each
// /readyz would read schema_migrations on the pool that /start and /complete use, and while the
// database is slow to answer a flood of unauthenticated /readyz would hold every connection of
// it, the executor's callbacks waiting behind. Safe for concurrent use.
type probe struct {
	check func(context.Context) error // bounds its own wait
	now   func() time.Time

	mu      sync.Mutex
	at      time.Time // when the kept reading began; zero: none yet
	last    error
	pending chan struct{} // closed when the reading in progress ends; nil: none
}

func newProbe(check func(context.Context) error) *probe {
	return &probe{check: check, now: time.Now}
}

// Read returns the kept reading if it began less than probeMaxAge ago; else it takes one, or
// waits for the one in progress, at most until ctx ends (then it returns ctx's error as not
// ready). The caller that takes the reading runs it without ctx's cancellation, so that a client
// going away does not hand every waiter a reading that failed for that reason alone; check
// bounds it.
func (p *probe) Read(ctx context.Context) error {
	p.mu.Lock()
	if !p.at.IsZero() && p.now().Sub(p.at) < probeMaxAge {
		err := p.last
		p.mu.Unlock()
		return err
	}
	if done := p.pending; done != nil {
		p.mu.Unlock()
		select {
		case <-done:
			p.mu.Lock()
			defer p.mu.Unlock()
			return p.last
		case <-ctx.Done():
			return api.NotReady(api.ReadyReasonUnknown, fmt.Errorf("waiting for the probe: %w", ctx.Err()))
		}
	}
	done := make(chan struct{})
	p.pending = done
	began := p.now()
	p.mu.Unlock()
	err := p.check(context.WithoutCancel(ctx))
	p.mu.Lock()
	// Dated from its start: a reading that took long is as old as the state it saw.
	p.at, p.last, p.pending = began, err, nil
	p.mu.Unlock()
	close(done)
	return err
}
