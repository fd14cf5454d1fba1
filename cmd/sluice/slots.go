package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/gate/client"
)

// slotsCmd is `sluice slots list [--tenant T] | release ID`: the live slots (SPEC §5a) and an
// operator's release of one whose holder is gone, through the API (admin token).
func slotsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("slots: want `sluice slots list|release ID`")
	}
	sub, positional, args, fs := subcommand("slots", args, stderr)
	token := tokenFlag(fs)
	asJSON := fs.Bool("json", false, "list: print JSON instead of a table")
	tenant := fs.String("tenant", "", "list: only this tenant's slots")
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
		p, err := cl.ListSlots(ctx, *tenant, *limit, *cursor)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, p)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tTENANT\tLANES\tINTERACTIVE\tCOUNTED\tCALLER\tLEASE\tEXPIRES AT")
		for _, s := range p.Slots {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%v\t%v\t%s\t%ds\t%s\n", s.ID, strconv.Quote(s.Tenant), strings.Join(s.Lanes, ","),
				s.Interactive, s.Counted, s.Caller, s.LeaseSeconds, s.ExpiresAt.Format(time.RFC3339))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if more := moreHint("sluice slots list", [][2]string{{"tenant", *tenant}}, p.NextCursor); more != "" {
			fmt.Fprintln(stdout, more)
		}
		return nil
	case "release":
		id, err := oneID("slots release", "slot", append(positional, fs.Args()...))
		if err != nil {
			return err
		}
		if err := cl.ReleaseSlot(ctx, id); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "slot %d released\n", id)
		return nil
	}
	return fmt.Errorf("slots: unknown subcommand %q; want list or release", sub)
}
