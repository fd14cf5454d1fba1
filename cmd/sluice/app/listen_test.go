package app

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"
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
