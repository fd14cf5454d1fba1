package store_test

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/gate/store"
)

// LockColumns must stay Columns with NULL for the result and the payload: ScanRow reads both
// lists by position.
func TestLockColumnsFollowColumns(t *testing.T) {
	split := func(s string) []string {
		var out []string
		for _, c := range strings.Split(s, ",") {
			out = append(out, strings.TrimSpace(c))
		}
		return out
	}
	cols, lock := split(store.Columns), split(store.LockColumns)
	if len(cols) != len(lock) {
		t.Fatalf("Columns has %d columns, LockColumns %d", len(cols), len(lock))
	}
	for i, c := range cols {
		want := c
		if c == "result" || c == "payload" {
			want = "NULL"
		}
		if lock[i] != want {
			t.Errorf("LockColumns[%d] = %q, want %q", i, lock[i], want)
		}
	}
}
