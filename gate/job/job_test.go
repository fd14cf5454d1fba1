package job

import (
	"errors"
	"fmt"
	"testing"
)

func TestStatusClasses(t *testing.T) {
	for _, s := range []Status{Queued, Claimed, Dispatched, Running, Succeeded, Failed, Canceled, Rejected, Lost, Expired} {
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
