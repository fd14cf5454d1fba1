package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Slots (SPEC §5a): a lease on capacity for work the caller runs itself, renewed in the
// background while the work runs, released after it. A caller that cannot reach sluice in time
// goes ahead uncounted (fails open) rather than fail its own request.

// SlotRequest is the body of POST /v1/slots.
type SlotRequest struct {
	Tenant      string   `json:"tenant"`
	Lanes       []string `json:"lanes,omitempty"`
	Interactive bool     `json:"interactive,omitempty"`
	// LeaseSeconds is the slot's lease, 5 to 900; 0 takes the server's default (60).
	LeaseSeconds int `json:"lease_seconds,omitempty"`
}

// DecisionUnavailable is the decision of a slot Acquire failed open on: sluice could not be
// reached in time, nothing counts it and nothing renews it.
const DecisionUnavailable = "unavailable"

// DefaultSlotDeadline is Client.SlotDeadline's default.
const DefaultSlotDeadline = 500 * time.Millisecond

// failOpenLogEvery paces the fail-open log line.
const failOpenLogEvery = 15 * time.Second

// CapacityError is a refused slot (429 capacity_exceeded): no limit that applies had room.
// Retry after RetryAfter.
type CapacityError struct {
	// Scope is the limit that refused: global, tenant, tier, lane:<name> or reserve.
	Scope string
	// Paused: that limit is 0.
	Paused     bool
	RetryAfter time.Duration
	Err        *Error
}

func (e *CapacityError) Error() string {
	return fmt.Sprintf("sluice: no capacity (scope %s, paused %v): retry after %s", e.Scope, e.Paused, e.RetryAfter)
}

// Unwrap returns the API error.
func (e *CapacityError) Unwrap() error { return e.Err }

// Slot is a slot Acquire took. Its methods are safe for concurrent use.
type Slot struct {
	ID          int64    `json:"id"`
	Tenant      string   `json:"tenant"`
	Lanes       []string `json:"lanes"`
	Interactive bool     `json:"interactive"`
	// Decision is admitted, shadow-refused (granted, but enforce would have refused it: it does
	// not count against the limits) or DecisionUnavailable (failed open: not counted, not renewed).
	Decision string `json:"decision"`
	// Counted: the slot counts against the limits (admitted); false otherwise.
	Counted      bool      `json:"counted"`
	LeaseSeconds int       `json:"lease_seconds"`
	ExpiresAt    time.Time `json:"expires_at"`
	RenewEvery   int       `json:"renew_every_seconds"`

	c       *Client
	lost    chan struct{}
	lostErr error
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
	relErr  error
	expires atomic.Int64 // the lease's end as last renewed, Unix nanoseconds
}

// Lost returns a channel closed once the slot is lost: a renewal was refused (410 slot_lost, or
// 404 after an operator released it) or the lease ran out before a renewal got through. The
// work it covers then runs uncounted; a caller that must stay within capacity stops it. Never
// closed for a slot released first, nor for an unavailable one.
func (s *Slot) Lost() <-chan struct{} { return s.lost }

// LostErr says why the slot was lost, once Lost is closed; nil before.
func (s *Slot) LostErr() error {
	select {
	case <-s.lost:
		return s.lostErr
	default:
		return nil
	}
}

// Release stops the renewals and releases the slot (DELETE /v1/slots/{id}), within the client's
// HTTP timeout. Safe to defer and to call more than once: later calls return the first call's
// answer. An unavailable slot releases nothing. A slot that is already gone (lost, or released
// by an admin) releases without error.
func (s *Slot) Release() error {
	s.once.Do(func() {
		if s.stop == nil { // unavailable: nothing to stop or release
			return
		}
		close(s.stop)
		<-s.done
		err := s.c.ReleaseSlot(context.Background(), s.ID)
		if Code(err) == "not_found" {
			// Older servers answer the release of a slot no longer the caller's with 404; it
			// is gone all the same.
			err = nil
		}
		s.relErr = err
	})
	return s.relErr
}

// renew renews the slot every RenewEvery until Release or until it is lost. A renewal that
// fails for a reason other than a refusal is tried again at the next tick; once the lease has
// run out without one getting through, the slot is lost.
func (s *Slot) renew() {
	defer close(s.done)
	every := time.Duration(max(s.RenewEvery, 1)) * time.Second
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), every)
		var out struct {
			ExpiresAt time.Time `json:"expires_at"`
		}
		_, err := s.c.Do(ctx, http.MethodPost, "/v1/slots/"+strconv.FormatInt(s.ID, 10)+"/renew", nil, &out)
		cancel()
		var ae *Error
		switch {
		case err == nil:
			s.expires.Store(out.ExpiresAt.UnixNano())
			continue
		case errors.As(err, &ae) && (ae.Code == "slot_lost" || ae.Code == "not_found"):
			s.lostErr = err
		case time.Now().UnixNano() >= s.expires.Load():
			s.lostErr = fmt.Errorf("sluice: the slot's lease ran out before a renewal got through: %w", err)
		default:
			continue
		}
		close(s.lost)
		return
	}
}

// slotFailOpen counts Acquire's fail-opens and paces their log line.
type slotFailOpen struct {
	n      atomic.Int64
	mu     sync.Mutex
	logged time.Time
}

// SlotsFailedOpen returns how many times Acquire failed open on this client.
func (c *Client) SlotsFailedOpen() int64 { return c.slotsOpen.n.Load() }

// Acquire takes a slot for req (POST /v1/slots, marked Sluice-Capacity-Aware: true) and renews it
// in the background every renew_every_seconds until Release, which the caller must call (defer
// it). A refusal is a *CapacityError. If sluice cannot be reached within SlotDeadline (default
// 500 ms), or answers 5xx, Acquire fails open: it returns a slot with decision
// DecisionUnavailable that renews nothing, counts it (SlotsFailedOpen) and logs a line at most
// every 15 s, so that the caller's work goes ahead uncounted. Other errors (400, 403, ctx ended)
// are returned as they are.
func (c *Client) Acquire(ctx context.Context, req SlotRequest) (*Slot, error) {
	deadline := c.SlotDeadline
	if deadline <= 0 {
		deadline = DefaultSlotDeadline
	}
	actx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	s := &Slot{c: c, lost: make(chan struct{})}
	_, err := c.do(actx, http.MethodPost, "/v1/slots", req, s, http.Header{"Sluice-Capacity-Aware": {"true"}})
	var ae *Error
	switch {
	case err == nil:
	case errors.As(err, &ae) && ae.Code == "capacity_exceeded":
		ce := &CapacityError{Err: ae, RetryAfter: time.Duration(ae.RetryAfter) * time.Second}
		ce.Scope, _ = ae.Body["scope"].(string)
		ce.Paused, _ = ae.Body["paused"].(bool)
		return nil, ce
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case errors.As(err, &ae) && ae.HTTPStatus < 500:
		return nil, err
	default:
		c.failedOpen(req, err)
		return &Slot{Tenant: req.Tenant, Lanes: req.Lanes, Interactive: req.Interactive, Decision: DecisionUnavailable,
			c: c, lost: make(chan struct{})}, nil
	}
	s.expires.Store(s.ExpiresAt.UnixNano())
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	go s.renew()
	return s, nil
}

func (c *Client) failedOpen(req SlotRequest, err error) {
	n := c.slotsOpen.n.Add(1)
	if c.Log == nil {
		return
	}
	c.slotsOpen.mu.Lock()
	now := time.Now()
	due := now.Sub(c.slotsOpen.logged) >= failOpenLogEvery
	if due {
		c.slotsOpen.logged = now
	}
	c.slotsOpen.mu.Unlock()
	if due {
		c.Log.Warn("sluice unreachable: slot not taken, the work goes ahead uncounted", "tenant", req.Tenant,
			"failed_open_total", n, "error", err)
	}
}

// SlotPage is one page of GET /v1/slots.
type SlotPage struct {
	Slots      []SlotRow `json:"slots"`
	NextCursor string    `json:"next_cursor"`
}

// SlotRow is a slot as GET /v1/slots lists it.
type SlotRow struct {
	ID           int64     `json:"id"`
	Tenant       string    `json:"tenant"`
	Lanes        []string  `json:"lanes"`
	Interactive  bool      `json:"interactive"`
	Counted      bool      `json:"counted"`
	LeaseSeconds int       `json:"lease_seconds"`
	ExpiresAt    time.Time `json:"expires_at"`
	Caller       string    `json:"caller"`
	CreatedAt    time.Time `json:"created_at"`
}

// ListSlots reads one page of slots, newest first (admin): tenant "" for all, limit 0 for the
// server's default.
func (c *Client) ListSlots(ctx context.Context, tenant string, limit int, cursor string) (SlotPage, error) {
	q := map[string][]string{}
	if tenant != "" {
		q["tenant"] = []string{tenant}
	}
	var p struct {
		Slots      []SlotRow `json:"slots"`
		NextCursor *string   `json:"next_cursor"`
	}
	_, err := c.Do(ctx, http.MethodGet, pagePath("/v1/slots", q, limit, cursor), nil, &p)
	out := SlotPage{Slots: p.Slots}
	if p.NextCursor != nil {
		out.NextCursor = *p.NextCursor
	}
	return out, err
}

// ReleaseSlot releases slot id (DELETE /v1/slots/{id}): an admin may release any.
func (c *Client) ReleaseSlot(ctx context.Context, id int64) error {
	_, err := c.Do(ctx, http.MethodDelete, "/v1/slots/"+strconv.FormatInt(id, 10), nil, nil)
	return err
}
