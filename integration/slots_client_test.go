package integration_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/integration/harness"
)

// TestSlotClient: Acquire renews in the background, Release is safe twice, a refusal is a
// *CapacityError, and a slot whose lease ran out is reported on Lost.
func TestSlotClient(t *testing.T) {
	t.Parallel()
	e := startSlotsEnv(t, harness.Options{API: true})
	ctx := context.Background()
	patchConfig(t, e, map[string]any{"tenant_in_flight": 1})
	c := client.New(e.URL, harness.ProducerToken)
	s, err := c.Acquire(ctx, client.SlotRequest{Tenant: "acme", LeaseSeconds: 6})
	if err != nil || s.Decision != "admitted" || s.RenewEvery != 2 || s.ID == 0 {
		t.Fatalf("acquire: %+v %v", s, err)
	}
	first := s.ExpiresAt
	harness.WaitFor(t, 10*time.Second, "a background renewal", func() (bool, error) {
		var exp time.Time
		err := e.DB.QueryRowContext(ctx, "SELECT expires_at FROM slots WHERE id = ?", s.ID).Scan(&exp)
		return exp.After(first), err
	})
	_, err = c.Acquire(ctx, client.SlotRequest{Tenant: "acme"})
	var ce *client.CapacityError
	if !errors.As(err, &ce) || ce.Scope != "tenant" || ce.Paused || ce.RetryAfter != 5*time.Second {
		t.Errorf("refusal: %#v", err)
	}
	for range 2 {
		if err := s.Release(); err != nil {
			t.Errorf("release: %v", err)
		}
	}
	if n := liveSlots(t, e); n != 0 {
		t.Errorf("%d live slots after release", n)
	}
	select {
	case <-s.Lost():
		t.Error("a released slot reads as lost")
	default:
	}

	// Lost: the lease ran out (moved into the past here), the next renewal answers 410.
	s, err = c.Acquire(ctx, client.SlotRequest{Tenant: "acme", LeaseSeconds: 6})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release()
	expireSlot(t, e, strconv.FormatInt(s.ID, 10))
	select {
	case <-s.Lost():
		if client.Code(s.LostErr()) != "slot_lost" {
			t.Errorf("lost: %v", s.LostErr())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the expired slot was not reported lost")
	}
}

// TestSlotClientFailsOpen: against a server that does not answer, Acquire returns within its
// deadline a slot with decision unavailable that renews and releases nothing; it counts each
// fail-open and logs at most one line per 15 s. Against a closed port, the same.
func TestSlotClientFailsOpen(t *testing.T) {
	t.Parallel()
	var requests atomic.Int64
	stuck := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		select {
		case <-stuck:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(stuck)
	var logs bytes.Buffer
	c := client.New(srv.URL, harness.ProducerToken)
	c.SlotDeadline = 200 * time.Millisecond
	c.Log = slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, nil))
	for i := range 2 {
		start := time.Now()
		s, err := c.Acquire(context.Background(), client.SlotRequest{Tenant: "acme"})
		took := time.Since(start)
		if err != nil || s.Decision != client.DecisionUnavailable || took > 2*time.Second {
			t.Fatalf("acquire %d: %+v %v after %s", i, s, err, took)
		}
		if err := s.Release(); err != nil {
			t.Errorf("release of an unavailable slot: %v", err)
		}
	}
	if n := requests.Load(); n != 2 {
		t.Errorf("%d requests, want the two takes only (no renewal, no release)", n)
	}
	if n := c.SlotsFailedOpen(); n != 2 {
		t.Errorf("failed open %d times, want 2", n)
	}
	if n := bytes.Count(logs.Bytes(), []byte("uncounted")); n != 1 {
		t.Errorf("%d fail-open log lines, want 1:\n%s", n, logs.String())
	}

	// A stopped server: nothing listens on the port.
	closed := httptest.NewServer(http.NotFoundHandler())
	url := closed.URL
	closed.Close()
	c = client.New(url, harness.ProducerToken)
	if s, err := c.Acquire(context.Background(), client.SlotRequest{Tenant: "acme"}); err != nil || s.Decision != client.DecisionUnavailable {
		t.Errorf("acquire from a stopped server: %+v %v", s, err)
	}
}

// syncWriter serialises writes to a buffer the test reads afterwards.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
