package app

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// Bounds of the HTTP listeners (API, and the ops endpoints of processes without the API
// role). No route streams: every answer is one JSON document, or the metrics text.
const (
	// DefaultMaxConns bounds a listener's open connections (Options.MaxConns); past it,
	// Accept waits for one to close. It is well above api.DefaultMaxRequests, so that the
	// executor's callbacks still find connections while other callers hold their share.
	DefaultMaxConns = 1024
	// readTimeout bounds reading a whole request, body included: a 32 MiB batch needs
	// about 0.5 MiB/s, and a slow client cannot hold a connection and its goroutine longer.
	readTimeout = 60 * time.Second
	// writeTimeout bounds the time from the end of the request's headers to the end of the
	// answer: generous for the slowest route, finite for a client that stops reading.
	writeTimeout = 90 * time.Second
	// readHeaderTimeout bounds reading the request line and headers.
	readHeaderTimeout = 10 * time.Second
	// idleTimeout closes keep-alive connections left idle.
	idleTimeout = 2 * time.Minute
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

// limitListener accepts at most n connections open at once: Accept waits while n are open.
// Safe for concurrent use.
type limitListener struct {
	net.Listener
	slots     chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// newLimitListener wraps l to hold at most n connections open (n <= 0: no bound).
func newLimitListener(l net.Listener, n int) net.Listener {
	if n <= 0 {
		return l
	}
	return &limitListener{Listener: l, slots: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.slots }}, nil
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
