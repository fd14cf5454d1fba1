package harness

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"
)

// Emit prints one benchmark figure as a JSON line on stdout: {"bench": name, ...fields}. The
// repository's benchmark command (make bench) collects these lines. Report a raw limit measured
// in the same run beside every figure, and the ratio, because the machines are shared and noisy.
func Emit(name string, fields map[string]any) {
	// "bench" comes first whatever the other keys are, so `grep '^{"bench"'` finds every line.
	keys := make([]string, 0, len(fields))
	for k := range fields {
		if k != "bench" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b strings.Builder
	head, _ := json.Marshal(name)
	b.WriteString(`{"bench":`)
	b.Write(head)
	for _, k := range keys {
		kj, _ := json.Marshal(k)
		vj, err := json.Marshal(fields[k])
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench %s: field %s: %v\n", name, k, err)
			return
		}
		b.WriteByte(',')
		b.Write(kj)
		b.WriteByte(':')
		b.Write(vj)
	}
	b.WriteByte('}')
	fmt.Println(b.String())
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
