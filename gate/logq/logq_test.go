package logq_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/logq"
	"github.com/sluicehq/sluice/integration/wait"
)

// blockingSink is a sink whose writes wait until release is closed, then go to out.
type blockingSink struct {
	release chan struct{}
	entered chan struct{} // closed at the first Write
	once    sync.Once
	mu      sync.Mutex
	out     bytes.Buffer
}

func newBlockingSink() *blockingSink {
	return &blockingSink{release: make(chan struct{}), entered: make(chan struct{})}
}

func (s *blockingSink) Write(p []byte) (int, error) {
	s.once.Do(func() { close(s.entered) })
	<-s.release
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.Write(p)
}

func (s *blockingSink) lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Split(strings.TrimSuffix(s.out.String(), "\n"), "\n")
}

// syncBuffer is a sink that takes every line at once.
type syncBuffer struct {
	mu  sync.Mutex
	out bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String()
}

func newQueue(t *testing.T, cfg logq.Config) *logq.Queue {
	t.Helper()
	q, err := logq.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close(context.Background()) })
	return q
}

// TestBlockedSinkDropsAndCounts: with a sink that never returns, 100,000 logging calls from 8
// goroutines all return, the lines beyond the queue are dropped and counted, and once the sink
// takes lines again the next line written says how many were dropped before it.
func TestBlockedSinkDropsAndCounts(t *testing.T) {
	sink := newBlockingSink()
	const capacity = 1000
	q := newQueue(t, logq.Config{Sink: sink, Capacity: capacity})
	log := slog.New(q.Handler())
	log.Info("first") // the writer takes it and blocks in the sink's Write
	<-sink.entered

	const goroutines, perG = 8, 100_000 / 8
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range perG {
				log.Info("line", "g", g, "i", i)
			}
		})
	}
	returned := make(chan struct{})
	go func() { wg.Wait(); close(returned) }()
	select {
	case <-returned:
	case <-ctx.Done():
		t.Fatalf("100,000 logging calls did not return within 30 s with the sink blocked (dropped so far: %d)", q.Dropped())
	}
	const calls = goroutines * perG
	dropped := q.Dropped()
	if want := uint64(calls - capacity); dropped != want {
		t.Errorf("Dropped() = %d with a blocked sink, want %d (%d calls, %d queued)", dropped, want, calls, capacity)
	}

	close(sink.release)
	// Once the writer has taken a line from the full queue there is room for one more.
	wait.Until(t, 30*time.Second, "the writer to take a queued line", func() bool { return len(sink.lines()) >= 2 })
	log.Info("after")
	wait.Until(t, 30*time.Second, "the queue to be written", func() bool { return len(sink.lines()) == 1+capacity+1 })
	lines := sink.lines()
	for i, line := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %d is not JSON: %v: %s", i, err, line)
		}
		n, has := m[logq.DroppedKey]
		switch {
		case i == 1 && !has:
			t.Errorf("the first line written after the sink recovered has no %s: %s", logq.DroppedKey, line)
		case i == 1 && n != float64(dropped):
			t.Errorf("%s = %v, want %d (the lines dropped before it): %s", logq.DroppedKey, n, dropped, line)
		case i != 1 && has:
			t.Errorf("line %d has %s though nothing was dropped since the line before it: %s", i, logq.DroppedKey, line)
		}
	}
	if q.Dropped() != dropped {
		t.Errorf("Dropped() went from %d to %d after the sink recovered", dropped, q.Dropped())
	}
	if !strings.Contains(lines[len(lines)-1], `"msg":"after"`) {
		t.Errorf("last line = %s, want the line logged after the sink recovered", lines[len(lines)-1])
	}
	if err := q.Close(context.Background()); err != nil {
		t.Errorf("Close after the queue was written: %v", err)
	}
}

// TestCloseGivesUpOnBlockedSink: Close with a sink that never returns gives up after its 2 s
// bound and says how many lines were left.
func TestCloseGivesUpOnBlockedSink(t *testing.T) {
	sink := newBlockingSink()
	defer close(sink.release) // lets the writer goroutine end after the test
	q, err := logq.New(logq.Config{Sink: sink})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(q.Handler())
	for i := range 10 {
		log.Info("line", "i", i)
	}
	<-sink.entered
	start := time.Now()
	err = q.Close(context.Background())
	elapsed := time.Since(start)
	var gaveUp *logq.GaveUpError
	if !errors.As(err, &gaveUp) || !errors.Is(err, logq.ErrGaveUp) {
		t.Fatalf("Close with a blocked sink = %v, want a *GaveUpError", err)
	}
	if gaveUp.Left != 10 {
		t.Errorf("Close says %d lines left, want 10 (one in the blocked Write, nine queued)", gaveUp.Left)
	}
	if elapsed >= 3*time.Second {
		t.Errorf("Close took %s with a blocked sink, want at most its 2 s bound", elapsed)
	}
	if err2 := q.Close(context.Background()); err2 != err {
		t.Errorf("second Close = %v, want the first one's %v", err2, err)
	}
	log.Info("after close")
	if got := q.Dropped(); got != 1 {
		t.Errorf("Dropped() = %d after a line logged past Close, want 1", got)
	}
}

// TestCloseHonoursContext: Close gives up when its context ends before the bound.
func TestCloseHonoursContext(t *testing.T) {
	sink := newBlockingSink()
	defer close(sink.release)
	q, err := logq.New(logq.Config{Sink: sink, CloseTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	slog.New(q.Handler()).Info("x")
	<-sink.entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := q.Close(ctx); !errors.Is(err, logq.ErrGaveUp) {
		t.Fatalf("Close with an ended context = %v, want ErrGaveUp", err)
	}
}

// TestOrderAndNothingDropped: with a sink that keeps up, every line is written, in the order
// logged, none carries log_dropped, and Close returns nil once they are written. As many lines
// as the queue holds are logged, so that none could be dropped however the writer is scheduled.
func TestOrderAndNothingDropped(t *testing.T) {
	var sink syncBuffer
	q, err := logq.New(logq.Config{Sink: &sink})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(q.Handler())
	const n = 4096 // the default capacity
	for i := range n {
		log.Info("line", "i", i)
	}
	if err := q.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if d := q.Dropped(); d != 0 {
		t.Errorf("Dropped() = %d with a sink that keeps up, want 0", d)
	}
	sc := bufio.NewScanner(strings.NewReader(sink.String()))
	next := 0
	for sc.Scan() {
		var m struct {
			I       int  `json:"i"`
			Dropped *int `json:"log_dropped"`
		}
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("not JSON: %s", sc.Text())
		}
		if m.Dropped != nil {
			t.Fatalf("line %d carries log_dropped with nothing dropped: %s", next, sc.Text())
		}
		if m.I != next {
			t.Fatalf("line %d is i=%d: out of order", next, m.I)
		}
		next++
	}
	if next != n {
		t.Errorf("%d lines written, want %d", next, n)
	}
}

// TestSameBytesAsJSONHandler: the queue's handler, derived with WithAttrs and WithGroup in
// several orders and at several levels, writes exactly what slog.JSONHandler writes for the
// same records (time removed from both, the clock being the only difference).
func TestSameBytesAsJSONHandler(t *testing.T) {
	noTime := func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}
	opts := &slog.HandlerOptions{Level: slog.LevelWarn, ReplaceAttr: noTime}
	derive := map[string]func(slog.Handler) slog.Handler{
		"root": func(h slog.Handler) slog.Handler { return h },
		"attrs": func(h slog.Handler) slog.Handler {
			return h.WithAttrs([]slog.Attr{slog.String("component", "drainer")})
		},
		"group": func(h slog.Handler) slog.Handler { return h.WithGroup("g") },
		"empty group": func(h slog.Handler) slog.Handler {
			return h.WithGroup("")
		},
		"attrs group attrs": func(h slog.Handler) slog.Handler {
			return h.WithAttrs([]slog.Attr{slog.Int("a", 1)}).WithGroup("g").WithAttrs([]slog.Attr{slog.Int("b", 2)})
		},
		"nested groups": func(h slog.Handler) slog.Handler {
			return h.WithGroup("outer").WithAttrs([]slog.Attr{slog.Bool("x", true)}).WithGroup("inner")
		},
	}
	emit := func(log *slog.Logger) {
		log.Debug("below the level", "k", 1)
		log.Info("below the level too")
		log.Warn("job transition", "job_id", int64(42), "tenant", "acme", "from", "queued", "to", "dispatched",
			"version", 3, "waited_ms", 12.5, "error", errors.New("boom"))
		log.Error("nested", slog.Group("detail", "n", 1, "s", "x\\\n\"q\" <&>"), "d", time.Second, "empty", slog.Group("none"))
		log.With("late", "y").Warn("with")
		log.WithGroup("late_group").Error("late group", "z", []int{1, 2})
	}
	for name, d := range derive {
		t.Run(name, func(t *testing.T) {
			var want bytes.Buffer
			emit(slog.New(d(slog.NewJSONHandler(&want, opts))))
			var got syncBuffer
			q, err := logq.New(logq.Config{Sink: &got, Options: opts})
			if err != nil {
				t.Fatal(err)
			}
			emit(slog.New(d(q.Handler())))
			if err := q.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got.String() != want.String() {
				t.Errorf("logq wrote\n%s\nslog.JSONHandler wrote\n%s", got.String(), want.String())
			}
			if n := strings.Count(want.String(), "\n"); n != 4 {
				t.Errorf("%d lines, want 4 (two records below the level)", n)
			}
		})
	}
}

// TestDroppedKeyTopLevel: log_dropped is a top-level member of the line written after drops,
// also when the handler has open groups.
func TestDroppedKeyTopLevel(t *testing.T) {
	sink := newBlockingSink()
	q := newQueue(t, logq.Config{Sink: sink, Capacity: 1})
	log := slog.New(q.Handler().WithGroup("g"))
	log.Info("one", "a", 1) // taken by the writer, which blocks
	<-sink.entered
	log.Info("two", "a", 2) // queued
	log.Info("three", "a", 3)
	log.Info("four", "a", 4)
	close(sink.release)
	wait.Until(t, 30*time.Second, "two lines written", func() bool { return len(sink.lines()) == 2 })
	var m map[string]any
	if err := json.Unmarshal([]byte(sink.lines()[1]), &m); err != nil {
		t.Fatal(err)
	}
	if m[logq.DroppedKey] != float64(2) || m["g"].(map[string]any)["a"] != float64(2) {
		t.Errorf("line after two drops = %v, want log_dropped 2 at the top level and g.a = 2", m)
	}
}

// TestConfigValidation: invalid fields are named.
func TestConfigValidation(t *testing.T) {
	for _, c := range []struct {
		cfg   logq.Config
		field string
	}{
		{logq.Config{}, "Sink"},
		{logq.Config{Sink: io.Discard, Capacity: -1}, "Capacity"},
		{logq.Config{Sink: io.Discard, CloseTimeout: -time.Second}, "CloseTimeout"},
	} {
		_, err := logq.New(c.cfg)
		if err == nil || !strings.HasPrefix(err.Error(), fmt.Sprintf("invalid config: %s: ", c.field)) {
			t.Errorf("New(%+v) = %v, want an invalid config error naming %s", c.cfg, err, c.field)
		}
	}
}
