// The runtime would re-read the cgroup CPU limit every second to adjust GOMAXPROCS. An idle
// drainer's whole budget is 1 ms of CPU a second (SPEC §14), and the limit read at start is
// the one that counts for a service restarted by its unit.
//go:debug updatemaxprocs=0

// Command sluice is the one sluice binary: the API, relay and drainer (serve), the all-in-one
// developer process (dev), schema migrations, stream set-up and the simulated executor. It only
// parses settings and wires the packages; see cmd/sluice/app for the wiring.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluicehq/sluice/gate/api"
	"github.com/sluicehq/sluice/gate/logq"
)

// version is set at link time (-ldflags "-X main.version=...").
var version = "dev"

const usage = `sluice — a durable, fair admission queue

Usage:
  sluice serve [--api] [--relay] [--drainer] [flags]   run the API, relay and drainer (all by default)
  sluice dev [flags]                                   everything in one process with a simulated executor
                                                       (and a NATS server of its own if SLUICE_NATS_URL is unset)
  sluice migrate [up|status] [flags]                   apply or list schema migrations
  sluice jobs list|show|cancel|events [flags]          list, read or cancel jobs, or read a job's audit trail
  sluice audit [--tenant T] [--event E] [--since TIME] audit events, newest first, a page at a time (admin token)
  sluice slots list [--tenant T] | release ID          live slots, newest first; release one (admin token)
  sluice nats init [flags]                             create or update the JetStream stream
  sluice outbox status|replay|restore [flags]          outbox backlog, replay published rows, restore set-aside rows
  sluice simexec [flags]                               run the simulated executor alone
  sluice gate set|list|clear [flags]                   set, list or clear rate gates
  sluice version                                       print the version
  sluice status [--json] [flags]                       queue, tenants, gates, drainers, outbox (admin token)
  sluice tenants [--order name|depth] [--cursor C]     every tenant with work, a page at a time (admin token)
  sluice config show|set key=value... --note TEXT|history   runtime config (admin token)
  sluice config history [--limit N] [--cursor C]       its changes, newest first, a page at a time (admin token)
  sluice simulate --since T [--until T] --set key=value...   replay what arrived under a config change (database)
  sluice simulate --arrivals FILE [--current defaults] --set key=value...   the same for arrivals in a file

Settings come from flags, SLUICE_* environment variables or a --config file, in that order
(an empty variable or file value counts as unset).
Run 'sluice serve -h' to list them.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd, rest := args[0], args[1:]; cmd {
	case "serve":
		err = serve(ctx, rest, stdout, stderr, false)
	case "dev":
		err = serve(ctx, rest, stdout, stderr, true)
	case "migrate":
		err = migrate(ctx, rest, stdout, stderr)
	case "jobs":
		err = jobsCmd(ctx, rest, stdout, stderr)
	case "audit":
		err = auditCmd(ctx, rest, stdout, stderr)
	case "slots":
		err = slotsCmd(ctx, rest, stdout, stderr)
	case "nats":
		err = natsCmd(ctx, rest, stdout, stderr)
	case "outbox":
		err = outboxCmd(ctx, rest, stdout, stderr)
	case "simexec":
		err = simexecCmd(ctx, rest, stdout, stderr)
	case "gate":
		err = gateCmd(ctx, rest, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "sluice", version)
	case "status":
		err = statusCmd(ctx, rest, stdout, stderr)
	case "tenants":
		err = tenantsCmd(ctx, rest, stdout, stderr)
	case "config":
		err = configCmd(ctx, rest, stdout, stderr)
	case "simulate":
		err = simulateCmd(ctx, rest, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "sluice: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "sluice:", err)
		return 1
	}
	return 0
}

// newLogger returns a long-running process's logger: JSON lines on w at level, through a logq
// queue and its writer goroutine, so that a sink that stops reading drops lines rather than
// blocking admissions and claims (SPEC §10). The caller closes the queue with closeLog once
// everything else has stopped.
func newLogger(w io.Writer, level string) (*slog.Logger, *logq.Queue, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, nil, fmt.Errorf("log level: want debug, info, warn or error, got %q", level)
	}
	q, err := logq.New(logq.Config{Sink: w, Options: &slog.HandlerOptions{Level: l}})
	if err != nil {
		return nil, nil, err
	}
	return slog.New(q.Handler()), q, nil
}

// closeLog writes the log lines still queued, waiting at most logq's 2 s bound (SPEC §10). If
// the sink is stuck the lines are lost, and nothing is said about it: the only place to say it
// is the sink.
func closeLog(q *logq.Queue) { _ = q.Close(context.Background()) }

// loadTokens returns the API tokens of SLUICE_TOKENS, or of the file SLUICE_TOKENS_FILE names:
// nil when neither is set (the API then refuses to start, except under `sluice dev`, which adds
// its own). `sluice dev` passes withDev and gets the dev admin token added (see withDevToken).
func loadTokens(c *settingValues, withDev bool) (*api.Tokens, error) {
	raw := c.get("tokens")
	if f := c.get("tokens-file"); raw == "" && f != "" {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("tokens file: %w", err)
		}
		raw = string(data)
	}
	var list []api.Token
	if raw != "" {
		var err error
		if list, err = api.DecodeTokens([]byte(raw)); err != nil {
			return nil, err
		}
	} else if !withDev {
		return nil, nil
	}
	if withDev {
		var err error
		if list, err = withDevToken(list); err != nil {
			return nil, err
		}
	}
	return api.NewTokens(list)
}
