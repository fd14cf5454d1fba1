package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// module is the import path every sluice package starts with.
const module = "github.com/sluicehq/sluice"

// layer is one row of README.md's "Layers" table.
type layer struct {
	name string
	// packages are paths below module; "x/..." stands for every package under x.
	packages []string
	// peers allows packages of this layer to import each other (README: "same-layer imports").
	peers bool
}

// layers is the import layering of README.md, section "Layers", lowest first: a package imports
// only packages of lower layers, and packages of one layer import each other only when peers is
// set. TestLayersTableMatchesREADME keeps the two in step; change both together.
var layers = []layer{
	{name: "vocabulary", packages: []string{"gate/job", "gate/clock", "gate/sqldb"}},
	{name: "building blocks", packages: []string{"outbox", "migrations", "gate/config", "gate/admitrate", "gate/rategate", "gate/logq", "gate/recent", "gate/console", "gate/groupcommit", "gate/waiters", "drainer/executor", "publisher/devbroker"}},
	{name: "data", packages: []string{"gate/store"}},
	{name: "reads", packages: []string{"gate/status"}},
	{name: "components", packages: []string{"gate", "gate/client", "gate/opsmetrics", "publisher", "drainer", "drainer/executor/kit"}},
	{name: "HTTP edge, what-if", packages: []string{"gate/api", "drainer/executor/simexec", "drainer/simulate"}},
	{name: "process", packages: []string{"cmd/sluice/app"}},
	{name: "binary", packages: []string{"cmd/sluice"}},
	{name: "tests", packages: []string{"integration", "integration/..."}, peers: true},
}

// rule forbids imports that the layers alone would allow: packages at or under from import
// nothing at or under to, except the packages listed. README.md shows them below the table.
type rule struct {
	from, to string
	except   []string
}

// rules are the import bans of README.md's "Layers" section besides the layers themselves: the
// drainer consumes the gate and the relay, never the reverse, the relay needs from gate only the
// shared vocabulary and the clock, and an executor built on the executor kit carries nothing of
// the gate.
var rules = []rule{
	{from: "gate", to: "drainer"},
	{from: "publisher", to: "drainer"},
	{from: "publisher", to: "gate", except: []string{"gate/job", "gate/clock"}},
	{from: "drainer/executor/kit", to: "gate"},
}

// under reports whether pkg is dir or a package below it.
func under(pkg, dir string) bool {
	return pkg == dir || strings.HasPrefix(pkg, dir+"/")
}

// layerOf returns the index in layers of pkg (a path below module), or -1 if no row names it.
func layerOf(pkg string) int {
	for i, l := range layers {
		for _, p := range l.packages {
			if p == pkg {
				return i
			}
			if dir, ok := strings.CutSuffix(p, "/..."); ok && strings.HasPrefix(pkg, dir+"/") {
				return i
			}
		}
	}
	return -1
}

// inIntegration reports whether pkg is integration or below it.
func inIntegration(pkg string) bool { return under(pkg, "integration") }

// layerViolations checks a graph of non-test imports (package path below module → the
// sluice packages it imports, also below module) against layers and returns one line per
// offending package or edge, sorted.
func layerViolations(graph map[string][]string) []string {
	var bad []string
	for from, imports := range graph {
		lf := layerOf(from)
		if lf < 0 {
			bad = append(bad, fmt.Sprintf("%s is in no layer: add it to README.md's Layers table and to layers in cmd/sluice/layers_test.go", from))
			continue
		}
		for _, to := range imports {
			lt := layerOf(to)
			switch {
			case inIntegration(to) && !inIntegration(from):
				bad = append(bad, fmt.Sprintf("%s imports %s: nothing outside integration/ imports integration/ (test code never ships)", from, to))
			case lt < 0:
				// Reported once, as a package of its own.
			case lt > lf:
				bad = append(bad, fmt.Sprintf("%s (layer %d, %s) imports %s (layer %d, %s): imports must go to lower layers",
					from, lf, layers[lf].name, to, lt, layers[lt].name))
			case lt == lf && !layers[lf].peers:
				bad = append(bad, fmt.Sprintf("%s imports %s, both in layer %d (%s), whose packages do not import each other",
					from, to, lf, layers[lf].name))
			}
			for _, r := range rules {
				if under(from, r.from) && under(to, r.to) && !slices.Contains(r.except, to) {
					bad = append(bad, fmt.Sprintf("%s imports %s: %s/ imports nothing under %s/%s", from, to, r.from, r.to, exceptText(r.except)))
				}
			}
		}
	}
	slices.Sort(bad)
	return bad
}

// exceptText is the "except" clause of a rule's message.
func exceptText(except []string) string {
	if len(except) == 0 {
		return ""
	}
	return " except " + strings.Join(except, ", ")
}

// importGraph lists every sluice package with the sluice packages its non-test files import.
func importGraph(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, module+"/...")
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	graph := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		from, ok := below(fields[0])
		if !ok {
			continue
		}
		graph[from] = []string{}
		for _, imp := range fields[1:] {
			if to, ok := below(imp); ok {
				graph[from] = append(graph[from], to)
			}
		}
	}
	if len(graph) < 10 {
		t.Fatalf("go list found only %d sluice packages:\n%s", len(graph), out)
	}
	return graph
}

// below returns importPath relative to module, if it is a sluice package.
func below(importPath string) (string, bool) {
	if importPath == module {
		return "", false
	}
	return strings.CutPrefix(importPath, module+"/")
}

// TestImportsRunOneWay: every package's non-test imports follow README.md's Layers table, and
// nothing outside integration/ imports integration/.
func TestImportsRunOneWay(t *testing.T) {
	for _, v := range layerViolations(importGraph(t)) {
		t.Error(v)
	}
}

// TestBinaryHasNoTestCode: the binary's dependencies include neither integration/ nor the
// testing package.
func TestBinaryHasNoTestCode(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", module+"/cmd/sluice")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for dep := range strings.Lines(string(out)) {
		dep = strings.TrimSpace(dep)
		if p, ok := below(dep); (ok && inIntegration(p)) || dep == "testing" {
			t.Errorf("cmd/sluice depends on %s", dep)
		}
	}
}

// TestLayerCheckCatchesWrongEdges: layerViolations flags an upward import, an import within a
// layer, an import of integration/ from outside it and an unlisted package, and passes the
// downward and allowed ones.
func TestLayerCheckCatchesWrongEdges(t *testing.T) {
	tests := []struct {
		from, to string
		bad      bool
	}{
		{"drainer", "gate/store", false},
		{"gate/store", "outbox", false},
		{"integration/harness", "integration/testdb", false},
		{"integration/harness", "cmd/sluice/app", false},
		{"integration/apitest", "cmd/sluice/app", false}, // gate/api's tests build the front door with it
		{"gate/store", "drainer", true},
		{"gate", "drainer/executor", true},
		{"publisher", "gate", true},
		{"publisher", "gate/store", true},
		{"publisher", "gate/job", false},
		{"publisher", "drainer/executor", true},
		{"gate/api", "cmd/sluice/app", true},
		{"gate", "publisher", true},
		{"cmd/sluice", "integration/testdb", true},
		{"drainer/executor/simexec", "integration/natstest", true},
		{"drainer/executor/simexec", "drainer/executor/kit", false},
		{"drainer/executor/kit", "integration/harness", true},
		{"drainer/executor/kit", "gate/job", true},
		{"drainer/executor/kit", "drainer/executor", false},
		{"gate/newthing", "gate/job", true},
	}
	for _, tt := range tests {
		got := layerViolations(map[string][]string{tt.from: {tt.to}})
		if (len(got) > 0) != tt.bad {
			t.Errorf("%s -> %s: violations %q, want bad=%v", tt.from, tt.to, got, tt.bad)
		}
	}
}

// TestLayersTableMatchesREADME: the Layers table in README.md lists the same layers, names,
// packages and same-layer rules as layers.
func TestLayersTableMatchesREADME(t *testing.T) {
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Layers\n")
	if !ok {
		t.Fatal(`README.md has no "## Layers" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var layerRows, ruleRows []string
	for line := range strings.Lines(section) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "| ---") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i, c := range cells {
			cells[i] = strings.TrimSpace(c)
		}
		switch {
		case cells[0] == "layer" || cells[0] == "packages in":
		case len(cells) == 4:
			layerRows = append(layerRows, fmt.Sprintf("%s | %s | %s | %v", cells[0], cells[1], list(cells[2]), cells[3] != "none"))
		case len(cells) == 3:
			ruleRows = append(ruleRows, fmt.Sprintf("%s | %s | %s", list(cells[0]), list(cells[1]), list(cells[2])))
		default:
			t.Errorf("README.md's Layers section has a row of neither table: %s", line)
		}
	}
	var wantLayers, wantRules []string
	for i, l := range layers {
		wantLayers = append(wantLayers, fmt.Sprintf("%d | %s | %s | %v", i, l.name, strings.Join(l.packages, ", "), l.peers))
	}
	for _, r := range rules {
		wantRules = append(wantRules, fmt.Sprintf("%s | %s | %s", r.from, r.to, strings.Join(r.except, ", ")))
	}
	if !slices.Equal(layerRows, wantLayers) {
		t.Errorf("README.md's layers table:\n%s\nlayers in layers_test.go:\n%s", strings.Join(layerRows, "\n"), strings.Join(wantLayers, "\n"))
	}
	if !slices.Equal(ruleRows, wantRules) {
		t.Errorf("README.md's bans table:\n%s\nrules in layers_test.go:\n%s", strings.Join(ruleRows, "\n"), strings.Join(wantRules, "\n"))
	}
}

// list turns a README cell of backquoted names, comma separated, into "a, b".
func list(cell string) string {
	var names []string
	for name := range strings.SplitSeq(cell, ",") {
		if name = strings.Trim(strings.TrimSpace(name), "`"); name != "" {
			names = append(names, name)
		}
	}
	return strings.Join(names, ", ")
}
