package app

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/gate/api"
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

// readyMaxAge is how old an answer of readyProbe may be: /readyz needs no token and no request
// slot, so a flood of it costs at most one database round trip a second.
const readyMaxAge = time.Second

// readyProbe answers /readyz's database check from a reading at most readyMaxAge old, taken by
// one caller at a time while the others wait for it. Each /readyz used to read schema_migrations
// on the pool that /start and /complete use; while the database was slow to answer, a flood of
// unauthenticated /readyz held every connection of it, and the executor's callbacks waited
// behind (issue 30). Safe for concurrent use.
type readyProbe struct {
	check func(context.Context) error // bounds its own wait
	now   func() time.Time

	mu      sync.Mutex
	at      time.Time // when the kept reading began; zero: none yet
	last    error
	pending chan struct{} // closed when the reading in progress ends; nil: none
}

func newReadyProbe(check func(context.Context) error) *readyProbe {
	return &readyProbe{check: check, now: time.Now}
}

// Ready returns the kept reading if it began less than readyMaxAge ago; else it takes one, or
// waits for the one in progress, at most until ctx ends (then it returns ctx's error as not
// ready). The caller that takes the reading runs it without ctx's cancellation, so that a client
// going away does not hand every waiter a reading that failed for that reason alone; check
// bounds it.
func (p *readyProbe) Ready(ctx context.Context) error {
	p.mu.Lock()
	if !p.at.IsZero() && p.now().Sub(p.at) < readyMaxAge {
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
			return api.NotReady(api.ReadyReasonUnknown, fmt.Errorf("waiting for the readiness probe: %w", ctx.Err()))
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
