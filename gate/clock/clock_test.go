package clock

import (
	"context"
	"testing"
	"time"
)

func TestFake(t *testing.T) {
	start := time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.FixedZone("x", 3600))
	f := NewFake(start)
	now, _ := f.Now(context.Background())
	if now.Location() != time.UTC || now.Nanosecond()%1000 != 0 || !now.Equal(start.Truncate(time.Microsecond)) {
		t.Errorf("NewFake: %v, want %v in UTC truncated to µs", now, start)
	}
	f.Advance(1500 * time.Nanosecond)
	later, _ := f.Now(context.Background())
	if d := later.Sub(now); d != time.Microsecond {
		t.Errorf("Advance(1.5µs) moved %v, want 1µs (truncated)", d)
	}
}
