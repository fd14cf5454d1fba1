package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/gate/job"
)

// jobsCmd is `sluice jobs list|show|cancel|events`: the API's job endpoints through gate/client, for
// operators. The API is named by --api-url (SLUICE_API_URL) and the token by --token
// (SLUICE_TOKEN).
func jobsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("jobs: want `sluice jobs list|show|cancel|events`")
	}
	sub, positional, args, fs := subcommand("jobs", args, stderr)
	token := tokenFlag(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	tenant := fs.String("tenant", "", "list: only this tenant's jobs")
	status := fs.String("status", "", "list: only jobs in this state")
	limit := fs.Int("limit", 50, "list: page size (at most 1000)")
	cursor := fs.String("cursor", "", "list: the next_cursor a previous page printed")
	c, err := parseSettings(fs, args)
	if err != nil {
		return err
	}
	cl := client.New(c.get("api-url"), *token)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	switch sub {
	case "list":
		p, err := cl.List(ctx, client.ListOptions{Tenant: *tenant, Status: job.Status(*status), Limit: *limit, Cursor: *cursor})
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, p)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tTENANT\tSTATUS\tPOSITION\tATTEMPT\tQUEUED AT\tERROR")
		for _, j := range p.Jobs {
			pos := ""
			if j.Position != nil {
				pos = strconv.FormatInt(*j.Position, 10)
			}
			code := ""
			if j.ErrorCode != nil {
				code = *j.ErrorCode
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", j.ID, strconv.Quote(j.Tenant), j.Status, pos, j.Attempt,
				j.QueuedAt.Format(time.RFC3339), code)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if more := moreHint("sluice jobs list", [][2]string{{"tenant", *tenant}, {"status", *status}}, p.NextCursor); more != "" {
			fmt.Fprintln(stdout, more)
		}
		return nil
	case "show", "cancel", "events":
		id, err := oneID("jobs "+sub, "job", append(positional, fs.Args()...))
		if err != nil {
			return err
		}
		if sub == "events" {
			evs, err := cl.JobEvents(ctx, id)
			if err != nil {
				return err
			}
			if *asJSON {
				return printJSON(stdout, evs)
			}
			return printEvents(stdout, evs, "")
		}
		var j job.Job
		if sub == "show" {
			j, err = cl.Job(ctx, id)
		} else {
			j, err = cl.Cancel(ctx, id)
		}
		if err != nil {
			return err
		}
		return printJSON(stdout, j)
	}
	return fmt.Errorf("jobs: unknown subcommand %q (want list, show, cancel or events)", sub)
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
