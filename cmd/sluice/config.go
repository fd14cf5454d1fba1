package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/gate/config"
)

// configCmd is `sluice config show|set|history` over the API (SPEC §9, §11).
func configCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("config: want `sluice config show|set key=value... --note TEXT|history`")
	}
	sub := args[0]
	fs := flag.NewFlagSet("sluice config "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	note := fs.String("note", "", "why the change is made (set)")
	limit := fs.Int("limit", 50, "page size (history; at most 1000)")
	cursor := fs.String("cursor", "", "the next_cursor a previous page printed (history)")
	token := tokenFlag(fs)
	flags, pos := splitArgs(args[1:], "json", "-json")
	c, err := parseSettings(fs, flags)
	if err != nil {
		return err
	}
	pos = append(pos, fs.Args()...)
	cl := client.New(c.get("api-url"), *token)
	switch sub {
	case "show":
		v, err := cl.Config(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return printIndented(stdout, v)
		}
		fmt.Fprintf(stdout, "runtime config version %d\n", v.Version)
		printConfig(stdout, v.Config)
	case "set":
		return configSet(ctx, cl, pos, *note, *asJSON, stdout)
	case "history":
		return configHistory(ctx, cl, *limit, *cursor, *asJSON, stdout)
	default:
		return fmt.Errorf("config: unknown subcommand %q (want show, set or history)", sub)
	}
	return nil
}

// configSet applies the key=value changes kvs, with note, and prints what changed.
func configSet(ctx context.Context, cl *client.Client, kvs []string, note string, asJSON bool, stdout io.Writer) error {
	if len(kvs) == 0 {
		return errors.New("config set: want at least one key=value")
	}
	changes := map[string]any{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("config set: %q: want key=value", kv)
		}
		changes[k] = parseValue(v)
	}
	v, err := cl.PatchConfig(ctx, changes, note)
	if err != nil {
		var ae *client.Error
		if errors.As(err, &ae) && ae.Body["field"] != nil {
			return fmt.Errorf("config set refused, nothing changed: %s", ae.Message)
		}
		return err
	}
	if asJSON {
		return printIndented(stdout, v)
	}
	if v.Change == nil {
		fmt.Fprintf(stdout, "nothing changed; version %d stays in force\n", v.Version)
		return nil
	}
	fmt.Fprintf(stdout, "version %d in force (each sluice process applies it within %s)\n", v.Version, config.ReloadEvery)
	printChange(stdout, *v.Change)
	return nil
}

// configHistory prints a page of the config's changes, newest first, and the command for the next.
func configHistory(ctx context.Context, cl *client.Client, limit int, cursor string, asJSON bool, stdout io.Writer) error {
	p, err := cl.ConfigHistory(ctx, client.ConfigHistoryOptions{Limit: limit, Cursor: cursor})
	if err != nil {
		return err
	}
	if asJSON {
		return printIndented(stdout, p)
	}
	if len(p.History) == 0 && cursor == "" {
		fmt.Fprintln(stdout, "no changes: the defaults are in force")
	}
	for _, ch := range p.History {
		fmt.Fprintf(stdout, "version %d  %s  by %s", ch.Version, ch.When.Format("2006-01-02T15:04:05Z"), ch.Who)
		if ch.Note != "" {
			fmt.Fprintf(stdout, "  %q", ch.Note)
		}
		fmt.Fprintln(stdout)
		printChange(stdout, ch)
	}
	// One page per request, as `sluice audit`: the history is read a bounded page at a time.
	if more := moreHint("sluice config history", [][2]string{{"limit", strconv.Itoa(limit)}}, p.NextCursor); more != "" {
		fmt.Fprintln(stdout, more)
	}
	return nil
}

// parseValue reads a value as JSON when it is JSON (8, true, {"acme": 3}) and as a string
// otherwise (fifo), so that `ordering=fifo` needs no quoting.
func parseValue(v string) any {
	var out any
	if err := json.Unmarshal([]byte(v), &out); err == nil {
		return json.RawMessage(v)
	}
	return v
}

func printConfig(w io.Writer, cfg config.Config) {
	raw, _ := json.Marshal(cfg)
	var m map[string]json.RawMessage
	_ = json.Unmarshal(raw, &m)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, k := range config.Keys() {
		fmt.Fprintf(tw, "  %s\t%s\n", k, m[k])
	}
	tw.Flush()
}

func printChange(w io.Writer, ch config.Change) {
	keys := make([]string, 0, len(ch.New))
	for k := range ch.New {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "  %s: %s -> %s\n", k, ch.Old[k], ch.New[k])
	}
}

// printIndented writes v as indented JSON (the --json output of the admin commands).
func printIndented(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
