package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
)

// SimulateFunc replays what arrived between since and until (the audit trail's window) under the
// runtime configuration in force and under it with changes, and returns the comparison. An
// invalid change is an error wrapping a *config.FieldError naming its key; a window in which
// nothing arrived is an error wrapping ErrNoArrivals. It must stop when ctx ends and must not
// hold a database transaction open. cmd/sluice/app wires drainer/simulate's RunRecorded, which
// gate/api may not import (README, "Layers").
type SimulateFunc func(ctx context.Context, changes map[string]json.RawMessage, since, until time.Time) (*Simulation, error)

// Simulation is what a SimulateFunc returns.
type Simulation struct {
	// Comparison is the comparison as one JSON object (simulate.Comparison.WriteJSON): changes,
	// current, changed, shifts.
	Comparison json.RawMessage
	// Table is the same for a reader (simulate.Comparison.WriteTable, the top SimulateTop tenants).
	Table string
}

// ErrNoArrivals is what a SimulateFunc's error wraps when nothing arrived in the window: POST
// /v1/config/simulate answers 404 not_found.
var ErrNoArrivals = errors.New("no arrivals in the window")

const (
	// SimulateTop is how many tenants (the busiest first) a Simulation's table shows.
	SimulateTop = 20
	// maxSimulateWindow bounds the window one request replays: a day of the audit trail.
	maxSimulateWindow = 24 * time.Hour
	// defaultSimulateSince is the window when the request names none.
	defaultSimulateSince = "1h"
	// simulateTimeout bounds one simulation, well inside the listener's 90 s write timeout, so
	// that a replay too long for a request is answered rather than cut off.
	simulateTimeout = 60 * time.Second
	// maxSimulations bounds the simulations in progress in one process: each reads a window of
	// the audit trail and replays it twice, on a core of its own, beside the admissions.
	maxSimulations = 1
)

// simulateRequest is the body of POST /v1/config/simulate.
type simulateRequest struct {
	Changes map[string]json.RawMessage `json:"changes"`
	Since   string                     `json:"since"`
	Until   string                     `json:"until"`
}

// simulateConfig is POST /v1/config/simulate (admin): what the arrivals of a window of the audit
// trail (since, default the last hour; until, default now; at most 24 h) would have met under
// the configuration in force and under it with changes (the keys PATCH /v1/config takes; none:
// both columns are the configuration in force), side by side. Nothing is changed. 200 with the
// comparison and its table; 400 naming the field for an invalid change, since or until; 404
// not_found when nothing arrived in the window; 503 when this process does not simulate, or
// already runs maxSimulations, or the replay took longer than simulateTimeout.
func (s *Server) simulateConfig(w http.ResponseWriter, r *http.Request) {
	data, err := readBody(r, 1<<20)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var req simulateRequest
	if err := decode(data, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Since == "" {
		req.Since = defaultSimulateSince
	}
	since, err := parseTimeOrAgo("since", req.Since)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var until timeOrAgo // now
	if req.Until != "" {
		if until, err = parseTimeOrAgo("until", req.Until); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	if s.cfg.Simulate == nil {
		s.fail(w, r, &job.Error{Code: job.CodeUnavailable, Message: "this process does not simulate configuration changes",
			Detail: map[string]any{"retryable": false}})
		return
	}
	if !s.acquire(w, r, s.simulations, fmt.Sprintf("%d simulation(s) in progress; retry shortly", maxSimulations)) {
		return
	}
	defer release(s.simulations)
	now, err := s.cfg.Clock.Now(r.Context())
	if err != nil {
		s.fail(w, r, gate.AsUnavailable(fmt.Errorf("read the clock: %w", err)))
		return
	}
	lo, hi := since.at(now), until.at(now)
	if hi.After(now) {
		hi = now // nothing has arrived after now
	}
	if !lo.Before(hi) {
		s.fail(w, r, job.Invalid("since", "since (%s) must be before until (%s)", lo.Format(time.RFC3339), hi.Format(time.RFC3339)))
		return
	}
	if hi.Sub(lo) > maxSimulateWindow {
		s.fail(w, r, job.Invalid("since", "the window from since (%s) to until (%s) is longer than the 24h a request may simulate; `sluice simulate` replays longer ones",
			lo.Format(time.RFC3339), hi.Format(time.RFC3339)))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), simulateTimeout)
	defer cancel()
	sim, err := s.cfg.Simulate(ctx, req.Changes, lo, hi)
	if err != nil {
		s.fail(w, r, simulateError(ctx, r.Context(), err, lo, hi))
		return
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(sim.Comparison, &body); err != nil {
		s.fail(w, r, fmt.Errorf("simulate: decode the comparison: %w", err))
		return
	}
	for k, v := range map[string]any{"table": sim.Table, "since": lo, "until": hi} {
		raw, err := json.Marshal(v)
		if err != nil {
			s.fail(w, r, fmt.Errorf("simulate: encode %s: %w", k, err))
			return
		}
		body[k] = raw
	}
	writeJSON(w, http.StatusOK, body)
}

// simulateError is the API's answer to a SimulateFunc's error: 400 naming the key of an invalid
// change, 404 for an empty window, 503 busy when the simulation outlived simulateTimeout (ctx),
// 503 unavailable when the request (reqCtx) ended first or the database could not be read.
func simulateError(ctx, reqCtx context.Context, err error, lo, hi time.Time) error {
	var fe *config.FieldError
	switch {
	case errors.As(err, &fe):
		return &job.Error{Code: job.CodeInvalidRequest, Message: fe.Error(),
			Detail: map[string]any{"field": fe.Key, "reason": fe.Reason}}
	case errors.Is(err, ErrNoArrivals):
		return job.Errorf(job.CodeNotFound, "nothing arrived between %s and %s: the audit trail holds no admission or slot request in that window (a quiet window, or older than audit_retention_days)",
			lo.Format(time.RFC3339), hi.Format(time.RFC3339))
	case reqCtx.Err() != nil:
		// The caller went away (the console's operator left the page): nobody reads the answer.
		return &job.Error{Code: job.CodeUnavailable, Err: err, Message: "the request ended before the simulation did",
			Detail: map[string]any{"retryable": true}}
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return &job.Error{Code: job.CodeBusy, Err: err, Detail: map[string]any{"retryable": false},
			Message: fmt.Sprintf("the simulation did not finish within %s: simulate a shorter window, or run `sluice simulate`, which has no bound", simulateTimeout)}
	}
	return gate.AsUnavailable(fmt.Errorf("simulate: %w", err))
}

// timeOrAgo is an instant given as a time or as a duration before now.
type timeOrAgo struct {
	abs bool
	t   time.Time     // abs: this instant
	ago time.Duration // else now less this
}

func (v timeOrAgo) at(now time.Time) time.Time {
	if v.abs {
		return v.t
	}
	return now.Add(-v.ago)
}

// parseTimeOrAgo parses an RFC 3339 time or a positive duration ago ("1h", "15m", also "-1h"),
// or answers 400 naming field.
func parseTimeOrAgo(field, v string) (timeOrAgo, error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return timeOrAgo{abs: true, t: t.UTC()}, nil
	}
	d, err := time.ParseDuration(strings.TrimPrefix(v, "-"))
	if err != nil || d <= 0 {
		return timeOrAgo{}, job.Invalid(field, "%s must be an RFC 3339 time (2026-01-02T15:04:05Z) or a duration ago such as 15m, 1h or 24h, got %q", field, v)
	}
	return timeOrAgo{ago: d}, nil
}
