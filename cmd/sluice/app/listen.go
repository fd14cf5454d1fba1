package app

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/gate/api"
)

// Bounds of the HTTP listeners (API, and the ops endpoints of processes without the API
// role). Every answer is one JSON document, or the metrics text, except a job's events stream
// (follow=1), which moves its write deadline on with each event it sends.
const (
	// DefaultMaxConns bounds a listener's open connections (Options.MaxConns); past it,
	// Accept waits for one to close. It is well above api.DefaultMaxRequests, so that the
	// executor's callbacks still find connections while other callers hold their share.
	DefaultMaxConns = 1024
	// DefaultReservedConns of DefaultMaxConns are kept for the executors' addresses
	// (Options.ReservedConns): one connection per callback in flight, for a few hundred jobs
	// in flight at once, with the other sources still holding 896.
	DefaultReservedConns = 128
	// DefaultMaxConnsPerSource bounds one source's connections (Options.MaxConnsPerSource):
	// a client or a proxy pool rarely needs more, and 14 sources are needed to fill the other
	// sources' share of DefaultMaxConns.
	DefaultMaxConnsPerSource = 64
	// readTimeout bounds reading a whole request, body included: a 32 MiB batch needs
	// about 0.5 MiB/s, and a slow client cannot hold a connection and its goroutine longer.
	readTimeout = 60 * time.Second
	// writeTimeout bounds the time from the end of the request's headers to the end of the
	// answer: generous for the slowest route, finite for a client that stops reading.
	writeTimeout = 90 * time.Second
	// readHeaderTimeout bounds reading the request line and headers.
	readHeaderTimeout = 10 * time.Second
	// idleTimeout closes keep-alive connections left idle: short, since an idle connection
	// holds a slot of MaxConns and of its source's MaxConnsPerSource; a client that comes back
	// later dials again.
	idleTimeout = 30 * time.Second
	// maxHeaderBytes bounds the request line and headers (net/http's default is 1 MiB).
	maxHeaderBytes = 64 << 10
)

// httpServer is the server of an API, ops or metrics listener: an http.Server with every timeout
// set, which knows its connections that have not sent a request yet.
type httpServer struct {
	*http.Server
	mu       sync.Mutex
	fresh    map[net.Conn]struct{} // accepted, no request read yet (http.StateNew)
	stopping bool
}

// newHTTPServer returns the server for an API, ops or metrics listener.
func newHTTPServer(h http.Handler) *httpServer {
	s := &httpServer{fresh: map[net.Conn]struct{}{}}
	s.Server = &http.Server{Handler: h, ReadHeaderTimeout: readHeaderTimeout, ReadTimeout: readTimeout,
		WriteTimeout: writeTimeout, IdleTimeout: idleTimeout, MaxHeaderBytes: maxHeaderBytes,
		ConnState: s.track}
	return s
}

func (s *httpServer) track(c net.Conn, state http.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case state == http.StateNew && s.stopping:
		_ = c.Close()
	case state == http.StateNew:
		s.fresh[c] = struct{}{}
	default:
		delete(s.fresh, c)
	}
}

// Shutdown is http.Server.Shutdown, except that it first closes the connections that have not
// sent a request: Shutdown counts such a connection (a client's spare keep-alive dial) as busy
// for up to 5 s, and a stopping process waited that long for nothing (TestOpsLogStalledSink failed
// so once in four runs). No request of theirs was read, so none is cut off: the client sees a
// closed connection, as it would from a process that had already stopped.
func (s *httpServer) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.stopping = true
	for c := range s.fresh {
		_ = c.Close()
	}
	clear(s.fresh)
	s.mu.Unlock()
	return s.Server.Shutdown(ctx)
}

// connLimits are the bounds of a listener's connections (Options.MaxConns, MaxConnsPerSource,
// ReservedConns, ExecutorSources), resolved: a value <= 0 is no bound.
type connLimits struct {
	max       int            // connections open at once, all sources
	perSource int            // connections open at once from one source outside exempt
	reserved  int            // of max, kept for exempt sources
	exempt    []netip.Prefix // the executors' addresses: no per-source bound, may take reserved
	// refused, if set, counts connections closed at accept: reason "source" (past perSource)
	// or "reserved" (past max-reserved).
	refused *prometheus.CounterVec
}

// limitListener holds at most max connections open at once: Accept waits while max are open.
// A connection from a source outside exempt is closed as soon as it is accepted when its source
// already holds perSource, or when such sources together hold max-reserved: Accept must not wait
// for them, since the kernel hands connections over in arrival order and an executor's would then
// wait behind theirs. An executor's connection is never closed here; it only waits, as every
// connection does, while max are open, which the other sources alone can no longer reach.
// Safe for concurrent use.
type limitListener struct {
	net.Listener
	lim       connLimits
	slots     chan struct{} // one per open connection; nil: no bound
	done      chan struct{}
	closeOnce sync.Once

	mu     sync.Mutex
	others int            // open connections of sources outside exempt
	bySrc  map[string]int // open connections per source outside exempt
}

// newLimitListener wraps l to hold at most n connections open (n <= 0: no bound).
func newLimitListener(l net.Listener, n int) net.Listener {
	return newConnLimiter(l, connLimits{max: n})
}

// newConnLimiter wraps l in the bounds of lim; with no bound at all it returns l.
func newConnLimiter(l net.Listener, lim connLimits) net.Listener {
	if lim.max <= 0 && lim.perSource <= 0 {
		return l
	}
	ll := &limitListener{Listener: l, lim: lim, done: make(chan struct{}), bySrc: map[string]int{}}
	if lim.max > 0 {
		ll.slots = make(chan struct{}, lim.max)
	}
	return ll
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		if l.slots != nil {
			select {
			case l.slots <- struct{}{}:
			case <-l.done:
				return nil, net.ErrClosed
			}
		}
		c, err := l.Listener.Accept()
		if err != nil {
			l.freeSlot()
			return nil, err
		}
		src, counted := l.source(c.RemoteAddr())
		if !counted {
			return &limitConn{Conn: c, release: l.freeSlot}, nil
		}
		if reason := l.admit(src); reason != "" {
			// Counted before the close: whoever sees the connection refused finds it counted.
			if l.lim.refused != nil {
				l.lim.refused.WithLabelValues(reason).Inc()
			}
			_ = c.Close()
			l.freeSlot()
			continue
		}
		return &limitConn{Conn: c, release: func() { l.leave(src); l.freeSlot() }}, nil
	}
}

// source returns the source key of a connection from addr and whether its source is bounded
// (outside the exempt prefixes). An address that is not IP (a test's pipe) is exempt.
func (l *limitListener) source(addr net.Addr) (string, bool) {
	ap, err := netip.ParseAddrPort(addr.String())
	if err != nil {
		return "", false
	}
	ip := ap.Addr().Unmap()
	for _, p := range l.lim.exempt {
		if p.Contains(ip) {
			return "", false
		}
	}
	return api.SourceOf(ip), true
}

// admit counts a connection of src, or returns why it is refused.
func (l *limitListener) admit(src string) (reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.lim.perSource > 0 && l.bySrc[src] >= l.lim.perSource:
		return "source"
	case l.lim.max > 0 && l.lim.reserved > 0 && l.others >= l.lim.max-l.lim.reserved:
		return "reserved"
	}
	l.others++
	l.bySrc[src]++
	return ""
}

func (l *limitListener) leave(src string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.others--
	if l.bySrc[src]--; l.bySrc[src] <= 0 {
		delete(l.bySrc, src)
	}
}

func (l *limitListener) freeSlot() {
	if l.slots != nil {
		<-l.slots
	}
}

func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

// limitConn gives its slot back once, on the first Close.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
