package api

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// The slot endpoints (SPEC §5a): take, renew, release, and the admin listing the CLI reads.

// AwareHeader marks a client that handles a capacity refusal (enforce_for=aware refuses only
// requests that carry it with the value true).
const AwareHeader = "Sluice-Capacity-Aware"

// slotBody is a slot as the API shows it.
type slotBody struct {
	ID          int64    `json:"id"`
	Tenant      string   `json:"tenant"`
	Lanes       []string `json:"lanes"`
	Interactive bool     `json:"interactive"`
	Decision    string   `json:"decision,omitempty"`
	// Counted: the slot counts against the limits; false for one granted past a limit
	// (shadow-refused, or with admission_mode off), which takes no capacity from the queue.
	Counted      bool   `json:"counted"`
	LeaseSeconds int    `json:"lease_seconds"`
	ExpiresAt    string `json:"expires_at"`
	RenewEvery   int    `json:"renew_every_seconds"`
	Caller       string `json:"caller,omitempty"`
	CreatedAt    string `json:"created_at,omitempty"`
}

func timeText(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func slotOf(s store.Slot) slotBody {
	lanes := s.Lanes
	if lanes == nil {
		lanes = []string{}
	}
	return slotBody{ID: s.ID, Tenant: s.Tenant, Lanes: lanes, Interactive: s.Interactive, Counted: s.Counted,
		LeaseSeconds: s.LeaseSeconds, ExpiresAt: timeText(s.ExpiresAt), RenewEvery: s.LeaseSeconds / 3}
}

// takeSlot is POST /v1/slots: 201 with the slot, or 429 capacity_exceeded with the headers of the
// refusing verdict.
func (s *Server) takeSlot(w http.ResponseWriter, r *http.Request) {
	data, err := readBody(r, bodyOverhead)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var req gate.SlotRequest
	if err := decode(data, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	req.Aware = capacityAware(r)
	c := callerOf(r)
	res, err := s.cfg.Admitter.TakeSlot(r.Context(), c.Name, req, c.MayActFor)
	if err != nil {
		var ref *gate.SlotRefusal
		if errors.As(err, &ref) {
			setVerdictHeaders(w.Header(), string(gate.Refused), ref.Verdict)
		}
		s.fail(w, r, err)
		return
	}
	body := slotOf(res.Slot)
	body.Decision = string(gate.Admitted)
	if res.Decision != "" {
		body.Decision = string(res.Decision)
		setVerdictHeaders(w.Header(), string(res.Decision), res.Verdict)
	}
	w.Header().Set("Location", "/v1/slots/"+strconv.FormatInt(res.Slot.ID, 10))
	writeJSON(w, http.StatusCreated, body)
}

func slotID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, job.Errorf(job.CodeNotFound, "no such slot")
	}
	return id, nil
}

// renewSlot is POST /v1/slots/{id}/renew: 200 {id, expires_at}; 404 for no such slot or
// another caller's; 410 slot_lost once its lease ran out.
func (s *Server) renewSlot(w http.ResponseWriter, r *http.Request) {
	id, err := slotID(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	c := callerOf(r)
	sl, err := s.cfg.Admitter.RenewSlot(r.Context(), c.Name, c.Role == Admin, id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": sl.ID, "expires_at": timeText(sl.ExpiresAt)})
}

// releaseSlot is DELETE /v1/slots/{id}: 204, again 204 once it is gone, and 204 for another
// caller's slot, which stays (gate.Admitter.ReleaseSlot): the answer never tells whether an id is
// someone else's live slot.
func (s *Server) releaseSlot(w http.ResponseWriter, r *http.Request) {
	id, err := slotID(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	c := callerOf(r)
	if _, err := s.cfg.Admitter.ReleaseSlot(r.Context(), c.Name, c.Role == Admin, id); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// listSlots is GET /v1/slots?tenant=&limit=&cursor= (admin): {slots, next_cursor}, newest first,
// live slots and expired ones the upkeep has not yet deleted.
func (s *Server) listSlots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	tenant := q.Get("tenant")
	if q.Has("tenant") {
		if err := job.ValidTenant("tenant", tenant); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	limit, before, err := idPage(q)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	slots, next, err := s.cfg.Admitter.ListSlots(r.Context(), tenant, before, limit)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]slotBody, len(slots))
	for i, sl := range slots {
		out[i] = slotOf(sl)
		out[i].Caller, out[i].CreatedAt = sl.Caller, timeText(sl.CreatedAt)
	}
	writeJSON(w, http.StatusOK, map[string]any{"slots": out, "next_cursor": nextCursor(next)})
}
