package main

import (
	"os"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/gate/api"
)

// TestMemoryBudgetFitsTheUnits: the default memory budget of API requests is at most a quarter
// of the MemoryMax of every unit that runs the API, so that the heap the garbage collector lets
// grow to twice what is live still leaves the rest of the process half of it (issue 30); and the
// settings table shows that default.
func TestMemoryBudgetFitsTheUnits(t *testing.T) {
	for _, unit := range []string{"sluice.service", "sluice-api.service"} {
		raw, err := os.ReadFile("../../deploy/systemd/" + unit)
		if err != nil {
			t.Fatal(err)
		}
		var max int64
		for _, line := range strings.Split(string(raw), "\n") {
			if v, ok := strings.CutPrefix(line, "MemoryMax="); ok {
				if max, err = parseBytes(v); err != nil {
					t.Fatalf("%s: MemoryMax=%s: %v", unit, v, err)
				}
			}
		}
		if max == 0 {
			t.Fatalf("%s has no MemoryMax", unit)
		}
		if api.DefaultMemoryBudget > max/4 {
			t.Errorf("%s: MemoryMax %d, default memory budget %d: want at most a quarter", unit, max, api.DefaultMemoryBudget)
		}
	}
	found := false
	for _, s := range settings {
		if s.flag != "memory-budget" {
			continue
		}
		found = true
		if n, err := parseBytes(s.def); err != nil || n != api.DefaultMemoryBudget {
			t.Errorf("the settings table's default %q is not api.DefaultMemoryBudget (%d)", s.def, api.DefaultMemoryBudget)
		}
	}
	if !found {
		t.Error("the settings table has no memory-budget setting")
	}
}
