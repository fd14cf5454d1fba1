// Command benchtool reads the benchmark figures that the integration benchmarks print (one JSON
// line per figure, {"bench": ...}) and puts them beside what they must be judged against, in the
// same run, because these machines are shared and noisy and only same-run ratios mean anything:
//
//	benchtool compare -base REV [-rounds 5] [-bench REGEX] [-fields REGEX]
//	    builds the integration benchmarks at REV (in a temporary git worktree) and at the working
//	    tree, runs them in alternated rounds (base, head; then head, base; ...), and prints each
//	    figure's median for both builds, their ratio, and in how many rounds the head lost.
//	benchtool peers -sluice FILE -peers FILE
//	    pairs sluice's figures (make bench's output) with the peers' (../shared/peers/run.sh's
//	    output) of the same run: drain, single and batch admission, pickup.
//
// `make benchcmp` and `make bench` call it. It lives beside the benchmarks it reads and is built
// only by them.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "benchtool:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: benchtool compare -base REV [flags] | benchtool peers -sluice FILE -peers FILE")
	}
	switch args[0] {
	case "compare":
		return compare(ctx, args[1:], stdout, stderr)
	case "peers":
		return peers(args[1:], stdout, stderr)
	default:
		return fmt.Errorf("unknown command %q: compare or peers", args[0])
	}
}

// figure is one JSON line a benchmark printed.
type figure map[string]any

// identityFields are the numeric fields that say what was measured, not how fast: two lines
// with the same bench name and these values are the same figure.
var identityFields = map[string]bool{"clients": true, "batch": true, "jobs": true, "caps": true, "gomaxprocs": true,
	"tenants": true, "queued": true, "samples": true, "all_procs": true, "each": true, "passes": true, "runs": true}

// keyOf names the figure a line reports: its bench name and its identity parts (figure.identity),
// in a stable order.
func keyOf(name string, parts []string) string {
	if len(parts) == 0 {
		return name
	}
	return name + " " + strings.Join(parts, " ")
}

// identity returns the figure's bench name and its identity (strings, booleans and
// identityFields) as sorted "field=value" parts.
func (f figure) identity() (string, []string) {
	name, _ := f["bench"].(string)
	var parts []string
	for k, v := range f {
		if k == "bench" {
			continue
		}
		switch v := v.(type) {
		case string, bool:
			parts = append(parts, fmt.Sprintf("%s=%v", k, v))
		case float64:
			if identityFields[k] {
				parts = append(parts, fmt.Sprintf("%s=%s", k, strconv.FormatFloat(v, 'f', -1, 64)))
			}
		}
	}
	sort.Strings(parts)
	return name, parts
}

// metrics returns the figure's measured values: every numeric field that is neither identity nor
// a target the benchmark states beside them, and the numeric fields of an object field one level
// down as "field.name" (the work a job cost the server, SLUICE_BENCH_SERVER_WORK=1: steadier on a
// shared machine than the rates it explains).
func (f figure) metrics() map[string]float64 {
	out := map[string]float64{}
	for k, v := range f {
		if identityFields[k] || strings.Contains(k, "target") {
			continue
		}
		switch v := v.(type) {
		case float64:
			out[k] = v
		case map[string]any:
			for sub, sv := range v {
				if n, ok := sv.(float64); ok {
					out[k+"."+sub] = n
				}
			}
		}
	}
	return out
}

// parseFigures reads the {"bench": ...} lines of r; other lines are skipped.
func parseFigures(r io.Reader) ([]figure, error) {
	var out []figure
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !strings.HasPrefix(string(line), `{"bench"`) {
			continue
		}
		var f figure
		if err := json.Unmarshal(line, &f); err != nil {
			return nil, fmt.Errorf("a benchmark line is not JSON: %w: %s", err, line)
		}
		out = append(out, f)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read benchmark output: %w", err)
	}
	return out, nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// lowerIsBetter reports whether a smaller value of the metric is an improvement: times, a time
// over its raw limit's (x_over_raw), and the work counted per job.
func lowerIsBetter(metric string) bool {
	return strings.HasSuffix(metric, "_ms") || strings.HasSuffix(metric, "_s") && !strings.HasSuffix(metric, "per_s") ||
		strings.Contains(metric, "_over_") || strings.Contains(metric, "work") || strings.HasSuffix(metric, "_us") ||
		strings.HasSuffix(metric, "_bytes")
}

// rounds holds, per figure key and metric, the value each round measured, for base and head.
type rounds struct {
	order []string // figure keys in the order first seen
	base  map[string]map[string][]float64
	head  map[string]map[string][]float64
	// ident is each key's bench name and identity parts, for pairing keys across builds that
	// print different identity fields (pairAcrossIdentities).
	ident map[string]figureID
}

// figureID is a figure's bench name and identity parts (figure.identity).
type figureID struct {
	name  string
	parts []string
}

func newRounds() *rounds {
	return &rounds{base: map[string]map[string][]float64{}, head: map[string]map[string][]float64{},
		ident: map[string]figureID{}}
}

// add records one run's figures for base or head (round index implied by the append order).
func (r *rounds) add(isBase bool, figs []figure) {
	dst := r.head
	if isBase {
		dst = r.base
	}
	for _, f := range figs {
		name, parts := f.identity()
		k := keyOf(name, parts)
		r.ident[k] = figureID{name, parts}
		if _, seen := r.base[k]; !seen {
			if _, seen := r.head[k]; !seen {
				r.order = append(r.order, k)
			}
		}
		if dst[k] == nil {
			dst[k] = map[string][]float64{}
		}
		for m, v := range f.metrics() {
			dst[k][m] = append(dst[k][m], v)
		}
	}
}

// pairAcrossIdentities pairs the figures that only one build printed with their counterpart in
// the other when a benchmark gained (or lost) an identity field between the two: a head figure
// whose identity holds all of a base-only figure's parts and more (say, a tenants=64 the base
// build did not print) is the same figure, if neither has another such counterpart (two head
// figures told apart by the new field are not guessed between). The pair is filed under the
// head's key. It returns a line per pairing, for the report's reader.
func (r *rounds) pairAcrossIdentities() []string {
	only := func(m, other map[string]map[string][]float64) []string {
		var ks []string
		for _, k := range r.order {
			if _, ok := m[k]; ok {
				if _, both := other[k]; !both {
					ks = append(ks, k)
				}
			}
		}
		return ks
	}
	fit := func(a, b string) bool {
		x, y := r.ident[a], r.ident[b]
		return x.name == y.name && (subset(x.parts, y.parts) || subset(y.parts, x.parts))
	}
	baseOnly, headOnly := only(r.base, r.head), only(r.head, r.base)
	fits := func(k string, among []string) []string {
		var out []string
		for _, o := range among {
			if fit(k, o) {
				out = append(out, o)
			}
		}
		return out
	}
	var notes []string
	for _, hk := range headOnly {
		bs := fits(hk, baseOnly)
		if len(bs) != 1 || len(fits(bs[0], headOnly)) != 1 {
			continue
		}
		bk := bs[0]
		r.base[hk] = r.base[bk]
		delete(r.base, bk)
		r.order = slices.DeleteFunc(r.order, func(k string) bool { return k == bk })
		notes = append(notes, fmt.Sprintf("paired base %q with head %q", bk, hk))
	}
	return notes
}

// subset reports whether every part of a is in b (both sorted).
func subset(a, b []string) bool {
	for _, p := range a {
		if _, ok := slices.BinarySearch(b, p); !ok {
			return false
		}
	}
	return true
}

// report prints, for each figure and metric that fields matches, the medians, their ratio
// (head / base), in how many rounds the head was worse than the base of the same round, and how
// likely a head no different from the base is to be worse in that many rounds or more (the sign
// test, signTest). A run prints many figures, so a few of them lose often by chance: the last
// line says how many to expect, so that a loss is judged against it rather than alone.
func (r *rounds) report(w io.Writer, fields *regexp.Regexp) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tmetric\tbase median\thead median\thead/base\thead worse in\tby chance")
	printed, rounds := 0, 0
	for _, k := range r.order {
		metrics := map[string]bool{}
		for m := range r.base[k] {
			metrics[m] = true
		}
		for m := range r.head[k] {
			metrics[m] = true
		}
		names := make([]string, 0, len(metrics))
		for m := range metrics {
			if fields == nil || fields.MatchString(m) {
				names = append(names, m)
			}
		}
		sort.Strings(names)
		for _, m := range names {
			b, h := r.base[k][m], r.head[k][m]
			worse := 0
			n := min(len(b), len(h))
			for i := 0; i < n; i++ {
				if (lowerIsBetter(m) && h[i] > b[i]) || (!lowerIsBetter(m) && h[i] < b[i]) {
					worse++
				}
			}
			chance := "-"
			if n > 0 {
				chance = strconv.FormatFloat(signTest(worse, n), 'f', 3, 64)
				printed, rounds = printed+1, max(rounds, n)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d/%d rounds\t%s\n", k, m, num(median(b)), num(median(h)),
				num(median(h)/median(b)), worse, n, chance)
		}
	}
	tw.Flush()
	if printed > 0 && rounds > 1 {
		// The fewest losses that chance alone reaches at most once in twenty figures (with few
		// rounds no count is that rare, and the line names losing every round).
		k := rounds
		for k > 0 && signTest(k-1, rounds) <= 0.05 {
			k--
		}
		fmt.Fprintf(w, "by chance: the probability that a build no different from base is worse in at least that many rounds\n"+
			"(sign test); of these %d figure(s), about %.2f lose in %d or more of %d rounds by chance alone\n",
			printed, float64(printed)*signTest(k, rounds), k, rounds)
	}
}

// signTest is the probability of at least worse losses in n rounds when each round is a coin
// toss: the one-sided sign test of "head is worse".
func signTest(worse, n int) float64 {
	p, c := 0.0, 1.0 // c: n choose k, from k = 0
	for k := 0; k <= n; k++ {
		if k >= worse {
			p += c
		}
		c = c * float64(n-k) / float64(k+1)
	}
	return p / math.Pow(2, float64(n))
}

func num(v float64) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return "-"
	case math.Abs(v) >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	default:
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
}

// defaultFields are the metrics compare prints unless told otherwise: rates, medians and tails,
// ratios. A rate or ratio named for its variant (jobs_per_s_6400_tenants, ratio_100000) is one:
// with "jobs_per_s$" such a figure printed no line at all.
const defaultFields = `jobs_per_s|_p50_ms$|_p99_ms$|ratio`

func compare(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("benchtool compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	base := fs.String("base", "", "the revision to compare the working tree with (required), e.g. a release tag")
	head := fs.String("head", "", "a revision to compare with base instead of the working tree (bisecting a loss between two commits)")
	n := fs.Int("rounds", 5, "alternated rounds: each runs both builds once")
	bench := fs.String("bench", "BenchmarkAdmission$|BenchmarkDrainThroughput$|BenchmarkPickupLatency$", "the benchmarks to run (go test -bench)")
	fields := fs.String("fields", defaultFields, "the metrics to print (a regular expression; empty: all)")
	timeout := fs.Duration("timeout", 60*time.Minute, "bound of one benchmark run")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *base == "" {
		return errors.New("compare: -base is required (a revision: a tag, a commit, HEAD~3)")
	}
	if *n < 1 {
		return errors.New("compare: -rounds must be at least 1")
	}
	var fieldRE *regexp.Regexp
	if *fields != "" {
		re, err := regexp.Compile(*fields)
		if err != nil {
			return fmt.Errorf("compare: -fields: %w", err)
		}
		fieldRE = re
	}
	root, err := gitOut(ctx, "", "rev-parse", "--show-toplevel")
	if err != nil {
		return err
	}
	rev, err := gitOut(ctx, root, "rev-parse", "--short", *base+"^{commit}")
	if err != nil {
		return fmt.Errorf("compare: -base %q: %w", *base, err)
	}
	headRev := ""
	if *head != "" {
		if headRev, err = gitOut(ctx, root, "rev-parse", "--short", *head+"^{commit}"); err != nil {
			return fmt.Errorf("compare: -head %q: %w", *head, err)
		}
	}
	tmp, err := os.MkdirTemp("", "benchtool-")
	if err != nil {
		return fmt.Errorf("compare: %w", err)
	}
	defer os.RemoveAll(tmp)
	var trees []string // the worktrees added, to remove
	defer func() {
		for _, tree := range trees {
			_, _ = gitOut(context.Background(), root, "worktree", "remove", "--force", tree)
		}
	}()
	worktree := func(name, rev string) (string, error) {
		tree := filepath.Join(tmp, name)
		if _, err := gitOut(ctx, root, "worktree", "add", "--detach", tree, rev); err != nil {
			return "", fmt.Errorf("compare: a worktree at %s: %w", rev, err)
		}
		trees = append(trees, tree)
		return tree, nil
	}
	baseTree, err := worktree("base", rev)
	if err != nil {
		return err
	}
	headName, headTree := "head (working tree)", root
	if headRev != "" {
		if headTree, err = worktree("head", headRev); err != nil {
			return err
		}
		headName = "head " + headRev
	}
	builds := []struct {
		name, tree, bin string
		isBase          bool
	}{
		{"base " + rev, baseTree, filepath.Join(tmp, "base.test"), true},
		{headName, headTree, filepath.Join(tmp, "head.test"), false},
	}
	for _, b := range builds {
		fmt.Fprintf(stderr, "building the integration benchmarks of %s\n", b.name)
		cmd := exec.CommandContext(ctx, "go", "test", "-c", "-o", b.bin, "./integration/")
		cmd.Dir = b.tree
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("compare: build %s: %w\n%s", b.name, err, out)
		}
	}
	r := newRounds()
	for i := 0; i < *n; i++ {
		order := []int{0, 1}
		if i%2 == 1 {
			order = []int{1, 0}
		}
		for _, j := range order {
			b := builds[j]
			start := time.Now()
			fmt.Fprintf(stderr, "round %d/%d: %s ...", i+1, *n, b.name)
			figs, err := runBench(ctx, b.bin, filepath.Join(b.tree, "integration"), *bench, *timeout)
			if err != nil {
				fmt.Fprintln(stderr)
				return fmt.Errorf("compare: round %d, %s: %w", i+1, b.name, err)
			}
			fmt.Fprintf(stderr, " %d figures in %s\n", len(figs), time.Since(start).Round(time.Second))
			r.add(b.isBase, figs)
		}
	}
	against := "the working tree"
	if headRev != "" {
		against = headRev
	}
	fmt.Fprintf(stdout, "base %s against %s, %d alternated rounds of %s (medians)\n", rev, against, *n, *bench)
	for _, note := range r.pairAcrossIdentities() {
		fmt.Fprintln(stdout, note)
	}
	r.report(stdout, fieldRE)
	return nil
}

// runBench runs a built integration test binary's benchmarks once each in dir and returns the
// figures they printed.
func runBench(ctx context.Context, bin, dir, bench string, timeout time.Duration) ([]figure, error) {
	cmd := exec.CommandContext(ctx, bin, "-test.run", "^$", "-test.bench", bench, "-test.benchtime", "1x",
		"-test.timeout", timeout.String())
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("%w\n%s%s", err, tail(out, 20), tail(ee.Stderr, 20))
		}
		return nil, err
	}
	figs, err := parseFigures(strings.NewReader(string(out)))
	if err != nil {
		return nil, err
	}
	if len(figs) == 0 {
		return nil, fmt.Errorf("no figure printed by %s (is -bench %q right?)\n%s", bin, bench, tail(out, 20))
	}
	return figs, nil
}

func tail(b []byte, lines int) string {
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n") + "\n"
}

func gitOut(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}
