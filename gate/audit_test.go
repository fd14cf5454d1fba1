package gate

import (
	"encoding/json"
	"testing"
)

// TestAdmittedDetail: a plain admission's detail, built without a map, is the bytes
// json.Marshal gives the map the other decisions use.
func TestAdmittedDetail(t *testing.T) {
	for _, c := range [][3]int{{0, 0, 1}, {500, 12, 1234567}, {-1, 3, 2}} {
		want, _ := json.Marshal(map[string]any{"cap": c[0], "in_flight": c[1], "position": int64(c[2])})
		if got := admittedDetail(c[0], c[1], int64(c[2])); string(got) != string(want) {
			t.Errorf("admittedDetail%v = %s, want %s", c, got, want)
		}
	}
}
