package main

import (
	"fmt"
	"net/netip"
	"strconv"

	"github.com/sluicehq/sluice/cmd/sluice/app"
)

// boundsOptions sets the listener and memory bounds of opts from the settings given (issue 30);
// one left unset leaves app's default, which the settings table shows (and which, for the
// reserve, shrinks with a smaller connection bound). A setting's 0 means no bound, or no
// reserve: app.Options says that with a negative value, its zero being the default.
func (c *config) boundsOptions(opts *app.Options) error {
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
