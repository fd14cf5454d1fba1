package main

import (
	"testing"
	"time"
)

func TestReplaySelection(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	if _, err := replaySelection("", 0, now); err == nil {
		t.Error("a replay without --since or --from-id was accepted")
	}
	sel, err := replaySelection("2h", 0, now)
	if err != nil || sel.Since == nil || !sel.Since.Equal(now.Add(-2*time.Hour)) {
		t.Errorf("--since 2h = %+v, %v", sel, err)
	}
	sel, err = replaySelection("2030-01-01T00:00:00Z", 17, now)
	if err != nil || sel.FromID != 17 || !sel.Since.Equal(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("--since RFC 3339 --from-id 17 = %+v, %v", sel, err)
	}
	if _, err := replaySelection("yesterday", 0, now); err == nil {
		t.Error("--since yesterday was accepted")
	}
}
