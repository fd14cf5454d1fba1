package integration_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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

// slotHolderEnv, when set, makes TestSlotHolderProcess the body of a child process: it takes a
// slot from the API at that URL, prints its id, and holds it (renewing) until it is killed.
const slotHolderEnv = "SLUICE_TEST_SLOT_HOLDER_URL"

// TestSlotHolderProcess is the child of TestSlotKilledHolderFreesByExpiry; run alone it skips.
func TestSlotHolderProcess(t *testing.T) {
	url := os.Getenv(slotHolderEnv)
	if url == "" {
		t.Skip("the child process of TestSlotKilledHolderFreesByExpiry")
	}
	s, err := client.New(url, harness.ProducerToken).Acquire(context.Background(), client.SlotRequest{Tenant: "acme", LeaseSeconds: 5})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Printf("slot %d\n", s.ID)
	<-s.Lost() // held until killed (or lost)
	os.Exit(1)
}

// TestSlotKilledHolderFreesByExpiry: a process SIGKILLed while holding a slot releases nothing;
// the slot counts until its lease runs out, then a drainer's upkeep deletes it as lost.
func TestSlotKilledHolderFreesByExpiry(t *testing.T) {
	t.Parallel()
	e := startSlotsEnv(t, harness.Options{})
	cmd := exec.Command(os.Args[0], "-test.run=^TestSlotHolderProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), slotHolderEnv+"="+e.URL)
	out := &harness.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	var id string
	harness.WaitFor(t, 30*time.Second, "the child's slot", func() (bool, error) {
		for _, line := range strings.Split(out.String(), "\n") {
			if s, ok := strings.CutPrefix(line, "slot "); ok {
				id = s
				return true, nil
			}
		}
		return false, nil
	})
	var first time.Time
	if err := e.DB.QueryRowContext(context.Background(), "SELECT expires_at FROM slots WHERE id = ?", id).Scan(&first); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 10*time.Second, "the child's first renewal", func() (bool, error) {
		var exp time.Time
		err := e.DB.QueryRowContext(context.Background(), "SELECT expires_at FROM slots WHERE id = ?", id).Scan(&exp)
		return exp.After(first), err
	})
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	var live bool
	if err := e.DB.QueryRowContext(context.Background(), "SELECT expires_at > NOW(6) FROM slots WHERE id = ?", id).Scan(&live); err != nil || !live {
		t.Fatalf("the killed holder's slot right after the kill: live %v (%v), want it counted until its lease runs out", live, err)
	}
	harness.WaitFor(t, 20*time.Second, "the slot's expiry and sweep", func() (bool, error) {
		var n int
		err := e.DB.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM audit_events WHERE event = 'slot_lost' AND slot_id = ?", id).Scan(&n)
		return n == 1, err
	})
	var released, left int
	if err := e.DB.QueryRowContext(context.Background(), `SELECT
		(SELECT COUNT(*) FROM audit_events WHERE event = 'slot_released'), (SELECT COUNT(*) FROM slots)`).Scan(&released, &left); err != nil {
		t.Fatal(err)
	}
	if released != 0 || left != 0 {
		t.Errorf("%d release events, %d slots left: want the slot freed by expiry only", released, left)
	}
}
