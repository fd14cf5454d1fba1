package main

import (
	"os"
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
