package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/outbox"
	"github.com/sluicehq/sluice/publisher"
)

// outboxCmd is `sluice outbox status|replay|restore`.
func outboxCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("outbox: want `sluice outbox status`, `sluice outbox replay --since <time>|--from-id <id> [--dry-run]` or `sluice outbox restore --from-id <id> [--to-id <id>]`")
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("sluice outbox "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var since string
	var fromID, toID int64
	var dryRun bool
	switch sub {
	case "status":
	case "replay":
		fs.StringVar(&since, "since", "", "replay rows published at or after this time (RFC 3339, or a duration ago such as 2h)")
		fs.Int64Var(&fromID, "from-id", 0, "replay rows with this outbox id or above")
		fs.BoolVar(&dryRun, "dry-run", false, "count what would be replayed; publish nothing")
	case "restore":
		fs.Int64Var(&fromID, "from-id", 0, "first set-aside row id to move back into the outbox")
		fs.Int64Var(&toID, "to-id", 0, "last set-aside row id (default: --from-id)")
	default:
		return fmt.Errorf("outbox: unknown subcommand %q (want status, replay or restore)", sub)
	}
	c, err := parseSettings(fs, args)
	if err != nil {
		return err
	}
	db, err := c.openDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	switch sub {
	case "status":
		return outboxStatus(ctx, db, stdout)
	case "restore":
		return outboxRestore(ctx, db, fromID, toID, stdout)
	}
	return outboxReplay(ctx, c, db, since, fromID, dryRun, stdout)
}

// outboxStatus prints the backlog and the first rows set aside.
func outboxStatus(ctx context.Context, db *sql.DB, stdout io.Writer) error {
	now, err := clock.DB{DB: db}.Now(ctx)
	if err != nil {
		return err
	}
	st, err := outbox.ReadStats(ctx, db, now)
	if err != nil {
		return err
	}
	n, failed, err := outbox.ReadFailed(ctx, db, 10)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "unpublished: %d\noldest unpublished age: %.1fs\nset aside (refused by the broker): %d\n",
		st.Unpublished, st.OldestAgeSeconds, n)
	for _, f := range failed {
		fmt.Fprintf(stdout, "  row %d  %s  %d bytes  %s  %s\n", f.ID, f.Subject, f.Size, f.FailedAt.Format(time.RFC3339), f.Error)
	}
	return nil
}

// outboxRestore moves the set-aside rows fromID to toID (fromID alone when 0) back into the outbox.
func outboxRestore(ctx context.Context, db *sql.DB, fromID, toID int64, stdout io.Writer) error {
	if fromID <= 0 {
		return errors.New("outbox restore: --from-id is required")
	}
	if toID == 0 {
		toID = fromID
	}
	n, err := outbox.Restore(ctx, db, fromID, toID)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "moved %d set-aside row(s) back into the outbox; the relay will publish them\n", n)
	return nil
}

// outboxReplay publishes again the rows published since (or from fromID), or with dryRun counts
// them, printing its progress.
func outboxReplay(ctx context.Context, c *settingValues, db *sql.DB, since string, fromID int64, dryRun bool, stdout io.Writer) error {
	sel, err := replaySelection(since, fromID, time.Now())
	if err != nil {
		return err
	}
	installID, err := publisher.InstallationID(ctx, db)
	if err != nil {
		return err
	}
	cfg := publisher.ReplayConfig{DB: db, InstallID: installID, Selection: sel, DryRun: dryRun,
		Progress: func(p publisher.ReplayProgress) {
			what := fmt.Sprintf("replay %d", p.Replay)
			if dryRun {
				what = "dry run"
			}
			fmt.Fprintf(stdout, "%s: %d/%d rows (ids %d..%d), %d refused\n", what, p.Published, p.Selected, p.FirstID, p.LastID, p.Refused)
		}}
	if !dryRun {
		core, err := c.bool("nats-core")
		if err != nil {
			return err
		}
		nc, err := c.connectNATS("sluice outbox replay")
		if err != nil {
			return err
		}
		defer nc.Close()
		cfg.NC = nc
		if !core {
			if cfg.JS, err = jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(8192)); err != nil {
				return fmt.Errorf("JetStream: %w", err)
			}
		}
	}
	p, err := publisher.Replay(ctx, cfg)
	if err != nil {
		return err
	}
	if dryRun {
		fmt.Fprintf(stdout, "dry run: %d published row(s) selected (ids %d..%d); nothing published\n", p.Published, p.FirstID, p.LastID)
		return nil
	}
	fmt.Fprintf(stdout, "replay %d done: %d row(s) republished (ids %d..%d), %d refused; message ids %s-<row id>-r%d\n",
		p.Replay, p.Published, p.FirstID, p.LastID, p.Refused, installID, p.Replay)
	return nil
}

// replaySelection parses --since (RFC 3339, or a duration before now) and --from-id; one of them
// is required, so that a bare `replay` never republishes the whole retention by accident.
func replaySelection(since string, fromID int64, now time.Time) (outbox.Selection, error) {
	sel := outbox.Selection{FromID: fromID}
	if since == "" && fromID <= 0 {
		return sel, errors.New("outbox replay: --since or --from-id is required")
	}
	if since != "" {
		t, err := time.Parse(time.RFC3339Nano, since)
		if err != nil {
			d, derr := time.ParseDuration(strings.TrimPrefix(since, "-"))
			if derr != nil {
				return sel, fmt.Errorf("outbox replay: --since: want an RFC 3339 time or a duration, got %q", since)
			}
			t = now.Add(-d)
		}
		t = clock.Trunc(t)
		sel.Since = &t
	}
	return sel, nil
}
