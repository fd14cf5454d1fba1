package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/api"
	"github.com/sluicehq/sluice/gate/limits"
	"github.com/sluicehq/sluice/integration/testdb"
)

// TestSlotsCommand runs `sluice slots list|release` against a real API over its own database.
func TestSlotsCommand(t *testing.T) {
	db := testdb.New(t)
	lim := limits.NewCache(db.DB, nil)
	adm, err := gate.New(gate.Config{DB: db.DB, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	const token = "ops-token-0123456789abcdef0123456789"
	toks, _ := api.NewTokens([]api.Token{{Name: "ops", Token: token, Role: api.Admin}})
	srv, err := api.New(api.Config{DB: db.DB, Admitter: adm, Limits: lim, Tokens: toks})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	var ids []int64
	for _, tenant := range []string{"acme", "globex"} {
		res, err := adm.TakeSlot(context.Background(), "ops", gate.SlotRequest{Tenant: tenant}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.Slot.ID)
	}
	sluice := func(args ...string) (string, int) {
		var out, errOut bytes.Buffer
		code := run(append(args, "--api-url", hs.URL, "--token", token), &out, &errOut)
		return out.String() + errOut.String(), code
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
}
