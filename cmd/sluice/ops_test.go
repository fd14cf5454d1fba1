package main

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/gate/status"
)

func TestSplitArgs(t *testing.T) {
	for _, tc := range []struct {
		in          []string
		flags, args []string
	}{
		{[]string{"a=1", "--note", "x=y z", "b=2"}, []string{"--note", "x=y z"}, []string{"a=1", "b=2"}},
		{[]string{"--json", "a=1"}, []string{"--json"}, []string{"a=1"}},
		{[]string{"--note=n", "a=1", "--", "--weird=1"}, []string{"--note=n"}, []string{"a=1", "--weird=1"}},
	} {
		f, a := splitArgs(tc.in, "json")
		if !slices.Equal(f, tc.flags) || !slices.Equal(a, tc.args) {
			t.Errorf("splitArgs(%q) = %q, %q; want %q, %q", tc.in, f, a, tc.flags, tc.args)
		}
	}
}

func TestParseValue(t *testing.T) {
	for in, want := range map[string]string{"8": "8", "fifo": `"fifo"`, `{"acme":3}`: `{"acme":3}`, "true": "true", `"quoted"`: `"quoted"`} {
		raw, err := json.Marshal(parseValue(in))
		if err != nil || string(raw) != want {
			t.Errorf("parseValue(%q) encodes as %s (%v), want %s", in, raw, err, want)
		}
	}
}

func TestPrintStatus(t *testing.T) {
	var b bytes.Buffer
	printStatus(&b, status.Status{
		Queue:    status.Queue{Depth: 7, OldestAgeSeconds: 75},
		Tenants:  []status.Tenant{{Tenant: "big one", Depth: 5, Cap: 2}, {Tenant: "small", Depth: 2, InFlight: 1, Cap: 2}},
		Drainers: []status.Drainer{{ID: "d1", State: status.Stalled, Reason: "no heartbeat for 9.0 s", HeartbeatAgeSeconds: 9}},
		Broker:   status.Broker{Connected: true},
		Config:   status.ConfigRef{Version: 3, Stale: true},
	})
	out := b.String()
	for _, want := range []string{"7 queued, oldest 75s", "broker     connected", "memcached  UNREACHABLE", "version 3 (stale",
		`"big one"`, "stalled (no heartbeat for 9.0 s)"} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}
	if strings.Index(out, `"big one"`) > strings.Index(out, "small") {
		t.Errorf("tenants not in the API's order (deepest first):\n%s", out)
	}
}

func TestPrintTenants(t *testing.T) {
	var b bytes.Buffer
	printTenants(&b, client.TenantPage{Tenants: []status.TenantRow{{Tenant: "big one", Depth: 5, OldestAgeSeconds: 2.5, Cap: 2, Tier: "default", Weight: 2.5}},
		NextCursor: "ZGVwdGg6NTpiaWcgb25l"}, "depth")
	out := b.String()
	for _, want := range []string{`"big one"`, "2.5s", "default", "WEIGHT", " 2.5\n", "more: sluice tenants --order depth --cursor ZGVwdGg6NTpiaWcgb25l"} {
		if !strings.Contains(out, want) {
			t.Errorf("tenants output lacks %q:\n%s", want, out)
		}
	}
}
