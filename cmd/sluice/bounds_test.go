package main

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/sluicehq/sluice/cmd/sluice/app"
)

// TestBoundsOptions: settings left unset leave app's defaults (zero, nil); a setting's 0 is no
// bound (app's negative); executor sources take prefixes and single addresses, and "none" is an
// empty list, not the default; a bad value names its setting.
func TestBoundsOptions(t *testing.T) {
	cfg := func(set map[string]string) *settingValues {
		c := &settingValues{values: map[string]string{}, set: map[string]bool{}}
		for k, v := range set {
			c.values[k], c.set[k] = v, true
		}
		return c
	}
	var opts app.Options
	if err := cfg(nil).boundsOptions(&opts); err != nil {
		t.Fatal(err)
	}
	if opts.MaxConns != 0 || opts.MaxConnsPerSource != 0 || opts.ReservedConns != 0 || opts.ExecutorSources != nil {
		t.Errorf("unset settings gave %+v, want app's defaults", opts)
	}
	opts = app.Options{}
	if err := cfg(map[string]string{"max-conns": "100", "max-conns-per-source": "0", "reserved-conns": "10",
		"executor-sources": "10.0.0.0/8, 192.0.2.7,2001:db8::/48"}).boundsOptions(&opts); err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32"), netip.MustParsePrefix("2001:db8::/48")}
	if opts.MaxConns != 100 || opts.MaxConnsPerSource != -1 || opts.ReservedConns != 10 || !slices.Equal(opts.ExecutorSources, want) {
		t.Errorf("got %+v", opts)
	}
	opts = app.Options{}
	if err := cfg(map[string]string{"executor-sources": "none"}).boundsOptions(&opts); err != nil || opts.ExecutorSources == nil || len(opts.ExecutorSources) != 0 {
		t.Errorf("none: %v, %v; want an empty list", opts.ExecutorSources, err)
	}
	for v, want := range map[string]int64{"256MiB": 256 << 20, "64M": 64 << 20, "1G": 1 << 30, "1048576": 1 << 20, "0": -1} {
		opts = app.Options{}
		if err := cfg(map[string]string{"memory-budget": v}).boundsOptions(&opts); err != nil || opts.MemoryBudget != want {
			t.Errorf("memory-budget %s: %d, %v; want %d", v, opts.MemoryBudget, err, want)
		}
	}
	for _, bad := range []map[string]string{{"max-conns": "-1"}, {"reserved-conns": "many"}, {"executor-sources": "localhost"},
		{"memory-budget": "lots"}, {"memory-budget": "-1M"}, {"memory-budget": "9999999999G"}} {
		if err := cfg(bad).boundsOptions(&app.Options{}); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
