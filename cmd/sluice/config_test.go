package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// TestConfigHistoryCommand: `sluice config history` prints one page of changes, newest first, and
// the command for the next page, as `sluice audit` does; following it reaches the oldest change,
// and --json carries next_cursor (issue 30, finding 12d: the history is paged).
func TestConfigHistoryCommand(t *testing.T) {
	_, sluice := startAPI(t)
	for _, kv := range []string{"tenant_queue_depth=401", "tenant_queue_depth=402", "tenant_queue_depth=403"} {
		if out, code := sluice("config", "set", kv, "--note", "step "+kv); code != 0 {
			t.Fatalf("config set %s: exit %d\n%s", kv, code, out)
		}
	}
	out, code := sluice("config", "history", "--limit", "2")
	more := regexp.MustCompile(`(?m)^more: sluice config history --limit 2 --cursor (\S+)$`).FindStringSubmatch(out)
	if code != 0 || !strings.Contains(out, "version 3") || !strings.Contains(out, "version 2") || strings.Contains(out, "version 1") || more == nil {
		t.Fatalf("config history --limit 2: exit %d, want versions 3 and 2 and the next page's command\n%s", code, out)
	}
	out, code = sluice("config", "history", "--limit", "2", "--cursor", more[1])
	if code != 0 || !strings.Contains(out, "version 1 ") || !strings.Contains(out, "tenant_queue_depth: 500 -> 401") || strings.Contains(out, "more:") {
		t.Errorf("the next page: exit %d, want version 1 alone and no more\n%s", code, out)
	}
	out, code = sluice("config", "history", "--limit", "1", "--json")
	var page struct {
		History    []map[string]any `json:"history"`
		NextCursor string           `json:"next_cursor"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &page) != nil || len(page.History) != 1 || page.NextCursor == "" {
		t.Errorf("config history --limit 1 --json: exit %d, want one change and a next_cursor\n%s", code, out)
	}
}
