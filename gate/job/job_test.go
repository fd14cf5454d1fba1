package job

import (
	"encoding/json"
	"errors"
	"fmt"
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
