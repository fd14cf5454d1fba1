package main

import (
	"io"
	"log/slog"
	"runtime"
	"testing"
)

func TestOneProcForDrainer(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(before)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	runtime.GOMAXPROCS(2)
	oneProcForDrainer(log, "2") // GOMAXPROCS set in the environment: the operator's choice stands
	if got := runtime.GOMAXPROCS(0); got != 2 {
		t.Fatalf("GOMAXPROCS set in the environment: got %d Ps, want 2", got)
	}
	oneProcForDrainer(log, "")
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Fatalf("GOMAXPROCS unset: got %d Ps, want 1", got)
	}
}
