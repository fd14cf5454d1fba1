package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/integration/testdb"
)

func writeArrivals(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "arrivals.jsonl")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// sluice simulate over a file against the defaults: a table by default, JSON with --json, and
// each piece of bad input refused with an error naming it.
func TestSimulateCommand(t *testing.T) {
	arrivals := writeArrivals(t, `{"at": 0, "tenant": "burst", "service_ms": 100}
{"at": 0, "tenant": "burst", "service_ms": 100}
{"at": 0, "tenant": "burst", "service_ms": 100}
{"at": 0.01, "tenant": "steady", "service_ms": 20}
`)
	var out, errOut bytes.Buffer
	if code := run([]string{"simulate", "--arrivals", arrivals, "--current", "defaults", "--set", "global_in_flight=1"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{"replayed 4 job arrivals", "changes: global_in_flight=1", "burst", "steady", "lose: steady"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if code := run([]string{"simulate", "--arrivals", arrivals, "--current", "defaults", "--set", "global_in_flight=1", "--json"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var got struct {
		Current, Changed struct {
			Total struct{ Started int }
		}
		Shifts []struct{ Tenant string }
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || got.Current.Total.Started != 4 || got.Changed.Total.Started != 4 || len(got.Shifts) == 0 {
		t.Fatalf("--json: %v %+v\n%s", err, got, out.String())
	}
	// --top bounds the JSON as the table: the busiest tenant, the totals of all, and how many.
	out.Reset()
	if code := run([]string{"simulate", "--arrivals", arrivals, "--current", "defaults", "--set", "global_in_flight=1", "--json", "--top", "1"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var top struct {
		Current struct {
			Tenants map[string]any
			Total   struct{ Started int }
		}
		TenantsTotal int `json:"tenants_total"`
	}
	if err := json.Unmarshal(out.Bytes(), &top); err != nil || len(top.Current.Tenants) != 1 || top.Current.Tenants["burst"] == nil ||
		top.Current.Total.Started != 4 || top.TenantsTotal != 2 {
		t.Fatalf("--json --top 1: %v %+v, want burst alone, the totals of 4 and tenants_total 2", err, top)
	}

	empty := writeArrivals(t, "\n")
	bad := writeArrivals(t, `{"at": 0, "tenant": "a", "priority": 12}`)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"simulate"}, "want --since <time> (the audit trail) or --arrivals FILE"},
		{[]string{"simulate", "--arrivals", arrivals, "--current", "defaults", "--set", "tenant_capz=3"}, "tenant_capz: unknown key"},
		{[]string{"simulate", "--arrivals", arrivals, "--current", "defaults", "--set", "nokey"}, `want key=value, got "nokey"`},
		{[]string{"simulate", "--arrivals", bad, "--current", "defaults"}, "arrivals line 1: priority: want 0 to 9, got 12"},
		{[]string{"simulate", "--arrivals", empty, "--current", "defaults"}, "holds no arrivals"},
		{[]string{"simulate", "--arrivals", filepath.Join(t.TempDir(), "none"), "--current", "defaults"}, "no such file"},
		{[]string{"simulate", "--arrivals", arrivals, "--current", "yesterday"}, "--current: want db or defaults"},
		{[]string{"simulate", "--since", "1h", "--current", "defaults"}, "--current=defaults is for --arrivals"},
		{[]string{"simulate", "--arrivals", arrivals, "--current", "defaults", "extra"}, `unexpected argument "extra"`},
	} {
		var out, errOut bytes.Buffer
		if code := run(tc.args, &out, &errOut); code == 0 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want an error with %q", tc.args, code, errOut.String(), tc.want)
		}
	}
}

// Against a database: a window with nothing in its audit trail, and a window that ends before
// it starts, are refused with errors that say so.
func TestSimulateCommandEmptyWindow(t *testing.T) {
	dsn := testdb.New(t).DSN
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"simulate", "--mysql-dsn", dsn, "--since", "1h"}, "the audit trail holds no arrivals in that window"},
		{[]string{"simulate", "--mysql-dsn", dsn, "--since", "1h", "--until", "2h"}, "is empty"},
		{[]string{"simulate", "--mysql-dsn", dsn, "--since", "soon"}, "--since: want an RFC 3339 time or a duration ago"},
		{[]string{"simulate", "--mysql-dsn", dsn, "--since", "1h", "--set", "ordering=random"}, "ordering"},
	} {
		var out, errOut bytes.Buffer
		if code := run(tc.args, &out, &errOut); code == 0 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want an error with %q", tc.args[3:], code, errOut.String(), tc.want)
		}
	}
}
