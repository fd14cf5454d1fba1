package admitrate

import (
	"testing"
	"time"
)

// Local grants as Reserve does: up to the limit in a wall-clock minute, refunds giving room
// back, a new minute starting from nothing.
func TestLocal(t *testing.T) {
	at := time.Date(2026, 12, 6, 10, 0, 45, 0, time.UTC)
	var l Local
	if g, _ := l.Reserve("a", 2, 3, at); g != 2 {
		t.Fatalf("granted %d of 2 under a limit of 3", g)
	}
	if g, retry := l.Reserve("a", 2, 3, at); g != 1 || retry != 15 {
		t.Fatalf("granted %d (retry %d s), want 1 and the 15 s left in the minute", g, retry)
	}
	if g, _ := l.Reserve("b", 3, 3, at); g != 3 {
		t.Fatalf("another tenant granted %d of 3", g)
	}
	l.Refund("a", 1)
	if g, _ := l.Reserve("a", 1, 3, at); g != 1 {
		t.Fatalf("after a refund granted %d, want 1", g)
	}
	if g, _ := l.Reserve("a", 3, 3, at.Add(15*time.Second)); g != 3 {
		t.Fatalf("the next minute granted %d, want 3", g)
	}
}
