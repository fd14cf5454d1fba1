package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
)

// peerLine is one JSON line of ../shared/peers/run.sh: {"prog": "river", "measure": ..., ...}.
type peerLine map[string]any

// pairing puts one sluice figure beside one peer figure of the same run (SPEC §14, issue 31).
type pairing struct {
	what string
	// sluice's line and field; match filters its identity fields.
	bench string
	match map[string]float64
	field string
	// the peer's line and field.
	prog, measure, settings, peerField string
	// target is the ratio SPEC §14 asks for; lower says a ratio that must stay below it
	// (latencies: sluice / peer).
	target float64
	lower  bool
}

var pairings = []pairing{
	{what: "drain, caps 64, one P", bench: "drain_throughput", field: "jobs_per_s",
		prog: "river", measure: "drain", settings: "fast", peerField: "jobs_per_s", target: 0.6},
	{what: "drain, caps 64, all Ps", bench: "drain_throughput", field: "all_procs_jobs_per_s",
		prog: "river", measure: "drain", settings: "fast", peerField: "jobs_per_s", target: 0.6},
	{what: "drain, caps 64, one P, against Asynq", bench: "drain_throughput", field: "jobs_per_s",
		prog: "asynq", measure: "drain", peerField: "jobs_per_s"},
	{what: "single admission, 4 clients", bench: "admission_single_http", match: map[string]float64{"clients": 4},
		field: "jobs_per_s", prog: "river", measure: "enqueue_single", peerField: "jobs_per_s"},
	{what: "batch admission", bench: "admission_batch_http", field: "jobs_per_s",
		prog: "river", measure: "enqueue_insertmany100", peerField: "jobs_per_s", target: 0.8},
	{what: "pickup p50 (sluice from the admission's answer; River from COMMIT)", bench: "pickup_latency",
		field: "one_process_from_answer_p50_ms", prog: "river", measure: "pickup", settings: "fastest", peerField: "p50_ms",
		target: 2, lower: true},
	{what: "pickup p50 (sluice from the admission's start)", bench: "pickup_latency",
		field: "one_process_p50_ms", prog: "river", measure: "pickup", settings: "fastest", peerField: "p50_ms"},
	{what: "pickup p99 (sluice from the admission's start; target 5 ms)", bench: "pickup_latency", field: "one_process_p99_ms",
		prog: "river", measure: "pickup", settings: "fastest", peerField: "p99_ms"},
}

func peers(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("benchtool peers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sluiceFile := fs.String("sluice", "", "sluice's benchmark output ({\"bench\": ...} lines; required)")
	peersFile := fs.String("peers", "", "../shared/peers/run.sh's output of the same run (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *sluiceFile == "" || *peersFile == "" {
		return errors.New("peers: -sluice and -peers are required")
	}
	sf, err := os.Open(*sluiceFile)
	if err != nil {
		return fmt.Errorf("peers: %w", err)
	}
	defer sf.Close()
	figs, err := parseFigures(sf)
	if err != nil {
		return fmt.Errorf("peers: %s: %w", *sluiceFile, err)
	}
	pf, err := os.Open(*peersFile)
	if err != nil {
		return fmt.Errorf("peers: %w", err)
	}
	defer pf.Close()
	lines, err := parsePeers(pf)
	if err != nil {
		return fmt.Errorf("peers: %s: %w", *peersFile, err)
	}
	reportPeers(stdout, figs, lines)
	return nil
}

// parsePeers reads run.sh's JSON lines; other lines (progress) are skipped.
func parsePeers(r io.Reader) ([]peerLine, error) {
	var out []peerLine
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var l peerLine
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			return nil, fmt.Errorf("a peer line is not JSON: %w: %s", err, line)
		}
		out = append(out, l)
	}
	return out, sc.Err()
}

// reportPeers prints every pairing it finds both sides of, and says which side is missing for
// the others.
func reportPeers(w io.Writer, figs []figure, lines []peerLine) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tsluice\tpeer\tpeer figure\tratio\ttarget")
	for _, p := range pairings {
		s, sok := p.sluiceValue(figs)
		v, vok := p.peerValue(lines)
		peer := p.prog + " " + p.measure
		if p.settings != "" {
			peer += " (" + p.settings + ")"
		}
		switch {
		case !sok:
			fmt.Fprintf(tw, "%s\t-\t%s\t%s\t-\tno sluice figure %s.%s\n", p.what, peer, numOr(v, vok), p.bench, p.field)
			continue
		case !vok:
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\tno peer figure\n", p.what, num(s), peer)
			continue
		}
		target := "-"
		if p.target > 0 {
			op := "≥"
			if p.lower {
				op = "≤"
			}
			target = fmt.Sprintf("%s %s", op, num(p.target))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", p.what, num(s), peer, num(v), num(s/v), target)
	}
	tw.Flush()
}

func numOr(v float64, ok bool) string {
	if !ok {
		return "-"
	}
	return num(v)
}

func (p pairing) sluiceValue(figs []figure) (float64, bool) {
	for _, f := range figs {
		if f["bench"] != p.bench {
			continue
		}
		ok := true
		for k, want := range p.match {
			if got, _ := f[k].(float64); got != want {
				ok = false
			}
		}
		if v, isNum := f[p.field].(float64); ok && isNum {
			return v, true
		}
	}
	return 0, false
}

func (p pairing) peerValue(lines []peerLine) (float64, bool) {
	for _, l := range lines {
		if l["prog"] != p.prog || l["measure"] != p.measure {
			continue
		}
		// run.sh names settings with their values: "fast(FetchCooldown=1ms)".
		if s, _ := l["settings"].(string); p.settings != "" && s != p.settings && !strings.HasPrefix(s, p.settings+"(") {
			continue
		}
		if v, ok := l[p.peerField].(float64); ok && v > 0 {
			return v, true
		}
	}
	return 0, false
}
