package gate

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
)

// Request is one admission as the API decodes it (SPEC §6 POST /v1/jobs).
type Request struct {
	Tenant         string          `json:"tenant"`
	RateKey        *string         `json:"rate_key,omitempty"`
	Payload        json.RawMessage `json:"payload,omitempty"`
	IdempotencyKey *string         `json:"idempotency_key,omitempty"`
	Queue          *bool           `json:"queue,omitempty"`
	// Lanes name configured lanes the job counts toward while in flight (SPEC §5a); Validate
	// sorts them and drops repeats.
	Lanes       []string `json:"lanes,omitempty"`
	Interactive *bool    `json:"interactive,omitempty"`
	// RunAt (RFC 3339) or DelaySeconds schedule the job: it is queued at once, counts toward
	// the depth caps, and is not claimed before then (SPEC §6).
	RunAt        *string  `json:"run_at,omitempty"`
	DelaySeconds *float64 `json:"delay_seconds,omitempty"`
	// StartBy (RFC 3339) is the job's start deadline: not dispatched by then, it ends expired
	// (start_deadline). With RefuseIfLate an admission that cannot meet it is refused instead
	// (429 deadline_unreachable).
	StartBy      *string `json:"start_by,omitempty"`
	RefuseIfLate *bool   `json:"refuse_if_late,omitempty"`
	// ReplaceKey keeps only the newest queued job per key: an admission with it replaces its
	// tenant's queued job with the same key (SPEC §6).
	ReplaceKey *string `json:"replace_key,omitempty"`
	// Priority (0-9, default 5) orders the tenant's queued jobs after the interactive ones:
	// higher first, then by age (SPEC §5).
	Priority *int `json:"priority,omitempty"`
	// Aware: the request carried Sluice-Capacity-Aware: true, so its client handles a capacity
	// refusal; with enforce_for=aware only such requests are refused on capacity (SPEC §5a).
	Aware bool `json:"-"`
}

// MaxLanes bounds the lanes one job may name: each is a limit the claim checks, and they are
// stored inline in the job's row (migration 0014).
const MaxLanes = 8

// Limits on request fields (SPEC §6).
const (
	MaxTenantBytes         = job.MaxTenantBytes
	MaxRateKeyBytes        = 1024
	MaxIdempotencyKeyBytes = 255
	MaxReplaceKeyBytes     = 255
)

// Validate checks r against the static rules and maxPayload; it returns a *job.Error naming the
// field.
func (r *Request) Validate(maxPayload int) error {
	if err := job.ValidTenant("tenant", r.Tenant); err != nil {
		return err
	}
	if r.RateKey != nil {
		switch k := *r.RateKey; {
		case k == "":
			return job.Invalid("rate_key", "rate_key must not be empty (omit it instead)")
		case len(k) > MaxRateKeyBytes:
			return job.Invalid("rate_key", "rate_key is %d bytes; at most %d", len(k), MaxRateKeyBytes)
		case !utf8.ValidString(k):
			return job.Invalid("rate_key", "rate_key is not valid UTF-8")
		}
	}
	if r.IdempotencyKey != nil {
		switch k := *r.IdempotencyKey; {
		case k == "":
			return job.Invalid("idempotency_key", "idempotency_key must not be empty (omit it instead)")
		case len(k) > MaxIdempotencyKeyBytes:
			return job.Invalid("idempotency_key", "idempotency_key is %d bytes; at most %d", len(k), MaxIdempotencyKeyBytes)
		case !utf8.ValidString(k):
			return job.Invalid("idempotency_key", "idempotency_key is not valid UTF-8")
		}
	}
	if err := r.normalLanes(); err != nil {
		return err
	}
	if r.RunAt != nil || r.DelaySeconds != nil || r.StartBy != nil || r.RefuseIfLate != nil {
		now := time.Now()
		if err := r.validSchedule(now); err != nil {
			return err
		}
		if err := r.validDeadline(now); err != nil {
			return err
		}
	}
	if r.ReplaceKey != nil {
		switch k := *r.ReplaceKey; {
		case k == "":
			return job.Invalid("replace_key", "replace_key must not be empty (omit it instead)")
		case len(k) > MaxReplaceKeyBytes:
			return job.Invalid("replace_key", "replace_key is %d bytes; at most %d", len(k), MaxReplaceKeyBytes)
		case !utf8.ValidString(k):
			return job.Invalid("replace_key", "replace_key is not valid UTF-8")
		case r.Queue != nil && !*r.Queue:
			return job.Invalid("queue", "queue=false admits only a job that starts now; it replaces no queued job (replace_key)")
		}
	}
	if r.Priority != nil && (*r.Priority < job.MinPriority || *r.Priority > job.MaxPriority) {
		return job.Invalid("priority", "priority must be an integer from %d to %d (default %d), got %d",
			job.MinPriority, job.MaxPriority, job.DefaultPriority, *r.Priority)
	}
	if len(r.Payload) > maxPayload {
		return &job.Error{Code: job.CodePayloadTooLarge,
			Message: "payload is larger than the limit",
			Detail:  map[string]any{"field": "payload", "limit_bytes": maxPayload}}
	}
	if bytes.Equal(bytes.TrimSpace(r.Payload), []byte("null")) {
		r.Payload = nil
	}
	return nil
}

// MaxSchedule bounds how far ahead a job may be scheduled (run_at, delay_seconds).
const MaxSchedule = 365 * 24 * time.Hour

// validSchedule checks run_at and delay_seconds: one of them at most, a run_at in RFC 3339 at
// most MaxSchedule after now (this process's clock, which follows the database's), a delay from
// 0 to MaxSchedule, and neither with queue=false, which admits only a job that starts now.
func (r *Request) validSchedule(now time.Time) error {
	if r.RunAt == nil && r.DelaySeconds == nil {
		return nil
	}
	if r.RunAt != nil && r.DelaySeconds != nil {
		return job.Invalid("run_at", "give run_at or delay_seconds, not both")
	}
	if r.Queue != nil && !*r.Queue {
		return job.Invalid("queue", "queue=false admits only a job that can start now; it cannot have run_at or delay_seconds")
	}
	if r.DelaySeconds != nil {
		if d := *r.DelaySeconds; d < 0 || d > MaxSchedule.Seconds() {
			return job.Invalid("delay_seconds", "delay_seconds must be from 0 to %d, got %v", int64(MaxSchedule.Seconds()), d)
		}
		return nil
	}
	at, err := time.Parse(time.RFC3339Nano, *r.RunAt)
	if err != nil {
		return job.Invalid("run_at", "run_at must be an RFC 3339 time such as 2026-12-06T15:04:05Z, got %q", *r.RunAt)
	}
	if at.After(now.Add(MaxSchedule)) {
		return job.Invalid("run_at", "run_at is more than a year ahead (%s)", *r.RunAt)
	}
	return nil
}

// validDeadline checks start_by (RFC 3339, at most MaxSchedule after now, past its run_at
// allowed: refuse_if_late refuses it, else the job expires) and refuse_if_late (only with
// start_by).
func (r *Request) validDeadline(now time.Time) error {
	if r.StartBy == nil {
		if r.refuseIfLate() {
			return job.Invalid("refuse_if_late", "refuse_if_late needs a start_by")
		}
		return nil
	}
	at, err := time.Parse(time.RFC3339Nano, *r.StartBy)
	if err != nil {
		return job.Invalid("start_by", "start_by must be an RFC 3339 time such as 2026-12-06T15:04:05Z, got %q", *r.StartBy)
	}
	if at.After(now.Add(MaxSchedule + time.Hour)) {
		return job.Invalid("start_by", "start_by is more than a year ahead (%s)", *r.StartBy)
	}
	return nil
}

// startBy returns r's start deadline at the columns' precision, or nil.
func (r *Request) startBy() *time.Time {
	if r.StartBy == nil {
		return nil
	}
	at, _ := time.Parse(time.RFC3339Nano, *r.StartBy) // validDeadline parsed it
	at = clock.Trunc(at)
	return &at
}

func (r *Request) refuseIfLate() bool { return r.RefuseIfLate != nil && *r.RefuseIfLate }

// due returns when a job of r becomes eligible, given the admission's time now: its run_at or
// now plus its delay, at the columns' precision; the zero time when that is not after now.
func (r *Request) due(now time.Time) time.Time {
	var at time.Time
	switch {
	case r.RunAt != nil:
		at, _ = time.Parse(time.RFC3339Nano, *r.RunAt) // validSchedule parsed it
	case r.DelaySeconds != nil:
		at = now.Add(time.Duration(*r.DelaySeconds * float64(time.Second)))
	default:
		return time.Time{}
	}
	if at = clock.Trunc(at.UTC()); !at.After(now) {
		return time.Time{}
	}
	return at
}

// normalLanes sorts r.Lanes and drops repeats; more than MaxLanes distinct names, or a name that
// could not be configured, is invalid.
func (r *Request) normalLanes() error {
	if len(r.Lanes) == 0 {
		r.Lanes = nil
		return nil
	}
	ls := append([]string(nil), r.Lanes...)
	sort.Strings(ls)
	out := ls[:0]
	for i, l := range ls {
		if i > 0 && l == ls[i-1] {
			continue
		}
		if l == "" || len(l) > config.MaxNameBytes || strings.ContainsRune(l, ',') || !utf8.ValidString(l) {
			return job.Invalid("lanes", "lanes: %q is not a lane name", l)
		}
		out = append(out, l)
	}
	if len(out) > MaxLanes {
		return job.Invalid("lanes", "lanes names %d lanes; at most %d", len(out), MaxLanes)
	}
	r.Lanes = out
	return nil
}

// knownLanes refuses a lane that cfg does not configure (SPEC §5a: an unknown name is a 400).
func (r *Request) knownLanes(cfg config.Config) error {
	if l, ok := cfg.Known(r.Lanes); !ok {
		return job.Invalid("lanes", "lanes: %q is not a configured lane", l)
	}
	return nil
}

// priority is the priority r asks for, job.DefaultPriority when none.
func (r *Request) priority() int {
	if r.Priority == nil {
		return job.DefaultPriority
	}
	return *r.Priority
}

// interactive reports whether r asks for an interactive job.
func (r *Request) interactive() bool { return r.Interactive != nil && *r.Interactive }

// unit is what a job of r asks of the caps.
func (r *Request) unit() config.Unit {
	return config.Unit{Tenant: r.Tenant, Lanes: r.Lanes, Interactive: r.interactive()}
}

// RateKeyHash returns the SHA-256 hex of a raw rate key: the only form sluice stores or logs.
func RateKeyHash(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	return hex.EncodeToString(sum[:])
}

// fingerprint identifies the request for idempotent replay: same fingerprint, same request.
func (r *Request) fingerprint() []byte {
	h := sha256.New()
	write := func(b []byte) {
		var n [8]byte
		l := len(b)
		for i := range n {
			n[i] = byte(l >> (8 * i))
		}
		h.Write(n[:])
		h.Write(b)
	}
	write([]byte(r.Tenant))
	if r.RateKey != nil {
		write([]byte("k" + *r.RateKey))
	} else {
		write(nil)
	}
	var compact bytes.Buffer
	if len(r.Payload) > 0 && json.Compact(&compact, r.Payload) == nil {
		write(compact.Bytes())
	} else {
		write(r.Payload)
	}
	if r.Queue != nil && !*r.Queue {
		write([]byte("q0"))
	} else {
		write([]byte("q1"))
	}
	// Written only when not the default, so that a job keyed before lanes existed still
	// replays.
	if len(r.Lanes) > 0 {
		write([]byte("l" + strings.Join(r.Lanes, ",")))
	}
	if r.interactive() {
		write([]byte("i1"))
	}
	if r.RunAt != nil {
		write([]byte("r" + *r.RunAt))
	}
	if r.DelaySeconds != nil {
		write([]byte("d" + strconv.FormatFloat(*r.DelaySeconds, 'g', -1, 64)))
	}
	if r.StartBy != nil {
		write([]byte("s" + *r.StartBy))
	}
	if r.refuseIfLate() {
		write([]byte("L1"))
	}
	if p := r.priority(); p != job.DefaultPriority {
		write([]byte("p" + strconv.Itoa(p)))
	}
	if r.ReplaceKey != nil {
		write([]byte("R" + *r.ReplaceKey))
	}
	return h.Sum(nil)
}

// DecodeRequest decodes one admission request body. Unknown fields are ignored; malformed
// JSON, a wrong type or invalid UTF-8 is an invalid_request error naming the offending field
// ("body" when it is not one field's fault). It does not Validate.
func DecodeRequest(data []byte) (Request, error) {
	var req Request
	if !utf8.Valid(data) {
		return req, invalidUTF8Field(data)
	}
	if err := json.Unmarshal(data, &req); err != nil {
		return Request{}, DecodeError(err)
	}
	return req, nil
}

// invalidUTF8Field names the top-level field whose value holds invalid UTF-8: encoding/json
// would silently replace such bytes, so the check runs on the raw values.
func invalidUTF8Field(data []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err == nil {
		for k, v := range raw {
			if !utf8.Valid(v) && k != "" && utf8.ValidString(k) {
				return job.Invalid(k, "%s is not valid UTF-8", k)
			}
		}
	}
	return job.Invalid("body", "the request body is not valid UTF-8")
}

// DecodeError turns an encoding/json error into invalid_request naming the field.
func DecodeError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		field := te.Field
		if field == "" {
			field = "body"
		}
		want := "value of another type"
		switch te.Type.Kind() {
		case reflect.String:
			want = "string"
		case reflect.Bool:
			want = "boolean"
		case reflect.Int, reflect.Int64, reflect.Float64, reflect.Uint, reflect.Uint64:
			want = "number"
		case reflect.Struct, reflect.Map:
			want = "object"
		case reflect.Slice, reflect.Array:
			want = "array"
		}
		return job.Invalid(field, "%s must be a JSON %s, got %s", field, want, te.Value)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return job.Invalid("body", "malformed JSON at byte %d: %v", se.Offset, se)
	}
	return job.Invalid("body", "malformed JSON: %v", err)
}
