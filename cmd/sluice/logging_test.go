package main

import (
	"log"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/logq"
	"github.com/sluicehq/sluice/integration/wait"
)

// stuckSink is a log sink that stops reading after its first line, as a full pipe nobody reads.
type stuckSink struct {
	mu      sync.Mutex
	first   strings.Builder
	release chan struct{}
}

func (s *stuckSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	if s.first.Len() == 0 {
		s.first.Write(p)
		s.mu.Unlock()
		return len(p), nil
	}
	s.mu.Unlock()
	<-s.release
	return len(p), nil
}

// TestLibraryLogsDoNotBlock: once useDriverLog has routed them, lines of the standard log package
// (http.Server's own errors, any library's log.Print) go through the process's log queue, so a
// sink that stopped reading drops them instead of blocking the caller; they come out as JSON.
// Without the routing the package writes to stderr itself.
func TestLibraryLogsDoNotBlock(t *testing.T) {
	prev := slog.Default()
	t.Cleanup(func() { slog.SetDefault(prev) })
	sink := &stuckSink{release: make(chan struct{})}
	q, err := logq.New(logq.Config{Sink: sink, Capacity: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(sink.release)
		_ = q.Close(t.Context())
	})
	useDriverLog(slog.New(q.Handler()))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 10_000 {
			log.Printf("http: Accept error: line %d", i)
		}
	}()
	wait.Until(t, 30*time.Second, "10,000 log.Printf calls to return with the sink stuck", func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	})
	if q.Dropped() == 0 {
		t.Errorf("no line dropped with the sink stuck: the log package did not go through the queue")
	}
	sink.mu.Lock()
	first := sink.first.String()
	sink.mu.Unlock()
	if !strings.HasPrefix(first, "{") || !strings.Contains(first, "http: Accept error") {
		t.Errorf("the first line written is not the JSON of a log.Printf line: %q", first)
	}
}
