package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/cmd/sluice/app"
	"github.com/sluicehq/sluice/drainer/executor/simexec"
	"github.com/sluicehq/sluice/gate/api"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/publisher/devbroker"
)

// devToken is the admin token `sluice dev` always accepts (SPEC §9): its banner names it, and its
// simulated executor calls /start and /complete with it.
var devToken = api.Token{Name: "dev", Token: "dev", Role: api.Admin, Builtin: true}

// withDevToken returns list with the dev admin token added, so that configured tokens (a
// producer's, to try them out) work next to it rather than instead of it. A configured admin
// token whose value is `dev` already stands for it. Any other use of the name or the value is
// refused: the value with another role would make the built-in executor's calls fail, and a
// second caller named dev would be indistinguishable from it in logs and config history.
func withDevToken(list []api.Token) ([]api.Token, error) {
	have := false
	list = slices.Clone(list) // the caller's list is left as it was
	for i, t := range list {
		switch {
		case t.Token == devToken.Token && t.Role == api.Admin:
			// It stands for the dev token, which alone may be shorter than api.MinTokenLength.
			list[i].Builtin = true
			have = true
		case t.Token == devToken.Token || t.Name == devToken.Name:
			return nil, fmt.Errorf("tokens: the configured token %q (role %q) uses the name or token %q, which `sluice dev` keeps for its own admin token: rename it, or use `sluice serve`",
				t.Name, t.Role, devToken.Token)
		}
	}
	if have {
		return list, nil
	}
	return append(list, devToken), nil
}

// devLoopbackOnly refuses an API or metrics listen address of `sluice dev` that is not loopback.
// dev accepts its built-in admin token `dev`, which everyone knows: on any other address, anyone
// who can reach the host could read every tenant's jobs and change the runtime config.
func devLoopbackOnly(c *settingValues) error {
	for _, l := range []struct{ flag, env string }{{"listen", "SLUICE_LISTEN"}, {"metrics-listen", "SLUICE_METRICS_LISTEN"}} {
		addr := c.get(l.flag)
		if addr == "" && l.flag == "metrics-listen" {
			continue // metrics on the API listener
		}
		if !loopbackAddr(addr) {
			return fmt.Errorf("sluice dev: %s (--%s) %q is not a loopback address: dev accepts its built-in admin token `dev`, "+
				"which would let anyone who reaches that address act as admin; listen on 127.0.0.1, [::1] or localhost, "+
				"or run `sluice serve` with tokens of your own", l.env, l.flag, addr)
		}
	}
	return nil
}

// loopbackAddr reports whether the host of the listen address addr is loopback: 127.0.0.0/8,
// ::1 or localhost. An empty host means every interface.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// devExtras is what devSetup started, for the banner.
type devExtras struct {
	statsURL     string // the simulated executor's stats, "" with the user's own executor
	embeddedNATS bool
}

// devSetup fills in what `sluice dev` provides: migrations applied, an embedded NATS server
// unless a NATS URL is configured, and, unless an executor URL is configured, the simulated
// executor. The dev admin token is added by loadTokens.
func devSetup(ctx context.Context, c *settingValues, opts *app.Options, stdout io.Writer, shutdown *[]func()) (devExtras, error) {
	var x devExtras
	if opts.NATSURL == "" {
		b, err := devbroker.Start()
		if err != nil {
			return x, err
		}
		*shutdown = append(*shutdown, b.Stop)
		opts.NATSURL, x.embeddedNATS = b.URL(), true
	}
	dsn, err := migrations.DSN(opts.MySQLDSN)
	if err != nil {
		return x, err
	}
	db, err := store.Open(ctx, dsn)
	if err != nil {
		return x, err
	}
	applied, err := migrations.Up(ctx, db, nil)
	db.Close()
	if err != nil {
		return x, err
	}
	for _, m := range applied {
		fmt.Fprintf(stdout, "applied migration %s\n", m.Name)
	}
	if opts.ExecutorURL != "" {
		return x, nil
	}
	if opts.ExecutorSecret == "" {
		// The built-in executor is the only one that has to know it, in this process: a fresh
		// random secret each run is as long as serve requires and guessable by no one.
		key := make([]byte, app.MinExecutorSecretLength)
		_, _ = rand.Read(key) // never fails (crypto/rand)
		opts.ExecutorSecret = hex.EncodeToString(key)
	}
	// The executor calls the API back, so it needs the API's real address (an OS-chosen port
	// with --listen 127.0.0.1:0) before the first dispatch, and the drainer may dispatch a job
	// an earlier run left queued as soon as app.Start begins claiming, before Start returns.
	// Binding the API's listener here gives the address first; app.Start serves on it.
	listen := opts.Listen
	if listen == "" {
		listen = app.DefaultListen
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", listen)
	if err != nil {
		return x, fmt.Errorf("listen on %s: %w", listen, err)
	}
	// The API URL is given even when starts are not confirmed: async jobs report through
	// /complete either way, and UnconfirmedStarts skips only /start.
	ex := simexec.New(simexec.Config{APIURL: "http://" + l.Addr().String(), Token: devToken.Token,
		UnconfirmedStarts: opts.UnconfirmedStarts, Secret: []byte(opts.ExecutorSecret), Audience: opts.ExecutorID, Log: opts.Log})
	stop, addr, err := serveHTTP(ctx, c.get("simexec-listen"), ex.Handler())
	if err != nil {
		l.Close()
		ex.Close()
		return x, err
	}
	*shutdown = append(*shutdown, func() { stop(); ex.Close() })
	opts.Listener = l
	opts.ExecutorURL = "http://" + addr + "/dispatch"
	x.statsURL = "http://" + addr + "/stats"
	return x, nil
}
