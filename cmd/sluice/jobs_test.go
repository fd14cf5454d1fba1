package main

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/job"
)

// TestJobsCommand runs `sluice jobs list|show|cancel` against a real API over its own database.
func TestJobsCommand(t *testing.T) {
	adm, sluice := startAPI(t)
	var ids []int64
	for _, tenant := range []string{"acme", "acme", "globex"} {
		res, err := adm.Admit(context.Background(), "ops", gate.Request{Tenant: tenant}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.Job.ID)
	}
	out, code := sluice("jobs", "list", "--tenant", "acme")
	if code != 0 || strings.Count(out, `"acme"`) != 2 || strings.Contains(out, "globex") || !strings.Contains(out, "queued") {
		t.Errorf("jobs list --tenant acme: exit %d\n%s", code, out)
	}
	out, code = sluice("jobs", "list", "--limit", "1")
	if code != 0 || !strings.Contains(out, "more: sluice jobs list --cursor ") {
		t.Errorf("jobs list --limit 1: exit %d\n%s", code, out)
	}
	out, code = sluice("jobs", "show", strconv.FormatInt(ids[2], 10))
	var j job.Job
	if code != 0 || json.Unmarshal([]byte(out), &j) != nil || j.ID != ids[2] || j.Tenant != "globex" ||
		j.WaitingOn != job.WaitingNext || j.EstimatedStart == nil {
		t.Errorf("jobs show: exit %d (want the queued job with waiting_on next and an estimated_start)\n%s", code, out)
	}
	out, code = sluice("jobs", "cancel", strconv.FormatInt(ids[0], 10))
	if code != 0 || json.Unmarshal([]byte(out), &j) != nil || j.Status != job.Canceled {
		t.Errorf("jobs cancel: exit %d\n%s", code, out)
	}
	// The canceled job's story: admitted by ops, canceled by ops.
	out, code = sluice("jobs", "events", strconv.FormatInt(ids[0], 10))
	if code != 0 || !strings.Contains(out, "admitted") || !strings.Contains(out, "transition") || !strings.Contains(out, "canceled") || strings.Count(out, `"ops"`) != 2 {
		t.Errorf("jobs events: exit %d\n%s", code, out)
	}
	out, code = sluice("jobs", "events", strconv.FormatInt(ids[0], 10), "--json")
	var evs []map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &evs) != nil || len(evs) != 2 || evs[1]["to"] != "canceled" {
		t.Errorf("jobs events --json: exit %d\n%s", code, out)
	}
	out, code = sluice("audit", "--tenant", "acme", "--event", "admitted", "--since", "2000-01-01T00:00:00Z", "--limit", "1")
	// One row, and the hint to the next page, which repeats the filters.
	if code != 0 || strings.Count(out, "admitted") != 2 ||
		!strings.Contains(out, "more: sluice audit --tenant acme --event admitted --since 2000-01-01T00:00:00Z --cursor ") {
		t.Errorf("audit --limit 1: exit %d\n%s", code, out)
	}
	out, code = sluice("audit", "--json")
	var page map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &page) != nil || len(page["events"].([]any)) != 4 {
		t.Errorf("audit --json: exit %d\n%s", code, out)
	}
	if out, code = sluice("audit", "--since", "yesterday"); code != 1 {
		t.Errorf("audit --since yesterday: exit %d\n%s", code, out)
	}
	if out, code = sluice("jobs", "show", "999999"); code != 1 || !strings.Contains(out, "not_found") {
		t.Errorf("jobs show of a missing id: exit %d\n%s", code, out)
	}
	if out, code = sluice("jobs", "frobnicate"); code != 1 {
		t.Errorf("unknown subcommand: exit %d\n%s", code, out)
	}
}
