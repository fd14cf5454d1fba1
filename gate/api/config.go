package api

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/sqldb"
)

// configBody is GET /v1/config and the answer of PATCH /v1/config (SPEC §9).
type configBody struct {
	Version int64         `json:"version"`
	Config  config.Config `json:"config"`
	// Change is the history entry a PATCH created; absent when it changed nothing.
	Change *config.Change `json:"change,omitempty"`
}

// getConfig is GET /v1/config (admin): the version in force, read from the database so that
// every process answers the same.
func (s *Server) getConfig(w http.ResponseWriter, r *http.Request) {
	v, err := config.Load(r.Context(), s.cfg.DB)
	if err != nil {
		s.fail(w, r, gate.AsUnavailable(err))
		return
	}
	writeJSON(w, http.StatusOK, configBody{Version: v.Version, Config: v.Config})
}

// patchRequest is the body of PATCH /v1/config.
type patchRequest struct {
	Changes map[string]json.RawMessage `json:"changes"`
	Note    string                     `json:"note"`
}

// patchConfig is PATCH /v1/config (admin): all changes or none, validated with the reason; one
// history row and one log line per new version. This process re-reads at once; the others
// within config.ReloadEvery.
func (s *Server) patchConfig(w http.ResponseWriter, r *http.Request) {
	data, err := readBody(r, 1<<20)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var req patchRequest
	if err := decode(data, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if len(req.Changes) == 0 {
		s.fail(w, r, job.Invalid("changes", "changes must be an object of at least one key and its new value"))
		return
	}
	if len(req.Note) > 10000 {
		s.fail(w, r, job.Invalid("note", "note is at most 10000 bytes"))
		return
	}
	v, ch, err := config.Patch(r.Context(), s.cfg.DB, s.cfg.Log, callerOf(r).Name, req.Changes, req.Note)
	var fe *config.FieldError
	if errors.As(err, &fe) {
		s.fail(w, r, &job.Error{Code: job.CodeInvalidRequest, Message: fe.Error(),
			Detail: map[string]any{"field": fe.Key, "reason": fe.Reason}})
		return
	}
	if errors.Is(err, config.ErrCommit) && sqldb.ConnectionLost(err) {
		// The same PATCH again sets the same values, so it is safe to repeat: if the first one
		// was written, the repeat changes nothing.
		s.fail(w, r, outcomeUnknown(err))
		return
	}
	if err != nil {
		s.fail(w, r, gate.AsUnavailable(err))
		return
	}
	_ = s.cfg.Limits.Reload(r.Context()) // a failure keeps the last good config; the loop retries
	body := configBody{Version: v.Version, Config: v.Config}
	if ch.Version != 0 {
		body.Change = &ch
	}
	writeJSON(w, http.StatusOK, body)
}

// configHistory is GET /v1/config/history?limit=&cursor= (admin): a page of changes, newest
// first, paged like GET /v1/jobs (limit 50 by default, at most 1,000, the cursor the version the
// next page starts below), so that a request reads a page of versions, never the whole history.
func (s *Server) configHistory(w http.ResponseWriter, r *http.Request) {
	limit, before, err := idPage(r.URL.Query())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	h, err := config.History(r.Context(), s.cfg.DB, before, limit)
	if err != nil {
		s.fail(w, r, gate.AsUnavailable(err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"history": h.Changes, "next_cursor": nextCursor(h.Next)})
}
