package api

import (
	"database/sql"
	"net/http"

	"github.com/sluicehq/sluice/gate/job"
)

type releaseRequest struct {
	Tenant string `json:"tenant"`
}

// release is POST /v1/releases: the HTTP twin of publisher.Producer.Release for producers that
// do not share the database. It writes a capacity-release poke for a tenant (capacity freed
// outside sluice's job transitions) and answers 202 with its outbox id; the relay publishes it.
func (s *Server) release(w http.ResponseWriter, r *http.Request) {
	data, err := readBody(r, bodyOverhead)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var req releaseRequest
	if err := decode(data, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := job.ValidTenant("tenant", req.Tenant); err != nil {
		s.fail(w, r, err)
		return
	}
	// A release is a poke, and one caller's runaway loop must not fill the outbox: beyond the
	// caller's allowance the call writes nothing and says when to come back.
	if wait, limited := s.releases.take(callerOf(r).Name); limited {
		s.fail(w, r, &job.Error{Code: job.CodeRateLimited,
			Message: "too many release events from this caller; retry later",
			Detail:  map[string]any{"retry_after": wait}})
		return
	}
	var id int64
	err = s.inTx(r.Context(), func(tx *sql.Tx) error {
		now, err := s.cfg.Clock.Now(r.Context())
		if err != nil {
			return err
		}
		id, err = s.store.Release(r.Context(), tx, now, req.Tenant)
		return err
	})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"tenant": req.Tenant, "outbox_id": id, "status": "accepted"})
}
