package main

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/gate"
)

// TestSlotsCommand runs `sluice slots list|release` against a real API over its own database.
func TestSlotsCommand(t *testing.T) {
	adm, sluice := startAPI(t)
	var ids []int64
	for _, tenant := range []string{"acme", "globex"} {
		res, err := adm.TakeSlot(context.Background(), "ops", gate.SlotRequest{Tenant: tenant}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.Slot.ID)
	}
	out, code := sluice("slots", "list", "--tenant", "acme")
	if code != 0 || !strings.Contains(out, `"acme"`) || strings.Contains(out, "globex") || !strings.Contains(out, "ops") {
		t.Errorf("slots list --tenant acme: exit %d\n%s", code, out)
	}
	out, code = sluice("slots", "list", "--limit", "1")
	if code != 0 || !strings.Contains(out, "more: sluice slots list --cursor ") {
		t.Errorf("slots list --limit 1: exit %d\n%s", code, out)
	}
	out, code = sluice("slots", "release", strconv.FormatInt(ids[0], 10))
	if code != 0 || !strings.Contains(out, "released") {
		t.Errorf("slots release: exit %d\n%s", code, out)
	}
	out, code = sluice("slots", "list", "--json")
	if code != 0 || strings.Contains(out, `"acme"`) || !strings.Contains(out, `"globex"`) {
		t.Errorf("slots list --json after the release: exit %d\n%s", code, out)
	}
	if out, code = sluice("slots", "release", "x"); code == 0 {
		t.Errorf("slots release x: exit 0\n%s", out)
	}
	if out, code = sluice("slots", "nope"); code == 0 {
		t.Errorf("slots nope: exit 0\n%s", out)
	}
	for range 2 {
		if _, err := adm.TakeSlot(context.Background(), "ops", gate.SlotRequest{Tenant: "acme"}, nil); err != nil {
			t.Fatal(err)
		}
	}
	out, code = sluice("slots", "list", "--tenant", "acme", "--limit", "1")
	if code != 0 || !strings.Contains(out, "more: sluice slots list --tenant acme --cursor ") {
		t.Errorf("slots list --tenant acme --limit 1: the next page's command keeps the filter: exit %d\n%s", code, out)
	}
}
