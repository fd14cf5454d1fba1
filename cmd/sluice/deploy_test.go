package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestEnvExampleDocumentsEverySetting: deploy/sluice.env.example names every SLUICE_* setting the
// binary reads, each after a comment, and parses as a config file.
func TestEnvExampleDocumentsEverySetting(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/sluice.env.example")
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	for _, s := range settings {
		i := strings.Index(text, s.env+"=")
		if i < 0 {
			t.Errorf("deploy/sluice.env.example does not document %s", s.env)
			continue
		}
		before := strings.TrimRight(text[:i], "#")
		lines := strings.Split(strings.TrimRight(before, "\n"), "\n")
		if last := lines[len(lines)-1]; !strings.HasPrefix(strings.TrimSpace(last), "#") {
			t.Errorf("%s has no comment above it", s.env)
		}
	}
	for _, extra := range []string{"SLUICE_CONFIG=", "SLUICE_TOKEN="} {
		if !strings.Contains(text, extra) {
			t.Errorf("deploy/sluice.env.example does not document %s", strings.TrimSuffix(extra, "="))
		}
	}
	if _, err := readConfigFile("../../deploy/sluice.env.example"); err != nil {
		t.Errorf("the example does not parse as a config file: %v", err)
	}
}

// TestSystemdUnitsHardened: every unit in deploy/systemd carries the resource ceilings and the
// /proc and system-call restrictions, says how to confine its addresses, and (where
// systemd-analyze is installed) rates an exposure of at most 2.0 in its offline security audit.
func TestSystemdUnitsHardened(t *testing.T) {
	units, err := filepath.Glob("../../deploy/systemd/*.service")
	if err != nil || len(units) == 0 {
		t.Fatalf("no units in deploy/systemd: %v", err)
	}
	analyze, lookErr := exec.LookPath("systemd-analyze")
	exposure := regexp.MustCompile(`Overall exposure level for \S+: (\d+\.\d+)`)
	for _, unit := range units {
		name := filepath.Base(unit)
		raw, err := os.ReadFile(unit)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(raw), "\n")
		for _, want := range []string{"MemoryMax=", "TasksMax=", "ProtectProc=invisible", "ProcSubset=pid",
			"SystemCallFilter=@system-service", "SystemCallFilter=~@privileged @resources", "SystemCallErrorNumber=EPERM",
			"NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateDevices=yes", "CapabilityBoundingSet=",
			"RestrictAddressFamilies=", "#IPAddressDeny=any", "#IPAddressAllow="} {
			if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, want) }) {
				t.Errorf("%s lacks %s", name, want)
			}
		}
		if lookErr != nil {
			continue
		}
		out, err := exec.Command(analyze, "security", "--offline=true", unit).CombinedOutput()
		m := exposure.FindSubmatch(out)
		if m == nil {
			t.Errorf("systemd-analyze security %s: %v\n%s", name, err, out)
			continue
		}
		if level, _ := strconv.ParseFloat(string(m[1]), 64); level > 2.0 {
			t.Errorf("%s: exposure %s, want at most 2.0:\n%s", name, m[1], out)
		}
	}
	if lookErr != nil {
		t.Skipf("systemd-analyze is not installed: the offline security audit did not run (%v)", lookErr)
	}
}
