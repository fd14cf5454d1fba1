package integration_test

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/sluicehq/sluice/integration/harness"
)

// specMetrics are the metrics SPEC §10 names.
var specMetrics = []string{"sluice_jobs_admitted_total", "sluice_jobs_finished_total", "sluice_queue_depth",
	"sluice_queue_oldest_age_seconds", "sluice_in_flight", "sluice_gated_keys", "sluice_dispatch_wait_seconds",
	"sluice_execution_seconds", "sluice_outbox_unpublished", "sluice_outbox_oldest_unpublished_age_seconds",
	"sluice_relay_published_total", "sluice_pokes_received_total", "sluice_drainer_last_poll_timestamp_seconds",
	"sluice_depth_cap_refusals_total"}

var metricRef = regexp.MustCompile(`\b(?:sluice|go|process)_[a-z0-9_]+\b`)

// registered returns the metric families a running sluice exposes, after one job ran and one
// admission was refused for depth, so that labelled counters have children however they are
// initialised.
func registered(t *testing.T) map[string]string {
	t.Helper()
	env := harness.Start(t, harness.Options{})
	env.Admit(t, "acme", nil)
	if r := env.Do(t, "PATCH", "/v1/config", harness.AdminToken, map[string]any{"changes": map[string]any{"tenant_queue_depth": 0}}); r.Status != 200 {
		t.Fatalf("PATCH: HTTP %d %s", r.Status, r.Raw)
	}
	if r := env.Do(t, "POST", "/v1/jobs", harness.ProducerToken, map[string]any{"tenant": "refused"}); r.Status != 429 {
		t.Fatalf("admission at depth cap 0: HTTP %d %s, want 429", r.Status, r.Raw)
	}
	out := map[string]string{}
	// The outcome is counted just after its commit: wait for the counter, not only the row.
	harness.WaitFor(t, 20*time.Second, "the job's outcome to be counted", func() (bool, error) {
		c, err := env.CountJobs(context.Background())
		if err != nil || c["succeeded"] != 1 {
			return false, err
		}
		mfs, err := env.App.Registry().Gather()
		if err != nil {
			return false, err
		}
		for _, mf := range mfs {
			out[mf.GetName()] = mf.GetType().String()
		}
		_, ok := out["sluice_jobs_finished_total"]
		return ok, nil
	})
	return out
}

// known reports whether ref (as written in PromQL) is a registered metric: a family name, or a
// histogram's _bucket/_count/_sum series.
func known(reg map[string]string, ref string) bool {
	if _, ok := reg[ref]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_count", "_sum"} {
		if base, ok := strings.CutSuffix(ref, suffix); ok && reg[base] == "HISTOGRAM" {
			return true
		}
	}
	return false
}

// TestOpsDeployFiles checks deploy/: the alert rules parse, cover what an operator must be woken
// for, use only metrics sluice registers and each have a runbook entry; the dashboard uses only
// registered metrics and shows every SPEC §10 metric; the systemd units carry the settings SPEC
// §11 and the hardening require.
func TestOpsDeployFiles(t *testing.T) {
	t.Parallel()
	reg := registered(t)
	for _, m := range specMetrics {
		if _, ok := reg[m]; !ok {
			t.Errorf("SPEC §10 metric %s is not registered", m)
		}
	}
	for name, typ := range map[string]string{"sluice_dispatch_wait_seconds": "HISTOGRAM", "sluice_execution_seconds": "HISTOGRAM",
		"sluice_queue_depth": "GAUGE", "sluice_jobs_admitted_total": "COUNTER", "go_goroutines": "GAUGE", "process_resident_memory_bytes": "GAUGE"} {
		if reg[name] != typ {
			t.Errorf("%s has type %q, want %s", name, reg[name], typ)
		}
	}

	raw, err := os.ReadFile("../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(raw)))
	dec.KnownFields(true)
	if err := dec.Decode(&rules); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	runbook, err := os.ReadFile("../deploy/RUNBOOK.md")
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	alerts := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts++
			if r.Alert == "" || strings.TrimSpace(r.Expr) == "" {
				t.Errorf("rule %+v: alert and expr are required", r)
			}
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
				}
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q, want warning or critical", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: summary and description annotations are required", r.Alert)
			}
			if !strings.Contains(string(runbook), "\n### "+r.Alert+"\n") {
				t.Errorf("%s has no section in deploy/RUNBOOK.md", r.Alert)
			}
			if strings.Count(r.Expr, "(") != strings.Count(r.Expr, ")") {
				t.Errorf("%s: unbalanced parentheses in %q", r.Alert, r.Expr)
			}
			refs := metricRef.FindAllString(r.Expr, -1)
			if len(refs) == 0 {
				t.Errorf("%s uses no sluice metric", r.Alert)
			}
			for _, m := range refs {
				used[m] = true
				if !known(reg, m) {
					t.Errorf("%s uses %s, which sluice does not register", r.Alert, m)
				}
			}
		}
	}
	// What the issue requires an alert for.
	for _, m := range []string{"sluice_queue_oldest_age_seconds", "sluice_drainers", "sluice_outbox_oldest_unpublished_age_seconds",
		"sluice_depth_cap_refusals_total", "sluice_gate_unavailable_total"} {
		if !used[m] {
			t.Errorf("no alert uses %s", m)
		}
	}

	raw, err = os.ReadFile("../deploy/grafana/sluice.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("grafana/sluice.json: %v", err)
	}
	shown := map[string]bool{}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, m := range metricRef.FindAllString(tg.Expr, -1) {
				if !known(reg, m) {
					t.Errorf("panel %q uses %s, which sluice does not register", p.Title, m)
				}
				shown[strings.TrimSuffix(m, "_bucket")] = true
			}
		}
	}
	for _, m := range specMetrics {
		if !shown[m] {
			t.Errorf("the dashboard does not show %s", m)
		}
	}

	units := map[string][]string{
		"sluice.service":          {"ExecStart=/usr/local/bin/sluice serve", "RestartSec=1"},
		"sluice-api.service":      {"ExecStart=/usr/local/bin/sluice serve --api"},
		"sluice-relay.service":    {"ExecStart=/usr/local/bin/sluice serve --relay"},
		"sluice-drainer@.service": {"ExecStart=/usr/local/bin/sluice serve --drainer", "RestartSec=1"},
	}
	for name, extra := range units {
		raw, err := os.ReadFile("../deploy/systemd/" + name)
		if err != nil {
			t.Error(err)
			continue
		}
		lines := strings.Split(string(raw), "\n")
		for _, want := range append(extra, "Type=simple", "Restart=always", "User=sluice", "EnvironmentFile=/etc/sluice/sluice.env",
			"NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes", "KillSignal=SIGTERM") {
			if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, want) }) {
				t.Errorf("%s lacks %s", name, want)
			}
		}
	}
}
