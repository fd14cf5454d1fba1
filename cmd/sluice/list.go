package main

import "strings"

// splitList splits a comma-separated setting (SLUICE_MEMCACHED) into its non-empty items.
// The gates branch defines the same helper in cmd/sluice/gate.go: when both are merged, keep
// that one and delete this file.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
