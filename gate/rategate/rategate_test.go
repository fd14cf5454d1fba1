package rategate_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/rategate"
	"github.com/sluicehq/sluice/integration/memcachedtest"
	"github.com/sluicehq/sluice/integration/wait"
)

// randomHash returns a fresh rate key hash, so parallel tests never share a gate.
func randomHash(tb testing.TB) string {
	tb.Helper()
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatal(err)
	}
	sum := sha256.Sum256(b[:])
	return hex.EncodeToString(sum[:])
}

type bundle struct {
	store *rategate.Store
	clock *clock.Fake
	raw   *memcache.Client // plain gomemcache, as an executor in another language would be
	addr  string
	logs  *logRecorder
}

func setup(tb testing.TB, addr string, tweak func(*rategate.Config)) bundle {
	tb.Helper()
	b := bundle{clock: clock.NewFake(time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)), raw: memcache.New(addr),
		addr: addr, logs: &logRecorder{}}
	// A generous timeout: a loaded machine running -race can exceed the 50 ms default, and these
	// tests assert what memcached holds, not how fast it answers (the fail-open tests set theirs).
	cfg := rategate.Config{Servers: []string{addr}, Clock: b.clock, Log: slog.New(b.logs), Timeout: time.Second}
	if tweak != nil {
		tweak(&cfg)
	}
	s, err := rategate.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	b.store = s
	return b
}

func TestFormat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		retryAfter int
		ttl        time.Duration
	}{
		{1, 300 * time.Second},
		{180, 300 * time.Second},
		{181, 301 * time.Second},
		{3600, 3720 * time.Second},
		{86400, 86520 * time.Second},
	} {
		if got := rategate.TTL(tc.retryAfter); got != tc.ttl {
			t.Errorf("TTL(%d) = %s, want %s", tc.retryAfter, got, tc.ttl)
		}
	}
	h := strings.Repeat("ab", 32)
	if got := rategate.Key(h); got != "sluice:gate:"+h {
		t.Errorf("Key = %q", got)
	}
	at := time.Date(2026, 5, 1, 12, 0, 0, 123456789, time.UTC)
	if got := string(rategate.Value(at)); got != strconv.FormatInt(at.UnixMilli(), 10) || got != "1777636800123" {
		t.Errorf("Value = %q, want Unix milliseconds 1777636800123", got)
	}
	back, err := rategate.ParseValue([]byte("1777636800123"))
	if err != nil || !back.Equal(at.Truncate(time.Millisecond)) {
		t.Errorf("ParseValue = %v, %v; want %v", back, err, at.Truncate(time.Millisecond))
	}
	for _, bad := range []string{"", "abc", "-5", "1.5", " 12"} {
		if _, err := rategate.ParseValue([]byte(bad)); !errors.Is(err, rategate.ErrInvalid) {
			t.Errorf("ParseValue(%q) = %v, want ErrInvalid", bad, err)
		}
	}
	for h, ok := range map[string]bool{
		strings.Repeat("0", 64): true, strings.Repeat("f", 64): true,
		strings.Repeat("F", 64): false, strings.Repeat("0", 63): false, strings.Repeat("g", 64): false,
	} {
		if rategate.ValidHash(h) != ok {
			t.Errorf("ValidHash(%q) = %v, want %v", h, !ok, ok)
		}
	}
	for ra, ok := range map[int]bool{0: false, 1: true, 86400: true, 86401: false, -1: false} {
		if err := rategate.ValidRetryAfter(ra); (err == nil) != ok {
			t.Errorf("ValidRetryAfter(%d) = %v", ra, err)
		}
	}
}

func TestConfigInvalid(t *testing.T) {
	t.Parallel()
	if _, err := rategate.New(rategate.Config{}); err == nil || !strings.HasPrefix(err.Error(), "invalid config: Servers") {
		t.Errorf("New without servers = %v, want invalid config: Servers", err)
	}
	if _, err := rategate.New(rategate.Config{Servers: []string{"x"}, Timeout: -1}); err == nil || !strings.HasPrefix(err.Error(), "invalid config: ") {
		t.Errorf("New with a negative timeout = %v, want invalid config", err)
	}
}

// TestExtendWritesDocumentedFormat reads what Extend stored with plain gomemcache and a raw
// meta-get (for the TTL), as an executor in another language would see it.
func TestExtendWritesDocumentedFormat(t *testing.T) {
	t.Parallel()
	b := setup(t, memcachedtest.Shared(t), nil)
	ctx := context.Background()
	h := randomHash(t)
	t.Cleanup(func() { _ = b.raw.Delete(rategate.Key(h)) })
	now, _ := b.clock.Now(ctx)
	nb, err := b.store.Extend(ctx, h, 3600)
	if err != nil {
		t.Fatal(err)
	}
	want := now.Add(3605 * time.Second).Truncate(time.Millisecond)
	if !nb.Equal(want) {
		t.Errorf("Extend returned %v, want now + 3600 s + 5 s = %v", nb, want)
	}
	it, err := b.raw.Get("sluice:gate:" + h)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(it.Value); got != strconv.FormatInt(want.UnixMilli(), 10) {
		t.Errorf("stored value %q, want %d", got, want.UnixMilli())
	}
	if ttl := metaTTL(t, b.addr, "sluice:gate:"+h); ttl < 3715 || ttl > 3720 {
		t.Errorf("stored TTL %d s, want 3720 (retry_after + 120 s)", ttl)
	}
	h2 := randomHash(t)
	t.Cleanup(func() { _ = b.raw.Delete(rategate.Key(h2)) })
	if _, err := b.store.Extend(ctx, h2, 10); err != nil {
		t.Fatal(err)
	}
	if ttl := metaTTL(t, b.addr, "sluice:gate:"+h2); ttl < 295 || ttl > 300 {
		t.Errorf("stored TTL %d s, want 300 (the minimum)", ttl)
	}
	if _, err := b.store.Extend(ctx, h, 0); !errors.Is(err, rategate.ErrInvalid) {
		t.Errorf("Extend with retry_after 0 = %v, want ErrInvalid", err)
	}
	if _, err := b.store.Extend(ctx, h, 86401); !errors.Is(err, rategate.ErrInvalid) {
		t.Errorf("Extend with retry_after 86401 = %v, want ErrInvalid", err)
	}
	if _, err := b.store.Extend(ctx, "not-a-hash", 10); !errors.Is(err, rategate.ErrInvalid) {
		t.Errorf("Extend with a bad hash = %v, want ErrInvalid", err)
	}
}

// metaTTL returns the remaining TTL of key in seconds, by memcached's meta get (gomemcache does
// not expose it).
func metaTTL(tb testing.TB, addr, key string) int {
	tb.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "mg %s t\r\n", key); err != nil {
		tb.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		tb.Fatal(err)
	}
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, "t"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				tb.Fatalf("meta get answered %q", line)
			}
			return n
		}
	}
	tb.Fatalf("meta get answered %q, want a TTL", line)
	return 0
}

// TestExtendOnlyGrows: a shorter retry_after never shortens a gate, a longer one extends it, and
// concurrent writers with different retry_after values leave the longest gate.
func TestExtendOnlyGrows(t *testing.T) {
	t.Parallel()
	b := setup(t, memcachedtest.Shared(t), nil)
	ctx := context.Background()
	now, _ := b.clock.Now(ctx)
	h := randomHash(t)
	t.Cleanup(func() { _ = b.raw.Delete(rategate.Key(h)) })
	long, err := b.store.Extend(ctx, h, 600)
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.store.Extend(ctx, h, 60)
	if err != nil || !got.Equal(long) {
		t.Errorf("a shorter Extend returned %v, %v; want the longer gate %v kept", got, err, long)
	}
	if nb, ok, err := b.store.Get(ctx, h); err != nil || !ok || !nb.Equal(long) {
		t.Errorf("after a shorter Extend the gate is %v (%v, %v), want %v", nb, ok, err, long)
	}
	longer, err := b.store.Extend(ctx, h, 1200)
	if err != nil || !longer.Equal(now.Add(1205*time.Second).Truncate(time.Millisecond)) {
		t.Errorf("a longer Extend returned %v, %v", longer, err)
	}

	// 20 writers per round, retry_after 1..20 s in a shuffled order, racing on a key without a
	// gate (Add races) and then on one with a gate (CAS races).
	for round := 0; round < 3; round++ {
		h := randomHash(t)
		t.Cleanup(func() { _ = b.raw.Delete(rategate.Key(h)) })
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make(chan error, 20)
		for i := 0; i < 20; i++ {
			ra := 1 + (i*7+round)%20
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if _, err := b.store.Extend(ctx, h, ra); err != nil {
					errs <- err
				}
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("concurrent Extend: %v", err)
		}
		it, err := b.raw.Get(rategate.Key(h))
		if err != nil {
			t.Fatal(err)
		}
		want := now.Add(25 * time.Second).Truncate(time.Millisecond) // the longest: 20 s + 5 s
		if string(it.Value) != strconv.FormatInt(want.UnixMilli(), 10) {
			t.Errorf("round %d: after 20 concurrent writers the gate is %s, want the longest %d", round, it.Value, want.UnixMilli())
		}
	}
}

// TestReadsForeignGates: a gate written by someone else in the documented format is read, and an
// unreadable value is no gate.
func TestReadsForeignGates(t *testing.T) {
	t.Parallel()
	b := setup(t, memcachedtest.Shared(t), nil)
	ctx := context.Background()
	h1, h2, h3 := randomHash(t), randomHash(t), randomHash(t)
	t.Cleanup(func() {
		for _, h := range []string{h1, h2, h3} {
			_ = b.raw.Delete(rategate.Key(h))
		}
	})
	at := time.Date(2026, 5, 1, 13, 0, 0, 0, time.UTC)
	if err := b.raw.Set(&memcache.Item{Key: "sluice:gate:" + h1, Value: []byte(strconv.FormatInt(at.UnixMilli(), 10)), Expiration: 300}); err != nil {
		t.Fatal(err)
	}
	if err := b.raw.Set(&memcache.Item{Key: "sluice:gate:" + h2, Value: []byte("soon"), Expiration: 300}); err != nil {
		t.Fatal(err)
	}
	got, err := b.store.NotBefore(ctx, []string{h1, h2, h3, "bogus"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !got[h1].Equal(at) {
		t.Errorf("NotBefore = %v, want only %s at %v", got, h1, at)
	}
	// A gate written a year ahead holds for the longest retry_after, not for the year.
	now, _ := b.clock.Now(ctx)
	far := now.AddDate(1, 0, 0)
	if err := b.raw.Set(&memcache.Item{Key: "sluice:gate:" + h3, Value: []byte(strconv.FormatInt(far.UnixMilli(), 10)), Expiration: 300}); err != nil {
		t.Fatal(err)
	}
	longest := now.Add(rategate.MaxRetryAfter*time.Second + rategate.Margin)
	if got, err := b.store.NotBefore(ctx, []string{h3}); err != nil || !got[h3].Equal(longest) {
		t.Errorf("a gate a year ahead reads %v (%v), want the longest one, %v", got[h3], err, longest)
	}
	// Stored without an expiry, it is rewritten as the longest gate with the longest gate's
	// expiry, so it does not hold the key forever; and Extend replaces it rather than report it.
	if err := b.raw.Set(&memcache.Item{Key: "sluice:gate:" + h3, Value: []byte(strconv.FormatInt(far.UnixMilli(), 10))}); err != nil {
		t.Fatal(err)
	}
	if got, err := b.store.NotBefore(ctx, []string{h3}); err != nil || !got[h3].Equal(longest) {
		t.Errorf("a gate a year ahead without expiry reads %v (%v), want the longest one, %v", got[h3], err, longest)
	}
	if it, err := b.raw.Get(rategate.Key(h3)); err != nil || string(it.Value) != string(rategate.Value(longest)) {
		t.Errorf("after the read the item holds %q (%v), want the longest gate %q", it.Value, err, rategate.Value(longest))
	}
	if err := b.raw.Set(&memcache.Item{Key: "sluice:gate:" + h3, Value: []byte(strconv.FormatInt(far.UnixMilli(), 10))}); err != nil {
		t.Fatal(err)
	}
	if nb, err := b.store.Extend(ctx, h3, 1); err != nil || nb.After(longest) {
		t.Errorf("Extend over a gate a year ahead = %v, %v; want a gate of its own, not the year", nb, err)
	}
	if err := b.raw.Delete(rategate.Key(h3)); err != nil {
		t.Fatal(err)
	}
	// A foreign gate is extended by CAS like ours, and a later, shorter write keeps it.
	if nb, err := b.store.Extend(ctx, h1, 1); err != nil || !nb.Equal(at) {
		t.Errorf("Extend over a longer foreign gate = %v, %v; want %v kept", nb, err, at)
	}
	// An unreadable value is replaced by a real gate.
	if _, err := b.store.Extend(ctx, h2, 30); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := b.store.Get(ctx, h2); !ok || err != nil {
		t.Errorf("Extend over an unreadable value left no gate (%v)", err)
	}
	if err := b.store.Clear(ctx, h1); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Clear(ctx, h3); err != nil {
		t.Errorf("Clear of a key without a gate = %v, want nil", err)
	}
	if _, ok, _ := b.store.Get(ctx, h1); ok {
		t.Error("the gate is still there after Clear")
	}
}

// TestFailOpen: with memcached stopped every call answers ErrUnavailable at once; while the
// breaker is open calls do not touch the network; the warning is logged once per WarnEvery;
// after memcached is back the store works again.
func TestFailOpen(t *testing.T) {
	t.Parallel()
	mc := memcachedtest.Start(t)
	b := setup(t, mc.Addr(), func(c *rategate.Config) { c.SkipFor = 50 * time.Millisecond })
	ctx := context.Background()
	h := randomHash(t)
	if _, err := b.store.Extend(ctx, h, 60); err != nil {
		t.Fatal(err)
	}
	if !b.store.Reachable() {
		t.Error("Reachable() = false with memcached up")
	}
	mc.Stop()
	for i := 0; i < 50; i++ {
		got, err := b.store.NotBefore(ctx, []string{h})
		if !errors.Is(err, rategate.ErrUnavailable) || len(got) != 0 {
			t.Fatalf("NotBefore with memcached down = %v, %v; want nothing and ErrUnavailable", got, err)
		}
		if _, err := b.store.Extend(ctx, h, 60); !errors.Is(err, rategate.ErrUnavailable) {
			t.Fatalf("Extend with memcached down = %v, want ErrUnavailable", err)
		}
		if err := b.store.Clear(ctx, h); !errors.Is(err, rategate.ErrUnavailable) {
			t.Fatalf("Clear with memcached down = %v, want ErrUnavailable", err)
		}
	}
	if b.store.Reachable() {
		t.Error("Reachable() = true right after failures")
	}
	if n := b.logs.count("memcached unavailable"); n != 1 {
		t.Errorf("logged %d unavailability warnings for 150 failures, want 1 (at most one per 15 s)", n)
	}
	mc.Restart()
	wait.Until(t, 10*time.Second, "the store to use memcached again", func() bool {
		_, err := b.store.NotBefore(ctx, []string{h})
		return err == nil
	})
	if !b.store.Reachable() {
		t.Error("Reachable() = false after a successful lookup")
	}
	// memcached restarted empty: the old gate is gone, a new one works.
	if _, err := b.store.Extend(ctx, h, 60); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := b.store.Get(ctx, h); !ok || err != nil {
		t.Errorf("no gate after memcached came back: %v", err)
	}
}

// TestFailOpenSlowServer: a server that accepts but never answers costs one timeout, then the
// breaker skips it without waiting.
func TestFailOpenSlowServer(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	var mu sync.Mutex
	var held []net.Conn
	conns.Add(1)
	go func() {
		defer conns.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // never answer
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		conns.Wait()
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	})
	b := setup(t, l.Addr().String(), func(c *rategate.Config) { c.Timeout = 50 * time.Millisecond; c.SkipFor = time.Hour })
	ctx := context.Background()
	h := randomHash(t)
	t0 := time.Now()
	if _, err := b.store.NotBefore(ctx, []string{h}); !errors.Is(err, rategate.ErrUnavailable) {
		t.Fatalf("NotBefore against a mute server = %v, want ErrUnavailable", err)
	}
	first := time.Since(t0)
	// The bound is generous for a loaded 2-core machine; without the timeout gomemcache would
	// wait 500 ms, and the point is that it is the configured 50 ms, not seconds.
	if first > 400*time.Millisecond {
		t.Errorf("the first lookup took %s, want about the 50 ms timeout", first)
	}
	t1 := time.Now()
	for i := 0; i < 100; i++ {
		if _, err := b.store.NotBefore(ctx, []string{h}); err == nil || !strings.Contains(err.Error(), "skipped") {
			t.Fatalf("lookup %d with the breaker open = %v, want a skipped ErrUnavailable", i, err)
		}
	}
	if d := time.Since(t1); d > 50*time.Millisecond {
		t.Errorf("100 lookups with the breaker open took %s: they must not touch the network", d)
	}
}

// logRecorder is a slog.Handler that keeps messages.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Message)
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

func (l *logRecorder) count(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n
}
