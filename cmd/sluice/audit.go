package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/gate/client"
)

// auditCmd is `sluice audit`: GET /v1/audit through gate/client, one page of audit events,
// newest first (admin token).
func auditCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sluice audit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	token := tokenFlag(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	tenant := fs.String("tenant", "", "only this tenant's events")
	event := fs.String("event", "", "only this event: admitted, replayed, refused, shadow_refused or transition")
	since := fs.String("since", "", "only events at or after this RFC 3339 time")
	limit := fs.Int("limit", 50, "page size (at most 1000)")
	cursor := fs.String("cursor", "", "the next_cursor a previous page printed")
	c, err := parseSettings(fs, args)
	if err != nil {
		return err
	}
	o := client.AuditOptions{Tenant: *tenant, Event: *event, Limit: *limit, Cursor: *cursor}
	if *since != "" {
		if o.Since, err = time.Parse(time.RFC3339Nano, *since); err != nil {
			return fmt.Errorf("audit: --since: want an RFC 3339 time, e.g. 2026-01-02T15:04:05Z")
		}
	}
	cl := client.New(c.get("api-url"), *token)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	p, err := cl.Audit(ctx, o)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, p)
	}
	// A filtered page may be short, even empty, and the listing still goes on (GET /v1/audit
	// examines a bounded window per request).
	more := moreHint("sluice audit", [][2]string{{"tenant", *tenant}, {"event", *event}, {"since", *since}}, p.NextCursor)
	return printEvents(stdout, p.Events, more)
}

// printEvents prints audit events as a table, then more if not "".
func printEvents(w io.Writer, evs []client.Event, more string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tAT\tEVENT\tTENANT\tJOB\tACTOR\tFROM\tTO\tCODE\tSCOPE")
	for _, e := range evs {
		id := ""
		if e.JobID != nil {
			id = strconv.FormatInt(*e.JobID, 10)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.ID, e.At.Format(time.RFC3339Nano), e.Event,
			strconv.Quote(e.Tenant), id, strconv.Quote(e.Actor), e.From, e.To, e.ErrorCode, e.Scope)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if more != "" {
		fmt.Fprintln(w, more)
	}
	return nil
}
