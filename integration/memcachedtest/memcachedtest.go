// Package memcachedtest runs a memcached server owned by one test, on a free loopback port, so
// that the test can stop and restart it (SPEC §12 invariant 7) without disturbing the shared
// server other tests use. The server is stopped in the test's cleanup.
package memcachedtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Binary is the memcached executable; SLUICE_TEST_MEMCACHED overrides it.
func Binary() string {
	if v := os.Getenv("SLUICE_TEST_MEMCACHED"); v != "" {
		return v
	}
	return "/usr/bin/memcached"
}

// Server is a test-owned memcached. Its methods are safe for concurrent use.
type Server struct {
	tb   testing.TB
	port int

	mu  sync.Mutex
	cmd *exec.Cmd
}

// Start starts a memcached on a free loopback port and registers its stop in tb.Cleanup.
func Start(tb testing.TB) *Server {
	tb.Helper()
	if _, err := os.Stat(Binary()); err != nil {
		tb.Fatalf("memcachedtest: no memcached binary at %s (install memcached or set SLUICE_TEST_MEMCACHED): %v", Binary(), err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("memcachedtest: find a free port: %v", err)
	}
	s := &Server{tb: tb, port: l.Addr().(*net.TCPAddr).Port}
	l.Close()
	tb.Cleanup(s.Stop)
	s.Restart()
	return s
}

// Addr returns host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Restart starts the server again on the same port (after Stop) and waits until it accepts
// connections. It fails the test if that takes more than 10 s.
func (s *Server) Restart() {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return
	}
	args := []string{"-l", "127.0.0.1", "-p", strconv.Itoa(s.port), "-U", "0", "-m", "16"}
	if os.Geteuid() == 0 {
		args = append(args, "-u", "memcache")
	}
	cmd := exec.Command(Binary(), args...)
	if err := cmd.Start(); err != nil {
		s.tb.Fatalf("memcachedtest: start %s: %v", Binary(), err)
	}
	s.cmd = cmd
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := net.DialTimeout("tcp", s.Addr(), 200*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			s.tb.Fatalf("memcachedtest: memcached on %s did not accept connections within 10 s: %v", s.Addr(), err)
		}
		<-tick.C // the process is starting: poll the port until the deadline
	}
}

// Stop kills the server and waits for it to exit; the port is then refused. Idempotent.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// String describes the server for test logs.
func (s *Server) String() string { return fmt.Sprintf("memcached %s", s.Addr()) }

// Shared returns the address of the memcached that CI and every developer machine run
// (deploy/local/setup.sh), or SLUICE_TEST_MEMCACHED_ADDR, failing tb with a clear message if it
// does not answer. Tests that use it give every key a random name, so parallel tests never share
// one; tests that stop memcached Start their own.
func Shared(tb testing.TB) string {
	tb.Helper()
	addr := SharedAddr()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		tb.Fatalf("memcached is not reachable at %s (run deploy/local/setup.sh or set SLUICE_TEST_MEMCACHED_ADDR): %v", addr, err)
	}
	c.Close()
	return addr
}

// SharedAddr returns the address Shared checks: SLUICE_TEST_MEMCACHED_ADDR, or 127.0.0.1:11211.
func SharedAddr() string {
	if addr := os.Getenv("SLUICE_TEST_MEMCACHED_ADDR"); addr != "" {
		return addr
	}
	return "127.0.0.1:11211"
}
