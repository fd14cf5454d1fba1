package harness

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Counter returns the sum of counter name's series in g whose labels include every name/value
// pair of labels (no pairs: every series). A counter vector with no series yet is not gathered at
// all, so an absent name reads as 0.
func Counter(tb testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	tb.Helper()
	if len(labels)%2 != 0 {
		tb.Fatalf("Counter(%s): labels must be name/value pairs, got %q", name, labels)
	}
	mfs, err := g.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue series
				}
			}
			total += m.GetCounter().GetValue()
		}
	}
	return total
}
