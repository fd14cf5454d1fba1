package api

import (
	"database/sql"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice/drainer/store"
	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/job"
)

func (s *Server) admit(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	cfg := s.cfg.Limits.Current().Config
	data, err := readBody(r, cfg.MaxPayloadBytes+bodyOverhead)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var req gate.Request
	if err := decode(data, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Tenant != "" && !c.MayActFor(req.Tenant) {
		s.fail(w, r, job.Errorf(job.CodeForbidden, "this token may not act for that tenant"))
		return
	}
	res, err := s.cfg.Admitter.Admit(r.Context(), c.Name, req)
	if res.Decision != "" {
		w.Header().Set("Sluice-Capacity-Decision", string(res.Decision))
		w.Header().Set("Sluice-Capacity-Limit", strconv.Itoa(res.Limit))
		w.Header().Set("Sluice-Capacity-In-Flight", strconv.Itoa(res.InFlight))
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/jobs/"+strconv.FormatInt(res.Job.ID, 10))
	if res.Job.Position != nil && res.Decision != "" {
		w.Header().Set("Sluice-Queue-Position", strconv.FormatInt(*res.Job.Position, 10))
	}
	if res.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
		writeJSON(w, http.StatusOK, res.Job)
		return
	}
	writeJSON(w, http.StatusAccepted, res.Job)
}

// visible reads job id for the caller: a producer asking for another tenant's job gets the same
// not_found as for a missing id.
func (s *Server) visible(r *http.Request) (store.Row, error) {
	id, err := pathID(r)
	if err != nil {
		return store.Row{}, err
	}
	row, err := s.cfg.Admitter.Get(r.Context(), id)
	if err != nil {
		return row, err
	}
	c := callerOf(r)
	if c.Role != Executor && !c.MayActFor(row.Tenant) {
		return row, store.ErrNotFound
	}
	return row, nil
}

func (s *Server) getJob(w http.ResponseWriter, r *http.Request) {
	row, err := s.visible(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, row.Job)
}

func (s *Server) cancel(w http.ResponseWriter, r *http.Request) {
	if _, err := s.visible(r); err != nil {
		s.fail(w, r, err)
		return
	}
	id, _ := pathID(r)
	var row store.Row
	err := s.inTx(r.Context(), func(tx *sql.Tx) error {
		now, err := s.cfg.Clock.Now(r.Context())
		if err != nil {
			return err
		}
		row, err = s.store.Cancel(r.Context(), tx, now, id)
		return err
	})
	if err == store.ErrNotCancelable {
		s.fail(w, r, &job.Error{Code: job.CodeNotCancelable, Message: "only a queued job can be canceled",
			Detail: map[string]any{"status": row.Status}})
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, row.Job)
}

type startRequest struct {
	Nonce string `json:"nonce"`
}

func (s *Server) start(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	data, err := readBody(r, bodyOverhead)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var req startRequest
	if err := decode(data, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Nonce == "" {
		s.fail(w, r, job.Invalid("nonce", "nonce is required"))
		return
	}
	var row store.Row
	err = s.inTx(r.Context(), func(tx *sql.Tx) error {
		now, err := s.cfg.Clock.Now(r.Context())
		if err != nil {
			return err
		}
		row, err = s.store.ConfirmStart(r.Context(), tx, now, id, req.Nonce)
		return err
	})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, row.Job)
}

type completeRequest struct {
	Nonce        string          `json:"nonce"`
	Status       string          `json:"status"`
	ErrorCode    string          `json:"error_code"`
	ErrorMessage string          `json:"error_message"`
	Result       json.RawMessage `json:"result"`
	Gate         *struct {
		RetryAfter *int `json:"retry_after"`
	} `json:"gate"`
}

func (s *Server) complete(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	data, err := readBody(r, s.cfg.Limits.Current().Config.MaxPayloadBytes+bodyOverhead)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var req completeRequest
	if err := decode(data, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	switch {
	case req.Nonce == "":
		s.fail(w, r, job.Invalid("nonce", "nonce is required"))
		return
	case req.Status != "succeeded" && req.Status != "failed" && req.Status != "not_started":
		s.fail(w, r, job.Invalid("status", "status must be succeeded, failed or not_started"))
		return
	case len(req.ErrorCode) > 64:
		s.fail(w, r, job.Invalid("error_code", "error_code is at most 64 bytes"))
		return
	}
	if req.Gate != nil {
		if err := validRetryAfter("gate.retry_after", req.Gate.RetryAfter); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	var row store.Row
	err = s.inTx(r.Context(), func(tx *sql.Tx) error {
		now, err := s.cfg.Clock.Now(r.Context())
		if err != nil {
			return err
		}
		row, err = s.store.Complete(r.Context(), tx, now, id, store.Completion{
			Nonce: req.Nonce, Status: req.Status, ErrorCode: req.ErrorCode,
			ErrorMessage: req.ErrorMessage, Result: req.Result})
		return err
	})
	if req.Gate != nil {
		// The quota news is true whatever became of this outcome: gate the key either way.
		s.gateFromCompletion(r.Context(), id, row.RateKeySHA256, *req.Gate.RetryAfter)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, row.Job)
}
