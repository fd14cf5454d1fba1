// Package job is sluice's shared vocabulary: job states, the job record as the API shows it,
// and the stable error codes of SPEC §6. It lives under gate because admission is where a job
// is born, and it imports nothing of sluice so that gate, drainer and the clients can all share
// it without import cycles.
package job

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Status is a job's lifecycle state (SPEC §4). The string is stable API.
type Status string

// The job states of SPEC §4.
const (
	Queued     Status = "queued"
	Claimed    Status = "claimed"
	Dispatched Status = "dispatched"
	Running    Status = "running"
	Succeeded  Status = "succeeded"
	Failed     Status = "failed"
	Canceled   Status = "canceled"
	Rejected   Status = "rejected"
	Lost       Status = "lost"
	Expired    Status = "expired"
	// Replaced: a queued job superseded by a newer admission with the same replace_key, never
	// dispatched; ReplacedBy names its successor.
	Replaced Status = "replaced"
)

// InFlight reports whether s counts against the in-flight caps.
func (s Status) InFlight() bool { return s == Claimed || s == Dispatched || s == Running }

// Terminal reports whether s is final: no writer may change a job in such a state.
func (s Status) Terminal() bool {
	switch s {
	case Succeeded, Failed, Canceled, Rejected, Lost, Expired, Replaced:
		return true
	}
	return false
}

// TerminalStates returns the states for which Terminal is true, in SPEC §4's order, as a new
// slice the caller may keep.
func TerminalStates() []Status {
	return []Status{Succeeded, Failed, Canceled, Rejected, Lost, Expired, Replaced}
}

// Job is a job as the API reads it (SPEC §6). Timestamps are UTC with microseconds.
type Job struct {
	ID            int64           `json:"id"`
	Tenant        string          `json:"tenant"`
	RateKeySHA256 *string         `json:"rate_key_sha256"`
	Status        Status          `json:"status"`
	Version       int64           `json:"version"`
	Attempt       int             `json:"attempt"`
	Position      *int64          `json:"position,omitempty"`
	QueuedAt      time.Time       `json:"queued_at"`
	ClaimedAt     *time.Time      `json:"claimed_at"`
	DispatchedAt  *time.Time      `json:"dispatched_at"`
	StartedAt     *time.Time      `json:"started_at"`
	FinishedAt    *time.Time      `json:"finished_at"`
	ErrorCode     *string         `json:"error_code"`
	ErrorMessage  *string         `json:"error_message"`
	Result        json.RawMessage `json:"result"`
	RetryOf       *int64          `json:"retry_of"`
	// Lanes are the lanes the job counts toward while in flight (SPEC §5a), sorted; [] when none.
	Lanes []string `json:"lanes"`
	// Interactive jobs may use the interactive reserve and go first within their tenant.
	Interactive bool `json:"interactive"`
	// Priority (0-9, DefaultPriority) orders its tenant's other queued jobs: higher first, then
	// by age; a job queued longer than priority_aging_seconds goes as if at MaxPriority.
	Priority int `json:"priority"`
	// NotBefore, for a queued job, is the instant before which it is not claimed: the run_at or
	// delay_seconds it was admitted with, or the retry time of an executor's 503 refusal.
	NotBefore *time.Time `json:"not_before,omitempty"`
	// StartBy is the job's start deadline: not dispatched by then, it ends expired with
	// error_code start_deadline.
	StartBy *time.Time `json:"start_by,omitempty"`
	// ReplaceKey is the key the job was admitted with: while it is queued, a newer admission of
	// its tenant with the same key replaces it. ReplacedBy, once it is replaced, names the job
	// that did.
	ReplaceKey *string `json:"replace_key,omitempty"`
	ReplacedBy *int64  `json:"replaced_by,omitempty"`
	// WaitingOn, for a queued job read alone (GET /v1/jobs/{id}), is the scope holding it now
	// (the Waiting* constants, or "lane:<name>"); WaitingUntil is when that scope ends, for a
	// rate key's gate and a not-before. EstimatedStart is when it should start, or nil when
	// nothing says (a paused limit, or no recent service time to go by).
	WaitingOn      string     `json:"waiting_on,omitempty"`
	WaitingUntil   *time.Time `json:"waiting_until,omitempty"`
	EstimatedStart *time.Time `json:"estimated_start,omitempty"`
}

// Job priorities (SPEC §5).
const (
	MinPriority     = 0
	DefaultPriority = 5
	MaxPriority     = 9
)

// What holds a queued job (Job.WaitingOn; SPEC §6). A lane's scope is "lane:" and its name.
const (
	WaitingTenantCap = "tenant_cap"
	WaitingGlobalCap = "global_cap"
	WaitingTier      = "tier"
	WaitingReserve   = "reserve"
	WaitingRateKey   = "rate_key"
	WaitingNotBefore = "not_before"
	WaitingPaused    = "paused"
	// WaitingNext: nothing holds it; the next claim takes it.
	WaitingNext = "next"
)

// TimeFormat is how the API writes a timestamp (SPEC §4: RFC 3339, UTC, microseconds). It
// keeps all six fractional digits: time.RFC3339Nano drops trailing zeros, so one timestamp in ten
// would print five digits or fewer, and one on a whole second none.
const TimeFormat = "2006-01-02T15:04:05.000000Z07:00"

// MarshalJSON writes j with its timestamps in TimeFormat (AppendJSON).
func (j Job) MarshalJSON() ([]byte, error) {
	return j.AppendJSON(make([]byte, 0, 512))
}

// AppendJSON appends j's JSON to b: the bytes json.Marshal wrote for it before, field for field
// (TestJobJSONMatchesReflection holds the two together), without reflection. A batch answers a
// thousand jobs, and encoding them through encoding/json cost more than admitting them. A
// writer that appends these bytes itself also skips the pass in which encoding/json validates
// and compacts every MarshalJSON's output again (writeJob, writeBatch in gate/api).
func (j Job) AppendJSON(b []byte) ([]byte, error) {
	b = append(b, `{"id":`...)
	b = strconv.AppendInt(b, j.ID, 10)
	b = append(b, `,"tenant":`...)
	b = appendString(b, j.Tenant)
	b = append(b, `,"rate_key_sha256":`...)
	b = appendOptString(b, j.RateKeySHA256)
	b = append(b, `,"status":`...)
	b = appendString(b, string(j.Status))
	b = append(b, `,"version":`...)
	b = strconv.AppendInt(b, j.Version, 10)
	b = append(b, `,"attempt":`...)
	b = strconv.AppendInt(b, int64(j.Attempt), 10)
	if j.Position != nil {
		b = append(b, `,"position":`...)
		b = strconv.AppendInt(b, *j.Position, 10)
	}
	b = append(b, `,"error_code":`...)
	b = appendOptString(b, j.ErrorCode)
	b = append(b, `,"error_message":`...)
	b = appendOptString(b, j.ErrorMessage)
	b = append(b, `,"result":`...)
	if j.Result == nil {
		b = append(b, "null"...)
	} else {
		// Validated, compacted and escaped as encoding/json does a RawMessage.
		raw, err := json.Marshal(j.Result)
		if err != nil {
			return nil, fmt.Errorf("job %d's result: %w", j.ID, err)
		}
		b = append(b, raw...)
	}
	b = append(b, `,"retry_of":`...)
	b = appendOptInt(b, j.RetryOf)
	b = append(b, `,"interactive":`...)
	b = strconv.AppendBool(b, j.Interactive)
	b = append(b, `,"priority":`...)
	b = strconv.AppendInt(b, int64(j.Priority), 10)
	if j.ReplaceKey != nil {
		b = append(b, `,"replace_key":`...)
		b = appendString(b, *j.ReplaceKey)
	}
	if j.ReplacedBy != nil {
		b = append(b, `,"replaced_by":`...)
		b = strconv.AppendInt(b, *j.ReplacedBy, 10)
	}
	if j.WaitingOn != "" {
		b = append(b, `,"waiting_on":`...)
		b = appendString(b, j.WaitingOn)
	}
	b = append(b, `,"queued_at":`...)
	b = appendTime(b, j.QueuedAt)
	b = append(b, `,"claimed_at":`...)
	b = appendOptTime(b, j.ClaimedAt)
	b = append(b, `,"dispatched_at":`...)
	b = appendOptTime(b, j.DispatchedAt)
	b = append(b, `,"started_at":`...)
	b = appendOptTime(b, j.StartedAt)
	b = append(b, `,"finished_at":`...)
	b = appendOptTime(b, j.FinishedAt)
	b = append(b, `,"lanes":[`...)
	for i, l := range j.Lanes {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, l)
	}
	b = append(b, ']')
	b = appendOmittedTime(b, `,"not_before":`, j.NotBefore)
	b = appendOmittedTime(b, `,"start_by":`, j.StartBy)
	b = appendOmittedTime(b, `,"waiting_until":`, j.WaitingUntil)
	b = appendOmittedTime(b, `,"estimated_start":`, j.EstimatedStart)
	return append(b, '}'), nil
}

// appendString appends s as a JSON string, escaped as encoding/json escapes it (HTML characters
// included). Only strings of plain printable ASCII are written here; any other goes through
// json.Marshal, so that the rules for control characters, invalid UTF-8 and U+2028 stay the
// standard library's.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			quoted, _ := json.Marshal(s) // a string always marshals
			return append(b, quoted...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

func appendOptString(b []byte, s *string) []byte {
	if s == nil {
		return append(b, "null"...)
	}
	return appendString(b, *s)
}

func appendOptInt(b []byte, n *int64) []byte {
	if n == nil {
		return append(b, "null"...)
	}
	return strconv.AppendInt(b, *n, 10)
}

// appendTime appends t in TimeFormat, quoted: its digits and separators need no escaping.
func appendTime(b []byte, t time.Time) []byte {
	b = append(b, '"')
	b = t.UTC().AppendFormat(b, TimeFormat)
	return append(b, '"')
}

func appendOptTime(b []byte, t *time.Time) []byte {
	if t == nil {
		return append(b, "null"...)
	}
	return appendTime(b, *t)
}

// appendOmittedTime appends a field that is left out when nil (omitempty): key, then t.
func appendOmittedTime(b []byte, key string, t *time.Time) []byte {
	if t == nil {
		return b
	}
	return appendTime(append(b, key...), *t)
}

// Code is a stable error code (SPEC §6 `error_code`).
type Code string

// The error codes of SPEC §6 and §8.
const (
	CodeInvalidRequest      Code = "invalid_request"
	CodeUnauthorized        Code = "unauthorized"
	CodeForbidden           Code = "forbidden"
	CodeNotFound            Code = "not_found"
	CodePayloadTooLarge     Code = "payload_too_large"
	CodeQueueFull           Code = "queue_full"
	CodeCapacityExceeded    Code = "capacity_exceeded"
	CodeRateLimited         Code = "rate_limited"
	CodeIdempotencyConflict Code = "idempotency_conflict"
	CodeNotCancelable       Code = "not_cancelable"
	CodeNonceInvalid        Code = "nonce_invalid"
	CodeNonceExpired        Code = "nonce_expired"
	CodeNonceUsed           Code = "nonce_used"
	CodeDispatchVoid        Code = "dispatch_void"
	CodeOutcomeConflict     Code = "outcome_conflict"
	CodeUnavailable         Code = "unavailable"
	CodeOutcomeUnknown      Code = "outcome_unknown"
	CodeDispatchFailed      Code = "dispatch_failed"
	CodeInternal            Code = "internal"
	CodeMethodNotAllowed    Code = "method_not_allowed"
	CodeNotRedrivable       Code = "not_redrivable"
	// CodeSlotLost: a slot's lease ran out before its renewal; it is gone and never revived.
	CodeSlotLost Code = "slot_lost"
	// CodeBusy: the API is at its bound of requests in progress (or of batches); retry after
	// Retry-After. Nothing was read or written.
	CodeBusy Code = "busy"
	// CodeDeadlineUnreachable: an admission with refuse_if_late whose start_by cannot be met by
	// its due time, or by its place in its tenant's queue and the tenant's recent service time.
	CodeDeadlineUnreachable Code = "deadline_unreachable"
	// CodeStartDeadline is the error_code of a job that ended expired because it was not
	// dispatched by its start_by.
	CodeStartDeadline Code = "start_deadline"
)

// Error is an application error with a stable code. The HTTP edge maps Code to a status; Detail
// fields are added to the JSON error body. Message is safe to show to a client.
type Error struct {
	Code    Code
	Message string
	Detail  map[string]any
	Err     error // the cause, for logs only
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.Err)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an *Error with code c and a formatted message.
func Errorf(c Code, format string, args ...any) *Error {
	return &Error{Code: c, Message: fmt.Sprintf(format, args...)}
}

// Invalid returns an invalid_request error naming the offending field.
func Invalid(field, format string, args ...any) *Error {
	return &Error{Code: CodeInvalidRequest, Message: fmt.Sprintf(format, args...), Detail: map[string]any{"field": field}}
}

// ErrorCode returns the code of the first *Error in err's chain, or CodeInternal.
func ErrorCode(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// BatchItem is one result of POST /v1/jobs:batch, as the API writes it and the client reads it:
// the HTTP status the item would have had alone (202 admitted, 200 replayed, 4xx refused), the
// admission decision, and its job or its error body.
type BatchItem struct {
	Status   int            `json:"status"`
	Decision string         `json:"decision,omitempty"`
	Replayed bool           `json:"replayed,omitempty"`
	Job      *Job           `json:"job,omitempty"`
	Error    map[string]any `json:"error,omitempty"`
}

// AppendJSON appends the item's JSON to b, the bytes json.Marshal writes for it, without reflection
// for its job (Job.AppendJSON). The error body, rare and small, goes through json.Marshal.
func (it BatchItem) AppendJSON(b []byte) ([]byte, error) {
	b = append(b, `{"status":`...)
	b = strconv.AppendInt(b, int64(it.Status), 10)
	if it.Decision != "" {
		b = append(b, `,"decision":`...)
		b = appendString(b, it.Decision)
	}
	if it.Replayed {
		b = append(b, `,"replayed":true`...)
	}
	var err error
	if it.Job != nil {
		if b, err = it.Job.AppendJSON(append(b, `,"job":`...)); err != nil {
			return nil, err
		}
	}
	if len(it.Error) > 0 {
		body, err := json.Marshal(it.Error)
		if err != nil {
			return nil, fmt.Errorf("error body: %w", err)
		}
		b = append(append(b, `,"error":`...), body...)
	}
	return append(b, '}'), nil
}
