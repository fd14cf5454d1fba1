package app

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestHTTPServerBounds: the API and ops servers bound every phase of a request and the header
// size, so a slow client cannot hold a connection and its goroutine forever.
func TestHTTPServerBounds(t *testing.T) {
	s := newHTTPServer(nil)
	if s.ReadHeaderTimeout <= 0 || s.ReadTimeout <= 0 || s.WriteTimeout <= 0 || s.IdleTimeout <= 0 {
		t.Errorf("timeouts: header %v, read %v, write %v, idle %v; want all set", s.ReadHeaderTimeout, s.ReadTimeout, s.WriteTimeout, s.IdleTimeout)
	}
	if s.WriteTimeout <= s.ReadTimeout {
		t.Errorf("write timeout %v within the read timeout %v: a slow body would leave no time to answer", s.WriteTimeout, s.ReadTimeout)
	}
	if s.MaxHeaderBytes != 64<<10 {
		t.Errorf("MaxHeaderBytes %d, want 64 KiB", s.MaxHeaderBytes)
	}
}

// TestLimitListener: at most n connections are open at once; Accept waits for one to close,
// and Close ends a waiting Accept.
func TestLimitListener(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newLimitListener(inner, 2)
	t.Cleanup(func() { l.Close() })
	accepted := make(chan net.Conn, 8)
	acceptErr := make(chan error, 1)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				acceptErr <- err
				return
			}
			accepted <- c
		}
	}()
	for range 3 {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	first := <-accepted
	<-accepted
	select {
	case <-accepted:
		t.Fatal("a third connection was accepted while two were open")
	case <-time.After(200 * time.Millisecond):
	}
	first.Close()
	first.Close() // a second Close gives back no second slot
	select {
	case c := <-accepted:
		defer c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("the third connection was not accepted after one closed")
	}
	l.Close()
	select {
	case err := <-acceptErr:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a waiting Accept")
	}
	if newLimitListener(inner, -1) != inner {
		t.Error("a negative bound should leave the listener as it is")
	}
}

// TestShutdownClosesFreshConns: a connection that never sent a request does not hold a stopping
// server's Shutdown. net/http counts it busy for up to 5 s; the deadline here is 4 s, so Shutdown
// returns its context's error unless the server closed the connection itself. The connection
// sees it closed, and a connection opened meanwhile is closed at once.
func TestShutdownClosesFreshConns(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newHTTPServer(http.NotFoundHandler())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	idle, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	// The server has the connection once it answers a request on another one.
	if resp, err := http.Get("http://" + ln.Addr().String() + "/"); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown with a connection that sent nothing: %v", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("Serve: %v", err)
	}
	_ = idle.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := idle.Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection that sent nothing is still open")
	}
}

// TestConnLimiterSources: a source outside the exempt prefixes holds at most perSource
// connections, and such sources together at most max-reserved; past either bound a new
// connection is closed at once and counted, without holding up Accept. An exempt source is never
// capped per source and may take the reserved connections; the connections closed at accept give
// their slots back, and a source that closed one may open another.
func TestConnLimiterSources(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "refused"}, []string{"reason"})
	l := newConnLimiter(inner, connLimits{max: 6, perSource: 2, reserved: 2,
		exempt: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, refused: refused})
	accepted := make(chan net.Conn, 16)
	served := make(chan struct{})
	go func() { // owned by the test: ends when the cleanup closes l
		defer close(served)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-served
		close(accepted)
		for c := range accepted {
			c.Close()
		}
	})
	dial := func(last byte) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, last)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// readEnds reads c until within and reports whether the server closed it (the read ends with
	// EOF or a reset) rather than keeping it open (the read times out).
	readEnds := func(c net.Conn, within time.Duration) bool {
		_ = c.SetReadDeadline(time.Now().Add(within))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		return err != nil && !(errors.As(err, &ne) && ne.Timeout())
	}
	// closedByServer waits for the close of a refused connection: it comes at once, so the
	// deadline only bounds a broken refusal. keptOpen watches a kept connection for a while: a
	// close of it would come at once too, so a short watch finds one.
	closedByServer := func(c net.Conn) bool { return readEnds(c, 10*time.Second) }
	keptOpen := func(c net.Conn) bool { return !readEnds(c, 300*time.Millisecond) }
	// Every connection taken stays referenced until the test ends: a server side dropped would
	// be closed by its finalizer whenever the collector ran, and its client would then read an
	// end the limiter never made (seen once in 30 runs under -race).
	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	take := func(what string) net.Conn {
		t.Helper()
		select {
		case c := <-accepted:
			held = append(held, c)
			return c
		case <-time.After(5 * time.Second):
			t.Fatalf("%s was not accepted", what)
			return nil
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(refused)
	count := func(reason string) float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				if m.GetLabel()[0].GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
		return 0
	}

	a1, a2 := dial(2), dial(2)
	take("127.0.0.2's first")
	first := take("127.0.0.2's second")
	if a3 := dial(2); !closedByServer(a3) || count("source") != 1 {
		t.Fatalf("a third connection of one source was kept (refused by source: %v)", count("source"))
	}
	dial(3)
	dial(3)
	take("127.0.0.3's first")
	take("127.0.0.3's second")
	// Four bounded connections are open: the other sources' share of 6-2 is full.
	if b := dial(4); !closedByServer(b) || count("reserved") != 1 {
		t.Fatalf("a fifth connection of bounded sources was kept (refused by reserve: %v)", count("reserved"))
	}
	// The exempt source takes the two reserved connections, past the per-source bound.
	dial(1)
	dial(1)
	take("the exempt source's first")
	take("the exempt source's second")
	for _, c := range []net.Conn{a1, a2} {
		if !keptOpen(c) {
			t.Fatal("a connection within its source's bound was closed")
		}
	}
	// Closing one of 127.0.0.2's frees its place: the source may connect again.
	first.Close()
	dial(2)
	take("127.0.0.2's connection after one closed")
}
