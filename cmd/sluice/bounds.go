package main

import (
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/cmd/sluice/app"
)

// boundsOptions sets the listener and memory bounds of opts from the settings given; one left
// unset leaves app's default, which the settings table shows (and which, for the
// reserve, shrinks with a smaller connection bound). A setting's 0 means no bound, or no
// reserve: app.Options says that with a negative value, its zero being the default.
func (c *settingValues) boundsOptions(opts *app.Options) error {
	for _, b := range []struct {
		name string
		dst  *int
	}{
		{"max-conns", &opts.MaxConns},
		{"max-conns-per-source", &opts.MaxConnsPerSource},
		{"reserved-conns", &opts.ReservedConns},
	} {
		if !c.set[b.name] {
			continue
		}
		n, err := strconv.Atoi(c.get(b.name))
		if err != nil || n < 0 {
			return fmt.Errorf("%s: want a whole number, 0 or more, got %q", b.name, c.get(b.name))
		}
		if n == 0 {
			n = -1
		}
		*b.dst = n
	}
	if c.set["memory-budget"] {
		n, err := parseBytes(c.get("memory-budget"))
		if err != nil {
			return fmt.Errorf("memory-budget: %w", err)
		}
		if n == 0 {
			n = -1
		}
		opts.MemoryBudget = n
	}
	if c.set["executor-sources"] {
		sources, err := parseSources(c.get("executor-sources"))
		if err != nil {
			return err
		}
		opts.ExecutorSources = sources
	}
	return nil
}

// parseSources reads SLUICE_EXECUTOR_SOURCES: CIDR prefixes or single addresses, comma-separated,
// or "none" (an empty, non-nil list: no source is exempt).
func parseSources(v string) ([]netip.Prefix, error) {
	out := []netip.Prefix{}
	if v == "none" {
		return out, nil
	}
	for _, s := range splitList(v) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("executor-sources: %q is neither an address nor a CIDR prefix", s)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// parseBytes reads a size: a whole number of bytes, or of KiB, MiB or GiB (K, M, G, as systemd's
// MemoryMax, mean the same).
func parseBytes(v string) (int64, error) {
	num, unit := v, int64(1)
	for _, u := range []struct {
		suffixes []string
		size     int64
	}{{[]string{"KiB", "K"}, 1 << 10}, {[]string{"MiB", "M"}, 1 << 20}, {[]string{"GiB", "G"}, 1 << 30}} {
		for _, suf := range u.suffixes {
			if n, ok := strings.CutSuffix(v, suf); ok {
				num, unit = n, u.size
			}
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/unit {
		return 0, fmt.Errorf("want a size in bytes, KiB, MiB or GiB, 0 or more, got %q", v)
	}
	return n * unit, nil
}
