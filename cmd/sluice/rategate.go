package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/gate/client"
)

const gateUsage = `Usage:
  sluice gate set (--rate-key KEY | --hash SHA256) --retry-after SECONDS   gate a rate key (never shortens a gate)
  sluice gate list                                                         gated keys that have queued jobs
  sluice gate clear SHA256                                                 lift a gate
The API is --api-url (SLUICE_API_URL); the token is --token (SLUICE_TOKEN)`

// gateCmd is `sluice gate set|list|clear`: the operator's view of the rate gates, through the API.
func gateCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("gate: want set, list or clear\n" + gateUsage)
	}
	sub, positional, args, fs := subcommand("gate", args, stderr)
	token := tokenFlag(fs)
	rateKey := fs.String("rate-key", "", "set: the raw rate key (hashed by the server, never stored)")
	hash := fs.String("hash", "", "set: the rate key's SHA-256 hex")
	retryAfter := fs.Int("retry-after", 0, "set: whole seconds, 1 to 86400")
	c, err := parseSettings(fs, args)
	if err != nil {
		return err
	}
	api := client.New(c.get("api-url"), *token)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if sub != "clear" && (len(positional) > 0 || fs.NArg() > 0) {
		return fmt.Errorf("gate %s: unexpected argument %q\n%s", sub, append(positional, fs.Args()...)[0], gateUsage)
	}
	switch sub {
	case "set":
		a, err := api.SetGate(ctx, client.SetGateRequest{RateKey: *rateKey, RateKeySHA256: *hash, RetryAfter: *retryAfter})
		if err != nil {
			return fmt.Errorf("gate set: %w", err)
		}
		fmt.Fprintf(stdout, "%s gated until %s\n", a.RateKeySHA256, a.NotBefore.UTC().Format(time.RFC3339Nano))
	case "list":
		gates, err := api.Gates(ctx)
		if err != nil {
			return fmt.Errorf("gate list: %w", err)
		}
		if len(gates) == 0 {
			fmt.Fprintln(stdout, "no gated key has queued jobs")
			return nil
		}
		tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "RATE_KEY_SHA256\tNOT_BEFORE\tREMAINING\tQUEUED")
		for _, g := range gates {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", g.RateKeySHA256, g.NotBefore.UTC().Format(time.RFC3339),
				time.Until(g.NotBefore).Round(time.Second), g.Queued)
		}
		return tw.Flush()
	case "clear":
		positional = append(positional, fs.Args()...)
		if len(positional) != 1 {
			return errors.New("gate clear: want exactly one SHA256\n" + gateUsage)
		}
		h := strings.TrimSpace(positional[0])
		if err := api.ClearGate(ctx, h); err != nil {
			return fmt.Errorf("gate clear: %w", err)
		}
		fmt.Fprintf(stdout, "gate of %s cleared\n", h)
	default:
		return fmt.Errorf("gate: unknown subcommand %q\n%s", sub, gateUsage)
	}
	return nil
}

// splitList splits a comma-separated setting (SLUICE_MEMCACHED) into its non-empty items.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
