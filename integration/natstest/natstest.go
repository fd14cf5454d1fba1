// Package natstest runs nats-server with JetStream inside a test, on free loopback ports, for
// tests that stop and start their broker: a single server that can be restarted on the same
// port and store (so clients reconnect to it and the stream survives), and a three-node cluster
// whose nodes can be killed one at a time. Every server is shut down in the test's cleanup.
package natstest

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Server is one test-owned nats-server. Safe for concurrent use.
type Server struct {
	opts server.Options
	mu   sync.Mutex
	srv  *server.Server
}

// Start runs a single JetStream server on a free loopback port, storing under a temporary
// directory of tb.
func Start(tb testing.TB) *Server {
	tb.Helper()
	return StartWith(tb, func(*server.Options) {})
}

// URL is the client URL; it stays the same across restarts.
func (s *Server) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.opts.Port) }

// Name is the server's name (n1, n2, ... in a cluster), as stream cluster info reports leaders.
func (s *Server) Name() string { return s.opts.ServerName }

// Stop shuts the server down and waits for it. Idempotent.
func (s *Server) Stop() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
	}
}

// Running reports whether the server is up.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv != nil
}

// Restart starts the server (again) on the same port and store and waits until it accepts
// connections.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	opts := s.opts // the server keeps and mutates its options
	srv, err := server.NewServer(&opts)
	if err != nil {
		tb.Fatalf("natstest: %v", err)
	}
	logs := &startLog{}
	srv.SetLoggerV2(logs, false, false, false)
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		tb.Fatalf("natstest: server on port %d not ready within 10 s%s", s.opts.Port, logs)
	}
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()
}

// Cluster is a three-node JetStream cluster on loopback.
type Cluster struct {
	Nodes []*Server
}

// StartCluster runs a cluster of n nodes and waits until it has a JetStream meta leader.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	routePorts := make([]int, n)
	routes := make([]string, n)
	for i := range routePorts {
		routePorts[i] = FreePort(tb)
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", routePorts[i])
	}
	c := &Cluster{}
	for i := 0; i < n; i++ {
		s := &Server{opts: server.Options{
			ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: FreePort(tb),
			JetStream: true, StoreDir: tb.TempDir(), NoSigs: true, NoLog: true,
			Cluster: server.ClusterOpts{Name: "sluice-test", Host: "127.0.0.1", Port: routePorts[i]},
			Routes:  server.RoutesFromStr(strings.Join(routes, ",")),
		}}
		c.Nodes = append(c.Nodes, s)
	}
	// Start the nodes concurrently: JetStream in a cluster waits for its peers.
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, s := range c.Nodes {
		wg.Add(1)
		go func(s *Server) {
			defer wg.Done()
			opts := s.opts
			srv, err := server.NewServer(&opts)
			if err != nil {
				errs <- err
				return
			}
			logs := &startLog{}
			srv.SetLoggerV2(logs, false, false, false)
			srv.Start()
			if !srv.ReadyForConnections(20 * time.Second) {
				srv.Shutdown()
				errs <- fmt.Errorf("node %s not ready within 20 s%s", s.opts.ServerName, logs)
				return
			}
			s.mu.Lock()
			s.srv = srv
			s.mu.Unlock()
		}(s)
	}
	wg.Wait()
	close(errs)
	for _, s := range c.Nodes {
		tb.Cleanup(s.Stop)
	}
	for err := range errs {
		tb.Fatalf("natstest: cluster: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, s := range c.Nodes {
			s.mu.Lock()
			ok := s.srv != nil && s.srv.JetStreamIsLeader()
			s.mu.Unlock()
			if ok {
				return c
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("natstest: cluster has no JetStream meta leader after 30 s")
		}
		<-tick.C
	}
}

// URLs is the comma-separated client URLs of every node, for nats.Connect.
func (c *Cluster) URLs() string {
	urls := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		urls[i] = s.URL()
	}
	return strings.Join(urls, ",")
}

// startLog is a test server's logger (they run with NoLog): it keeps the first warnings and
// errors, for the message of a server that did not come up (one of a cluster did not within 20 s
// in a loaded run, and nothing said why).
type startLog struct {
	mu    sync.Mutex
	lines []string
}

// startLogLines bounds what a startLog keeps.
const startLogLines = 20

func (l *startLog) keep(level, format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) < startLogLines {
		l.lines = append(l.lines, level+": "+fmt.Sprintf(format, v...))
	}
}

func (l *startLog) Noticef(string, ...any)         {}
func (l *startLog) Debugf(string, ...any)          {}
func (l *startLog) Tracef(string, ...any)          {}
func (l *startLog) Warnf(format string, v ...any)  { l.keep("warning", format, v...) }
func (l *startLog) Errorf(format string, v ...any) { l.keep("error", format, v...) }
func (l *startLog) Fatalf(format string, v ...any) { l.keep("fatal", format, v...) }

// String is what the server logged, as the end of an error message: empty if nothing.
func (l *startLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) == 0 {
		return " (it logged no warning or error)"
	}
	return "; it logged:\n\t" + strings.Join(l.lines, "\n\t")
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("natstest: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// StartWith runs a single server like Start, with tune applied to its options first (a smaller
// max payload, no JetStream...).
func StartWith(tb testing.TB, tune func(*server.Options)) *Server {
	tb.Helper()
	s := &Server{opts: server.Options{Host: "127.0.0.1", Port: FreePort(tb), JetStream: true,
		StoreDir: tb.TempDir(), NoSigs: true, NoLog: true}}
	tune(&s.opts)
	s.Restart(tb)
	tb.Cleanup(s.Stop)
	return s
}

// JetStreamAt connects a JetStream client to the broker at url for the rest of tb.
func JetStreamAt(tb testing.TB, url string) jetstream.JetStream {
	tb.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		tb.Fatalf("natstest: connect to %s: %v", url, err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("natstest: %v", err)
	}
	return js
}
