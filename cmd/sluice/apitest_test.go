package main

import (
	"bytes"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/api"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/testdb"
)

// opsToken is the admin token of startAPI's server.
const opsToken = "ops-token-0123456789abcdef0123456789"

// startAPI serves a real API over its own database, with one admin token (opsToken, named
// "ops"), and returns its admitter and a runner of sluice commands against it: their output
// (stdout then stderr) and exit code.
func startAPI(t *testing.T) (*gate.Admitter, func(args ...string) (string, int)) {
	t.Helper()
	db := testdb.New(t)
	lim := config.NewCache(db.DB, nil)
	adm, err := gate.New(gate.Config{DB: db.DB, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	toks, _ := api.NewTokens([]api.Token{{Name: "ops", Token: opsToken, Role: api.Admin}})
	srv, err := api.New(api.Config{DB: db.DB, Admitter: adm, Limits: lim, Tokens: toks})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return adm, func(args ...string) (string, int) {
		var out, errOut bytes.Buffer
		code := run(append(args, "--api-url", hs.URL, "--token", opsToken), &out, &errOut)
		return out.String() + errOut.String(), code
	}
}
