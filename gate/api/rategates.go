package api

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/rategate"
	"github.com/sluicehq/sluice/gate/store"
)

// GateAnswer is the body of POST /v1/gates and DELETE /v1/gates/{rate_key_sha256}.
type GateAnswer struct {
	RateKeySHA256 string     `json:"rate_key_sha256"`
	NotBefore     *time.Time `json:"not_before"`
}

type gateRequest struct {
	RateKey       *string `json:"rate_key"`
	RateKeySHA256 *string `json:"rate_key_sha256"`
	RetryAfter    *int    `json:"retry_after"`
}

// gateError maps a gate store error to the API's vocabulary: memcached unavailable is a
// retryable 503, a bad argument a 400.
func gateError(field string, err error) error {
	switch {
	case errors.Is(err, rategate.ErrUnavailable):
		return &job.Error{Code: job.CodeUnavailable, Message: "the gate store (memcached) is unavailable",
			Detail: map[string]any{"retryable": true}, Err: err}
	case errors.Is(err, rategate.ErrInvalid):
		return &job.Error{Code: job.CodeInvalidRequest, Message: strings.TrimPrefix(err.Error(), rategate.ErrInvalid.Error()+": "),
			Detail: map[string]any{"field": field}}
	}
	return err
}

func (s *Server) gatesConfigured(w http.ResponseWriter, r *http.Request) bool {
	if s.cfg.RateGates == nil {
		s.fail(w, r, &job.Error{Code: job.CodeUnavailable, Message: "rate gates are not configured (SLUICE_MEMCACHED)",
			Detail: map[string]any{"retryable": false}})
		return false
	}
	return true
}

// validRetryAfter checks a retry_after field (SPEC §5: whole seconds, 1 to 86,400).
func validRetryAfter(field string, v *int) error {
	if v == nil {
		return job.Invalid(field, "%s is required", field)
	}
	if err := rategate.ValidRetryAfter(*v); err != nil {
		return job.Invalid(field, "%s must be whole seconds from %d to %d", field, rategate.MinRetryAfter, rategate.MaxRetryAfter)
	}
	return nil
}

// setGate is POST /v1/gates: an executor (or admin) gates a rate key, named raw or by its hash.
func (s *Server) setGate(w http.ResponseWriter, r *http.Request) {
	if !s.gatesConfigured(w, r) {
		return
	}
	data, err := readBody(r, bodyOverhead)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var req gateRequest
	if err := decode(data, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	var hash string
	switch {
	case req.RateKey != nil && req.RateKeySHA256 != nil:
		s.fail(w, r, job.Invalid("rate_key", "give rate_key or rate_key_sha256, not both"))
		return
	case req.RateKey != nil:
		k := *req.RateKey
		switch {
		case k == "":
			s.fail(w, r, job.Invalid("rate_key", "rate_key must not be empty"))
			return
		case len(k) > gate.MaxRateKeyBytes:
			s.fail(w, r, job.Invalid("rate_key", "rate_key is %d bytes; at most %d", len(k), gate.MaxRateKeyBytes))
			return
		case !utf8.ValidString(k):
			s.fail(w, r, job.Invalid("rate_key", "rate_key is not valid UTF-8"))
			return
		}
		hash = gate.RateKeyHash(k)
	case req.RateKeySHA256 != nil:
		hash = strings.ToLower(*req.RateKeySHA256)
		if !rategate.ValidHash(hash) {
			s.fail(w, r, job.Invalid("rate_key_sha256", "rate_key_sha256 must be 64 hex digits"))
			return
		}
	default:
		s.fail(w, r, job.Invalid("rate_key", "rate_key or rate_key_sha256 is required"))
		return
	}
	if err := validRetryAfter("retry_after", req.RetryAfter); err != nil {
		s.fail(w, r, err)
		return
	}
	nb, err := s.cfg.RateGates.Extend(r.Context(), hash, *req.RetryAfter)
	if err != nil {
		s.fail(w, r, gateError("retry_after", err))
		return
	}
	s.cfg.Log.Info("rate key gated", "rate_key_sha256", hash, "retry_after", *req.RetryAfter,
		"not_before", nb, "caller", callerOf(r).Name)
	writeJSON(w, http.StatusOK, GateAnswer{RateKeySHA256: hash, NotBefore: &nb})
}

// listGates is GET /v1/gates: the gated keys among the rate keys of queued jobs.
func (s *Server) listGates(w http.ResponseWriter, r *http.Request) {
	if !s.gatesConfigured(w, r) {
		return
	}
	queued, err := store.QueuedRateKeys(r.Context(), s.cfg.DB, 0)
	if err != nil {
		s.fail(w, r, gate.AsUnavailable(err))
		return
	}
	gated, err := rategate.Queued(r.Context(), queued, s.cfg.RateGates)
	if err != nil {
		// gateError goes first: memcached's outage is its own 503, which must not be reported as
		// the database's.
		s.fail(w, r, gate.AsUnavailable(gateError("", err)))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"gates": gated})
}

// clearGate is DELETE /v1/gates/{rate_key_sha256}: an operator lifts a gate.
func (s *Server) clearGate(w http.ResponseWriter, r *http.Request) {
	if !s.gatesConfigured(w, r) {
		return
	}
	hash := strings.ToLower(r.PathValue("rate_key_sha256"))
	if !rategate.ValidHash(hash) {
		s.fail(w, r, job.Invalid("rate_key_sha256", "rate_key_sha256 must be 64 hex digits"))
		return
	}
	if err := s.cfg.RateGates.Clear(r.Context(), hash); err != nil {
		s.fail(w, r, gateError("rate_key_sha256", err))
		return
	}
	s.cfg.Log.Info("rate key gate cleared", "rate_key_sha256", hash, "caller", callerOf(r).Name)
	writeJSON(w, http.StatusOK, GateAnswer{RateKeySHA256: hash})
}

// gateFromCompletion applies the gate field of a /complete to the rate key of row, the job as
// store.Complete read it, when the report carries a nonce sluice sent with that job's dispatch
// (row.SentNonce). Only the executor that dispatch reached holds it, so its quota news is true
// whatever became of the outcome (a repeat, a conflict, a late report on a voided dispatch);
// without that proof an executor token alone could gate any job's key for a day. The outcome is
// already recorded (or refused); a gate store that fails is never turned into an error, because
// the executor cannot usefully retry a completion for it, and is logged at debug level only (the
// store warns of the outage itself, at most once per 15 s).
func (s *Server) gateFromCompletion(ctx context.Context, row store.Row, nonce string, retryAfter int) {
	if s.cfg.RateGates == nil || row.RateKeySHA256 == nil {
		return
	}
	if !row.SentNonce(nonce) {
		s.cfg.Log.Info("ignored the gate of a completion whose nonce is not the job's dispatch's", "job_id", row.ID)
		return
	}
	if _, err := s.cfg.RateGates.Extend(ctx, *row.RateKeySHA256, retryAfter); err != nil {
		s.cfg.Log.Debug("could not apply the gate of a completion", "job_id", row.ID, "rate_key_sha256", *row.RateKeySHA256, "error", err)
	}
}
