package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/gate/waiters"
)

// Timings of GET /v1/jobs/{id}/events?follow=1.
const (
	// followKeepAlive is how often an idle stream sends a comment, so that proxies and clients
	// that time out idle connections keep it open.
	followKeepAlive = 15 * time.Second
	// followWriteWindow is the write deadline each write of a stream sets: a stream outlives the
	// listener's write timeout, a client that stops reading does not hold it forever.
	followWriteWindow = time.Minute
)

// followParams reads follow (1 or true: stream; 0, false or absent: one answer) and, for a
// stream, the Last-Event-ID a reconnecting client sends: the events after it follow.
func followParams(r *http.Request) (follow bool, after int64, err error) {
	switch v := r.URL.Query().Get("follow"); v {
	case "", "0", "false":
		return false, 0, nil
	case "1", "true":
	default:
		return false, 0, job.Invalid("follow", "follow must be 1 or 0, got %q", v)
	}
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		if after, err = strconv.ParseInt(v, 10, 64); err != nil || after < 0 {
			return false, 0, job.Invalid("Last-Event-ID", "Last-Event-ID must be an event id this stream sent, got %q", v)
		}
	}
	return true, after, nil
}

// followEvents streams job id's audit events after the event id after as server-sent events
// (`id:` the event's id, `event:` its name, `data:` the event as GET /v1/jobs/{id}/events shows
// it), then, once the job is terminal, an `end` event whose data is the job. It waits as a
// waiter: the job's release poke or the backstop's read of a changed state wakes it, and each
// wake reads the job's state and its new events once.
func (s *Server) followEvents(w http.ResponseWriter, r *http.Request, id, after int64) {
	ctx := r.Context()
	c := callerOf(r)
	waiter, err := s.addWaiter(ctx, w, c.Name, id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer waiter.Close()
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // nginx: pass each event on at once
	started := false
	send := func(text string) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(followWriteWindow)) // not every writer has one
		if !started {
			w.WriteHeader(http.StatusOK)
			started = true
		}
		if _, err := fmt.Fprint(w, text); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	keepAlive := time.NewTicker(followKeepAlive)
	defer keepAlive.Stop()
	for {
		// The state first, then the events: the events read after a terminal state include the
		// transition that made it, written in the same transaction.
		states, err := store.States(ctx, s.cfg.DB, []int64{id})
		var events []store.AuditEvent
		// Every event written by then, however many: an end sent after only the first page's
		// would lose the rest.
		for page := []store.AuditEvent(nil); err == nil; {
			page, err = store.JobEventsAfter(ctx, s.cfg.DB, id, max(after, lastID(events)), maxJobEvents)
			events = append(events, page...)
			if len(page) < maxJobEvents {
				break
			}
		}
		if err != nil {
			if !started {
				s.fail(w, r, gate.AsUnavailable(err))
			} else {
				s.cfg.Log.Warn("an events stream ended on a failed read", "job_id", id, "error", err)
			}
			return
		}
		s.showActors(c, events)
		for _, e := range events {
			data, _ := json.Marshal(e) // cannot fail
			if !send(fmt.Sprintf("id: %d\nevent: %s\ndata: %s\n\n", e.ID, e.Event, data)) {
				return
			}
			after = e.ID
		}
		st, exists := states[id]
		if !exists || st.Status.Terminal() {
			end := "event: end\ndata: {}\n\n"
			if row, err := s.cfg.Admitter.Get(ctx, id); err == nil {
				data, _ := json.Marshal(row.Job)
				end = fmt.Sprintf("event: end\ndata: %s\n\n", data)
			}
			send(end)
			return
		}
		if !started && !send(": following\n\n") {
			return
		}
		waiter.Saw(waiters.State{Status: string(st.Status), Version: st.Version})
		if !s.awaitWake(ctx, waiter, keepAlive.C, send) {
			return
		}
	}
}

// awaitWake waits for w's next wake, sending a keep-alive comment on each tick of keepAlive
// (which reads nothing), and reports false when the stream is to end instead: the process is
// stopping, the client left, or a write failed.
func (s *Server) awaitWake(ctx context.Context, w *waiters.Waiter, keepAlive <-chan time.Time, send func(string) bool) bool {
	for {
		select {
		case <-w.C():
			return true
		case <-keepAlive:
			if !send(": keep-alive\n\n") {
				return false
			}
		case <-s.waiters.Stopping():
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// lastID is the id of the last of events, or 0.
func lastID(events []store.AuditEvent) int64 {
	if len(events) == 0 {
		return 0
	}
	return events[len(events)-1].ID
}
