package job

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"
)

func TestStatusClasses(t *testing.T) {
	for _, s := range []Status{Queued, Claimed, Dispatched, Running, Succeeded, Failed, Canceled, Rejected, Lost, Expired, Replaced} {
		if s.InFlight() && s.Terminal() {
			t.Errorf("%s is both in flight and terminal", s)
		}
		if (s == Queued) != (!s.InFlight() && !s.Terminal()) {
			t.Errorf("%s: only queued is neither in flight nor terminal", s)
		}
	}
}

func TestErrorCode(t *testing.T) {
	err := fmt.Errorf("wrapped: %w", Invalid("tenant", "bad"))
	if ErrorCode(err) != CodeInvalidRequest {
		t.Errorf("code %q", ErrorCode(err))
	}
	var je *Error
	if !errors.As(err, &je) || je.Detail["field"] != "tenant" {
		t.Errorf("field not carried: %+v", je)
	}
	if ErrorCode(errors.New("plain")) != CodeInternal {
		t.Error("a plain error must be internal")
	}
}

func TestJobTimestampsKeepMicroseconds(t *testing.T) {
	whole := time.Date(2026, 11, 29, 21, 26, 55, 0, time.UTC)
	tenths := time.Date(2026, 11, 29, 21, 26, 55, 59550000, time.FixedZone("CET", 3600))
	j := Job{ID: 7, Tenant: "acme", Status: Succeeded, QueuedAt: whole, ClaimedAt: &tenths, FinishedAt: &whole}
	raw, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"queued_at": "2026-11-29T21:26:55.000000Z", "claimed_at": "2026-11-29T20:26:55.059550Z",
		"dispatched_at": nil, "started_at": nil, "finished_at": "2026-11-29T21:26:55.000000Z", "id": float64(7), "status": "succeeded"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (%s)", k, got[k], v, raw)
		}
	}
	var back Job
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if !back.QueuedAt.Equal(whole) || !back.ClaimedAt.Equal(tenths) || back.Tenant != "acme" {
		t.Errorf("round trip: %+v", back)
	}
}

// reflectJSON is how Job was encoded before AppendJSON: json.Marshal of the job with its
// timestamps in TimeFormat. AppendJSON must write the same bytes.
func reflectJSON(j Job) ([]byte, error) {
	type plain Job // without the methods
	opt := func(t *time.Time) *string {
		if t == nil {
			return nil
		}
		s := t.UTC().Format(TimeFormat)
		return &s
	}
	lanes := j.Lanes
	if lanes == nil {
		lanes = []string{}
	}
	return json.Marshal(struct {
		plain
		QueuedAt       string   `json:"queued_at"`
		ClaimedAt      *string  `json:"claimed_at"`
		DispatchedAt   *string  `json:"dispatched_at"`
		StartedAt      *string  `json:"started_at"`
		FinishedAt     *string  `json:"finished_at"`
		Lanes          []string `json:"lanes"`
		NotBefore      *string  `json:"not_before,omitempty"`
		StartBy        *string  `json:"start_by,omitempty"`
		WaitingUntil   *string  `json:"waiting_until,omitempty"`
		EstimatedStart *string  `json:"estimated_start,omitempty"`
	}{plain(j), j.QueuedAt.UTC().Format(TimeFormat), opt(j.ClaimedAt), opt(j.DispatchedAt), opt(j.StartedAt), opt(j.FinishedAt), lanes,
		opt(j.NotBefore), opt(j.StartBy), opt(j.WaitingUntil), opt(j.EstimatedStart)})
}

// fullJob is a job with every field set, its strings s.
func fullJob(s string, result json.RawMessage) Job {
	at := time.Date(2026, 12, 7, 23, 30, 1, 123456789, time.FixedZone("X", -7200))
	n := int64(-42)
	return Job{ID: 1 << 62, Tenant: s, RateKeySHA256: &s, Status: Status(s), Version: 9, Attempt: 3, Position: &n,
		QueuedAt: at, ClaimedAt: &at, DispatchedAt: &at, StartedAt: &at, FinishedAt: &at, ErrorCode: &s, ErrorMessage: &s,
		Result: result, RetryOf: &n, Lanes: []string{s, "gpu"}, Interactive: true, Priority: 9, NotBefore: &at, StartBy: &at,
		ReplaceKey: &s, ReplacedBy: &n, WaitingOn: s, WaitingUntil: &at, EstimatedStart: &at}
}

func TestJobJSONMatchesReflection(t *testing.T) {
	// Every field set: a field added to Job and not to AppendJSON shows as a difference below.
	full := reflect.ValueOf(fullJob("acme", json.RawMessage(`1`)))
	for i := range full.NumField() {
		if full.Field(i).IsZero() {
			t.Fatalf("fullJob leaves Job.%s unset", full.Type().Field(i).Name)
		}
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for name, j := range map[string]Job{
		"zero":        {},
		"queued":      {ID: 7, Tenant: "acme", Status: Queued, QueuedAt: at},
		"full":        fullJob("acme", json.RawMessage(`{"ok": true, "n": [1, 2]}`)),
		"escaped":     fullJob("<a href=\"x\">&\\\n\t\x01\x7f é \u2028 \xff", json.RawMessage(` "<&>\u2029" `)),
		"empty lanes": {ID: 1, Lanes: []string{}, Result: json.RawMessage(`null`)},
	} {
		want, err := reflectJSON(j)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := j.MarshalJSON()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if string(got) != string(want) {
			t.Errorf("%s:\n got %s\nwant %s", name, got, want)
		}
	}
	if _, err := (Job{Result: json.RawMessage(`{"open":`)}).MarshalJSON(); err == nil {
		t.Error("an invalid result must fail the encoding, as json.Marshal fails it")
	}
}

// FuzzJobJSON holds AppendJSON to json.Marshal's bytes for any strings and result.
func FuzzJobJSON(f *testing.F) {
	f.Add("acme", []byte(`{"a":1}`))
	f.Add("<script>&amp;\"\\", []byte(` [ "\u2028" , 1e3 ] `))
	f.Add("\xff\xfe\x00\x1f\u2029", []byte(`"x"`))
	f.Fuzz(func(t *testing.T, s string, result []byte) {
		if !json.Valid(result) {
			result = nil // an invalid result fails both encodings (TestJobJSONMatchesReflection)
		}
		j := fullJob(s, result)
		want, err := reflectJSON(j)
		if err != nil {
			t.Fatal(err)
		}
		got, err := j.AppendJSON(nil)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("\n got %s\nwant %s", got, want)
		}
	})
}

func TestBatchItemJSONMatchesReflection(t *testing.T) {
	j := fullJob("acme <&>", json.RawMessage(`[1]`))
	for name, it := range map[string]BatchItem{
		"zero":     {},
		"admitted": {Status: 202, Decision: "admitted", Job: &j},
		"replayed": {Status: 200, Decision: "admitted", Replayed: true, Job: &j},
		"refused": {Status: 429, Decision: "refused", Error: map[string]any{"error_code": CodeQueueFull,
			"message": "tenant <acme> is full", "detail": map[string]any{"scope": "tenant", "cap": 500}}},
		"empty error": {Status: 400, Error: map[string]any{}},
	} {
		want, err := json.Marshal(it)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := it.AppendJSON(nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if string(got) != string(want) {
			t.Errorf("%s:\n got %s\nwant %s", name, got, want)
		}
	}
	bad := BatchItem{Job: &Job{Result: json.RawMessage(`{`)}}
	if _, err := bad.AppendJSON(nil); err == nil {
		t.Error("an invalid result must fail the item, as json.Marshal fails it")
	}
	if _, err := (BatchItem{Error: map[string]any{"x": func() {}}}).AppendJSON(nil); err == nil {
		t.Error("an error body json.Marshal refuses must fail the item")
	}
}
