package api

import (
	"net/http"
	"slices"
	"time"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// maxJobEvents bounds one job's story: a job moves a few times per attempt, and its attempts
// are bounded by the dispatch budget and the 503 refusals the executor answers.
const maxJobEvents = 1000

var auditEvents = []string{store.EventAdmitted, store.EventReplayed, store.EventRefused,
	store.EventShadowRefused, store.EventTransition, store.EventSlotGranted, store.EventSlotRefused,
	store.EventSlotReleased, store.EventSlotLost, store.EventSlotRenewFailed}

// drainerActor is how GET /v1/jobs/{id}/events shows a producer an actor that is no token's
// name: a drainer's id.
const drainerActor = "drainer"

// jobEvents answers GET /v1/jobs/{id}/events: the job's audit trail, oldest first. Another
// tenant's job is not_found, as for GET /v1/jobs/{id}. A producer sees actors as shownActor
// says; an admin sees them as recorded.
func (s *Server) jobEvents(w http.ResponseWriter, r *http.Request) {
	follow, after, err := followParams(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	row, err := s.visible(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if follow {
		s.followEvents(w, r, row.ID, after)
		return
	}
	events, err := store.JobEvents(r.Context(), s.cfg.DB, row.ID, maxJobEvents)
	if err != nil {
		s.fail(w, r, gate.AsUnavailable(err))
		return
	}
	s.showActors(callerOf(r), events)
	writeJSON(w, http.StatusOK, map[string]any{"events": events})
}

// showActors rewrites the actors of events as caller c may see them (shownActor); an admin sees
// them as recorded.
func (s *Server) showActors(c Caller, events []store.AuditEvent) {
	if c.Role == Admin {
		return
	}
	for i := range events {
		events[i].Actor = s.shownActor(c, events[i].Actor)
	}
}

// shownActor is the actor of an event as caller c, not an admin, may see it: its own name, and
// for anyone else only the kind of actor, the role of a token or drainerActor. Names tell a
// tenant's integrator nothing it needs, while admin token names and drainer ids (hostname-pid)
// map the operators and hosts behind sluice. An actor that is no configured token's name is
// shown as a drainer: drainer ids are the only other actors sluice writes, and a token since
// removed from the configuration is better mislabeled than named.
func (s *Server) shownActor(c Caller, actor string) string {
	if actor == "" || actor == c.Name {
		return actor
	}
	if role, ok := s.cfg.Tokens.RoleOf(actor); ok {
		return string(role)
	}
	return drainerActor
}

// listAudit answers GET /v1/audit: audit events, newest first, paginated like GET /v1/jobs,
// except that a filtered page (tenant, event, since) may be short (even empty) and still carry a
// cursor: one request examines at most store.AuditScanRows events.
func (s *Server) listAudit(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := store.AuditFilter{Limit: gate.DefaultListLimit}
	if t := q.Get("tenant"); q.Has("tenant") {
		if err := job.ValidTenant("tenant", t); err != nil {
			s.fail(w, r, err)
			return
		}
		f.Tenant = &t
	}
	if v := q.Get("event"); v != "" {
		if !slices.Contains(auditEvents, v) {
			s.fail(w, r, job.Invalid("event", "event must be one of %v", auditEvents))
			return
		}
		f.Event = v
	}
	if v := q.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			s.fail(w, r, job.Invalid("since", "since must be an RFC 3339 time, e.g. 2026-01-02T15:04:05Z"))
			return
		}
		t = t.UTC()
		f.Since = &t
	}
	var err error
	if f.Limit, f.Before, err = idPage(q); err != nil {
		s.fail(w, r, err)
		return
	}
	// One more than the page tells whether another page follows.
	want := f.Limit
	f.Limit++
	page, err := store.ListAudit(r.Context(), s.cfg.DB, f)
	if err != nil {
		s.fail(w, r, gate.AsUnavailable(err))
		return
	}
	events := page.Events
	// With page.Next set, a filter examined store.AuditScanRows rows without filling the page:
	// the page may be short, even empty, and the listing goes on below.
	next := page.Next
	if len(events) > want {
		events = events[:want]
		next = events[want-1].ID
	}
	writeJSON(w, http.StatusOK, map[string]any{"events": events, "next_cursor": nextCursor(next)})
}
