package api

import (
	"context"
	"net/http"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/status"
)

// StatusReader reads GET /v1/status; *status.Reader is one.
type StatusReader interface {
	Read(ctx context.Context) (status.Status, error)
}

// getStatus is GET /v1/status (admin): SPEC §6.
func (s *Server) getStatus(w http.ResponseWriter, r *http.Request) {
	reader := s.cfg.Status
	if reader == nil {
		// No probes wired (a test server): the database part of the status, broker and
		// memcached reported as down.
		sr, err := status.New(status.Config{DB: s.cfg.DB, Limits: s.cfg.Limits})
		if err != nil {
			s.fail(w, r, err)
			return
		}
		reader = sr
	}
	st, err := reader.Read(r.Context())
	if err != nil {
		s.fail(w, r, gate.AsUnavailable(err))
		return
	}
	writeJSON(w, http.StatusOK, st)
}
