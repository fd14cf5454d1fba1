package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/drainer/simulate"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/config"
)

// setFlags collects repeated --set key=value.
type setFlags map[string]json.RawMessage

func (s setFlags) String() string { return "" }

func (s setFlags) Set(kv string) error {
	k, v, ok := strings.Cut(kv, "=")
	if !ok || k == "" {
		return fmt.Errorf("want key=value, got %q", kv)
	}
	raw, err := json.Marshal(parseValue(v))
	if err != nil {
		return err
	}
	s[k] = raw
	return nil
}

// simulateCmd is `sluice simulate` (SPEC §11): what the arrivals of a window of the audit trail,
// or of a file, would have met under the configuration in force and under it with --set
// changes, side by side.
func simulateCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sluice simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var in simulateInput
	fs.StringVar(&in.since, "since", "", "replay what arrived from this time (RFC 3339, or a duration ago such as 2h)")
	fs.StringVar(&in.until, "until", "", "... up to this time (RFC 3339 or a duration ago; default now)")
	fs.StringVar(&in.file, "arrivals", "", "replay this JSON-lines file of arrivals instead of the audit trail (- for stdin)")
	fs.StringVar(&in.start, "start", "", "with --arrivals: the time a numeric `at` counts from (RFC 3339; default 2000-01-01T00:00:00Z)")
	set := setFlags{}
	fs.Var(set, "set", "a config change to simulate, key=value as `sluice config set` takes it (repeat for more)")
	top := fs.Int("top", 20, "tenants shown in the table and the JSON, the busiest first, and as many gaining and losing most (0: all)")
	asJSON := fs.Bool("json", false, "print JSON")
	claimBatch := fs.Int("claim-batch", 64, "the drainers' claim batch")
	arrivalPickup := fs.String("arrival-pickup", "auto", "from an admission to the claim pass that may start it: a duration, or auto (measured on the window's jobs; "+simulate.DefaultArrivalPickup.String()+" for a file)")
	outcomePickup := fs.String("outcome-pickup", "auto", "from an outcome to the claim pass that reuses its unit: a duration, or auto (measured; "+simulate.DefaultOutcomePickup.String()+" for a file)")
	fs.StringVar(&in.base, "current", "db", "the configuration compared against: db (the one in force) or defaults")
	flags, pos := splitArgs(args, "json", "-json")
	c, err := parseSettings(fs, flags)
	if err != nil {
		return err
	}
	if pos = append(pos, fs.Args()...); len(pos) > 0 {
		return fmt.Errorf("simulate: unexpected argument %q (changes go in --set key=value)", pos[0])
	}
	if (in.since == "") == (in.file == "") {
		return errors.New("simulate: want --since <time> (the audit trail) or --arrivals FILE, one of the two")
	}
	opts, err := simulateOptions(*claimBatch, *arrivalPickup, *outcomePickup)
	if err != nil {
		return err
	}
	in.auto = pickupAuto{arrival: *arrivalPickup == "auto", outcome: *outcomePickup == "auto"}
	src, current, closeSource, err := in.open(ctx, c, &opts, stderr)
	if err != nil {
		return err
	}
	defer closeSource()
	progress := func(n int) { fmt.Fprintf(stderr, "simulate: %d arrivals replayed\n", n) }
	cmp, err := simulate.Run(ctx, src, current, set, opts, progress)
	if errors.Is(err, simulate.ErrNoArrivals) {
		if in.file != "" {
			return fmt.Errorf("simulate: %s holds no arrivals", in.file)
		}
		return errors.New("simulate: the audit trail holds no arrivals in that window (is audit_retention_days shorter, or the audit off?)")
	}
	if err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	if *asJSON {
		return cmp.WriteJSON(stdout, *top)
	}
	return cmp.WriteTable(stdout, *top)
}

// simulateOptions are the replay's options: the claim batch, and each pickup a duration or
// "auto" (left at its default here, measured on the window's jobs by recordedSource).
func simulateOptions(claimBatch int, arrivalPickup, outcomePickup string) (simulate.Options, error) {
	opts := simulate.Options{ClaimBatch: claimBatch, ArrivalPickup: simulate.DefaultArrivalPickup, OutcomePickup: simulate.DefaultOutcomePickup}
	pickups := []struct {
		flag, v string
		to      *time.Duration
	}{{"--arrival-pickup", arrivalPickup, &opts.ArrivalPickup}, {"--outcome-pickup", outcomePickup, &opts.OutcomePickup}}
	for _, p := range pickups {
		if p.v == "auto" {
			continue
		}
		d, err := time.ParseDuration(p.v)
		if err != nil || d < 0 {
			return opts, fmt.Errorf("simulate: %s: want a duration such as 5ms, or auto, got %q", p.flag, p.v)
		}
		*p.to = d
	}
	return opts, nil
}

// simulateInput is what `sluice simulate` replays and against which configuration: the audit
// trail's window (since, until) or a file of arrivals (file, start), compared with the
// configuration in force (base "db") or the defaults.
type simulateInput struct {
	since, until, file, start, base string
	auto                            pickupAuto
}

// open opens the arrivals and reads the configuration compared against, saying on stderr which
// it is. closeSource closes what open opened (the database, the file) once the replay is done.
func (in simulateInput) open(ctx context.Context, c *settingValues, opts *simulate.Options, stderr io.Writer) (src simulate.Source, current config.Config, closeSource func(), err error) {
	if in.base != "db" && in.base != "defaults" {
		return nil, current, nil, fmt.Errorf("simulate: --current: want db or defaults, got %q", in.base)
	}
	if in.base == "defaults" && in.file == "" {
		return nil, current, nil, errors.New("simulate: --current=defaults is for --arrivals; the audit trail is read from the database")
	}
	var closers []func()
	closeSource = func() {
		for _, f := range slices.Backward(closers) {
			f()
		}
	}
	current, from := config.Default(), "the defaults"
	if in.base == "db" {
		db, err := c.openDB(ctx)
		if err != nil {
			return nil, current, nil, err
		}
		closers = append(closers, func() { db.Close() })
		v, err := config.Load(ctx, db)
		if err != nil {
			closeSource()
			return nil, current, nil, fmt.Errorf("simulate: read the configuration in force (--current defaults compares a file's arrivals with the defaults instead): %w", err)
		}
		current, from = v.Config, fmt.Sprintf("runtime config version %d", v.Version)
		if in.file == "" {
			if src, err = recordedSource(ctx, db, in.since, in.until, in.auto, opts, stderr); err != nil {
				closeSource()
				return nil, current, nil, err
			}
		}
	}
	if in.file != "" {
		var closeFile func()
		if src, closeFile, err = fileSource(in.file, in.start); err != nil {
			closeSource()
			return nil, current, nil, err
		}
		closers = append(closers, closeFile)
	}
	fmt.Fprintf(stderr, "simulate: current configuration: %s\n", from)
	return src, current, closeSource, nil
}

// timeOrAgo parses an RFC 3339 time, or a duration before now.
func timeOrAgo(flag, v string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t.UTC(), nil
	}
	d, err := time.ParseDuration(strings.TrimPrefix(v, "-"))
	if err != nil || d <= 0 {
		return time.Time{}, fmt.Errorf("simulate: %s: want an RFC 3339 time or a duration ago such as 2h, got %q", flag, v)
	}
	return now.Add(-d), nil
}

// pickupAuto says which pickup delays are measured on the window (--arrival-pickup and
// --outcome-pickup auto) rather than given.
type pickupAuto struct{ arrival, outcome bool }

// recordedSource is the audit trail's arrivals from since to until (each a time or a duration
// ago, until now by default), with the pickups auto asks for measured on the window's jobs
// into opts, and the depth's period set to the window's length.
func recordedSource(ctx context.Context, db *sql.DB, since, until string, auto pickupAuto, opts *simulate.Options, stderr io.Writer) (simulate.Source, error) {
	now, err := clock.DB{DB: db}.Now(ctx)
	if err != nil {
		return nil, err
	}
	lo, err := timeOrAgo("--since", since, now)
	if err != nil {
		return nil, err
	}
	hi := now
	if until != "" {
		if hi, err = timeOrAgo("--until", until, now); err != nil {
			return nil, err
		}
	}
	if !lo.Before(hi) {
		return nil, fmt.Errorf("simulate: the window %s to %s is empty", lo.Format(time.RFC3339), hi.Format(time.RFC3339))
	}
	opts.DepthEvery = simulate.DepthPeriod(hi.Sub(lo))
	arrival, outcome, measured, err := simulate.Calibrate(ctx, db, lo, hi)
	if err != nil {
		return nil, fmt.Errorf("simulate: %w", err)
	}
	if auto.arrival {
		opts.ArrivalPickup = arrival
	}
	if auto.outcome {
		opts.OutcomePickup = outcome
	}
	if measured {
		fmt.Fprintf(stderr, "simulate: pickup measured on the window's jobs: %s after an arrival, %s after an outcome\n",
			arrival.Round(10*time.Microsecond), outcome.Round(10*time.Microsecond))
	}
	return simulate.Recorded(ctx, db, lo, hi), nil
}

// fileSource is the arrivals of the JSON-lines file (- for stdin), a numeric `at` counting from
// start (default 2000-01-01T00:00:00Z); the caller calls closeFile once the replay is done.
func fileSource(file, start string) (src simulate.Source, closeFile func(), err error) {
	at := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	if start != "" {
		if at, err = time.Parse(time.RFC3339Nano, start); err != nil {
			return nil, nil, fmt.Errorf("simulate: --start: want an RFC 3339 time, got %q", start)
		}
	}
	if file == "-" {
		return simulate.Lines(os.Stdin, at), func() {}, nil
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, nil, fmt.Errorf("simulate: %w", err)
	}
	return simulate.Lines(f, at), func() { _ = f.Close() }, nil
}
