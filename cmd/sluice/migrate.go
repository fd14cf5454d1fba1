package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/migrations"
)

func migrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub := "up"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("sluice migrate "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	c, err := parseSettings(fs, args)
	if err != nil {
		return err
	}
	dsn, err := c.mysqlDSN()
	if err != nil {
		return err
	}
	if dsn, err = migrations.DSN(dsn); err != nil {
		return err
	}
	db, err := store.Open(ctx, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	switch sub {
	case "up":
		applied, err := migrations.Up(ctx, db, func(m migrations.Migration) {
			fmt.Fprintf(stdout, "applying %s ...\n", m.Name)
		})
		if err != nil {
			return err
		}
		if len(applied) == 0 {
			fmt.Fprintln(stdout, "schema is current; nothing to apply")
		} else {
			fmt.Fprintf(stdout, "applied %d migration(s); schema version %d\n", len(applied), applied[len(applied)-1].Version)
		}
	case "status":
		list, err := migrations.List(ctx, db)
		if err != nil {
			return err
		}
		for _, m := range list {
			state := "pending"
			if m.AppliedAt != nil {
				state = "applied " + m.AppliedAt.Format(time.RFC3339)
			}
			fmt.Fprintf(stdout, "%04d  %-40s %s\n", m.Version, m.Name, state)
		}
	default:
		return fmt.Errorf("migrate: unknown subcommand %q (want up or status)", sub)
	}
	return nil
}
