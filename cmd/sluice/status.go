package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/gate/status"
)

// subcommand splits the arguments of `sluice NAME SUB [ARG] [flags]` (args without NAME, at
// least one): the subcommand, the one argument that may come before the flags (`sluice jobs show
// 42 --token ...`: flag parsing would stop at it), the flags, and a flag set for them that
// reports to stderr.
func subcommand(name string, args []string, stderr io.Writer) (sub string, positional, flags []string, fs *flag.FlagSet) {
	sub, flags = args[0], args[1:]
	if len(flags) > 0 && !strings.HasPrefix(flags[0], "-") {
		positional, flags = flags[:1], flags[1:]
	}
	fs = flag.NewFlagSet("sluice "+name+" "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return sub, positional, flags, fs
}

// tokenFlag registers --token, the API bearer token every API command sends (default
// SLUICE_TOKEN); the API itself is the api-url setting (SLUICE_API_URL).
// oneID is the one positional id a subcommand such as `jobs show ID` takes: what names the thing
// in errors ("job", "slot"), cmd the command ("jobs show").
func oneID(cmd, what string, positional []string) (int64, error) {
	if len(positional) != 1 {
		return 0, fmt.Errorf("%s: want one %s id", cmd, what)
	}
	id, err := strconv.ParseInt(positional[0], 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("%s: %q is not a %s id", cmd, positional[0], what)
	}
	return id, nil
}

// moreHint is the command that lists the next page: cmd with the filters given (name, value;
// empty values left out), which go with the cursor, and the cursor; "" without one.
func moreHint(cmd string, filters [][2]string, cursor string) string {
	if cursor == "" {
		return ""
	}
	more := "more: " + cmd
	for _, f := range filters {
		if f[1] != "" {
			more += " --" + f[0] + " " + f[1]
		}
	}
	return more + " --cursor " + cursor
}

func tokenFlag(fs *flag.FlagSet) *string {
	return fs.String("token", os.Getenv("SLUICE_TOKEN"), "API bearer token (SLUICE_TOKEN)")
}

// splitArgs moves flags (and their values) ahead of positional arguments, so that
// `sluice config set a=1 --note x` parses like `sluice config set --note x a=1`. boolFlags
// take no value.
func splitArgs(args []string, boolFlags ...string) (flags, positional []string) {
	isBool := map[string]bool{}
	for _, b := range boolFlags {
		isBool[b] = true
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			positional = append(positional, args[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			positional = append(positional, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if !strings.Contains(name, "=") && !isBool[name] && i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	return flags, positional
}

func statusCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sluice status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print the status as JSON")
	token := tokenFlag(fs)
	c, err := parseSettings(fs, args)
	if err != nil {
		return err
	}
	cl := client.New(c.get("api-url"), *token)
	st, err := cl.Status(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	printStatus(stdout, st)
	return nil
}

// printStatus renders the status as an operator reads it: the summary first, then tenants
// deepest first (the order the API returns), gates and drainers.
func printStatus(w io.Writer, st status.Status) {
	yes := func(b bool, y, n string) string {
		if b {
			return y
		}
		return n
	}
	stale := ""
	if st.Config.Stale {
		stale = " (stale: re-read failing)"
	}
	fmt.Fprintf(w, "queue      %d queued, oldest %s, %d in flight, %d tenants with work\n", st.Queue.Depth, secs(st.Queue.OldestAgeSeconds), st.InFlight, st.TenantsWithWork)
	if st.Slots.Total > 0 {
		fmt.Fprintf(w, "slots      %d live, by tier %v, by lane %v\n", st.Slots.Total, st.Slots.ByTier, st.Slots.ByLane)
	}
	fmt.Fprintf(w, "outbox     %d unpublished, oldest %s\n", st.Outbox.Unpublished, secs(st.Outbox.OldestUnpublishedAgeSeconds))
	fmt.Fprintf(w, "broker     %s\n", yes(st.Broker.Connected, "connected", "DISCONNECTED"))
	fmt.Fprintf(w, "memcached  %s\n", yes(st.Memcached.Reachable, "reachable", "UNREACHABLE (gates fail open)"))
	fmt.Fprintf(w, "config     version %d%s\n", st.Config.Version, stale)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nTENANT\tDEPTH\tOLDEST\tIN FLIGHT\tCAP")
	for _, t := range st.Tenants {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\n", printable(t.Tenant), t.Depth, secs(t.OldestAgeSeconds), t.InFlight, t.Cap)
	}
	if len(st.Tenants) == 0 {
		fmt.Fprintln(tw, "(none)\t\t\t\t")
	} else if st.TenantsWithWork > len(st.Tenants) {
		fmt.Fprintf(tw, "(the %d deepest of %d; all at GET /v1/tenants)\t\t\t\t\n", len(st.Tenants), st.TenantsWithWork)
	}
	fmt.Fprintln(tw, "\nGATED RATE KEY\tNOT BEFORE\tQUEUED\t\t")
	for _, g := range st.Gates {
		fmt.Fprintf(tw, "%s\t%s\t%d\t\t\n", g.RateKeySHA256[:min(16, len(g.RateKeySHA256))]+"…", g.NotBefore.Format("2006-01-02T15:04:05Z"), g.Queued)
	}
	if len(st.Gates) == 0 {
		fmt.Fprintln(tw, "(none)\t\t\t\t")
	}
	fmt.Fprintln(tw, "\nDRAINER\tSTATE\tHEARTBEAT\tIN FLIGHT\tHOST")
	for _, d := range st.Drainers {
		state := d.State
		if d.Reason != "" {
			state += " (" + d.Reason + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s ago\t%d\t%s\n", d.ID, state, secs(d.HeartbeatAgeSeconds), d.InFlight, d.Host)
	}
	if len(st.Drainers) == 0 {
		fmt.Fprintln(tw, "(none running)\t\t\t\t")
	}
	tw.Flush()
}

func secs(s float64) string {
	switch {
	case s == 0:
		return "-"
	case s < 10:
		return fmt.Sprintf("%.2fs", s)
	case s < 120:
		return fmt.Sprintf("%.0fs", s)
	case s < 7200:
		return fmt.Sprintf("%.1fm", s/60)
	}
	return fmt.Sprintf("%.1fh", s/3600)
}

// printable quotes a tenant name that would break the table (spaces, tabs, control bytes).
func printable(s string) string {
	if strings.ContainsAny(s, " \t\n\r") || !isPrint(s) {
		return fmt.Sprintf("%q", s)
	}
	return s
}

func isPrint(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// tenantsCmd is `sluice tenants [--order name|depth] [--limit N] [--cursor C] [--json]`: one
// page of GET /v1/tenants, every tenant with queued work (admin token).
func tenantsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sluice tenants", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print the page as JSON")
	order := fs.String("order", "name", "name, or depth (deepest first)")
	limit := fs.Int("limit", 100, "page size (at most 1000)")
	cursor := fs.String("cursor", "", "the next cursor a previous page printed")
	token := tokenFlag(fs)
	c, err := parseSettings(fs, args)
	if err != nil {
		return err
	}
	cl := client.New(c.get("api-url"), *token)
	p, err := cl.Tenants(ctx, client.TenantsOptions{Order: *order, Limit: *limit, Cursor: *cursor})
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(p)
	}
	printTenants(stdout, p, *order)
	return nil
}

// printTenants renders a page of tenants as a table, with the command for the next page.
func printTenants(w io.Writer, p client.TenantPage, order string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tDEPTH\tOLDEST\tIN FLIGHT\tCAP\tSLOTS\tTIER\tWEIGHT")
	for _, t := range p.Tenants {
		fmt.Fprintf(tw, "%s\t%d\t%.1fs\t%d\t%d\t%d\t%s\t%g\n", printable(t.Tenant), t.Depth, t.OldestAgeSeconds, t.InFlight, t.Cap, t.Slots, t.Tier, t.Weight)
	}
	if len(p.Tenants) == 0 {
		fmt.Fprintln(tw, "(none)\t\t\t\t\t\t\t")
	}
	tw.Flush()
	if p.NextCursor != "" {
		fmt.Fprintf(w, "more: sluice tenants --order %s --cursor %s\n", order, p.NextCursor)
	}
}
