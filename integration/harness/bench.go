package harness

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"time"
)

// Emit prints one benchmark figure as a JSON line on stdout: {"bench": name, ...fields}. The
// repository's benchmark command (make bench) collects these lines. Report a raw limit measured
// in the same run beside every figure, and the ratio, because the machines are shared and noisy.
func Emit(name string, fields map[string]any) {
	out := map[string]any{"bench": name}
	for k, v := range fields {
		out[k] = v
	}
	line, err := json.Marshal(out)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench %s: %v\n", name, err)
		return
	}
	fmt.Println(string(line))
}

// Percentiles returns the p-th percentiles (0-100) of ds in milliseconds, rounded to µs.
func Percentiles(ds []time.Duration, ps ...float64) []float64 {
	if len(ds) == 0 {
		return make([]float64, len(ps))
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	out := make([]float64, len(ps))
	for i, p := range ps {
		idx := int(p / 100 * float64(len(s)-1))
		out[i] = float64(s[idx].Microseconds()) / 1000
	}
	return out
}
