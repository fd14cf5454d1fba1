package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/sluicehq/sluice/drainer/executor/simexec"
)

func simexecCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sluice simexec", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c, err := parseSettings(fs, args)
	if err != nil {
		return err
	}
	log, logQueue, err := newLogger(stderr, c.get("log-level"))
	if err != nil {
		return err
	}
	defer closeLog(logQueue)
	confirm, err := c.bool("executor-confirm-start")
	if err != nil {
		return err
	}
	// Without a token every /start would be refused (401) and every job fail, and an async job
	// could never report: better said once at start-up than in a log line per job. The token
	// is required with starts unconfirmed too, since any job may ask for async.
	apiURL, token := c.get("api-url"), c.get("executor-token")
	does := "confirms starts and reports async jobs"
	if !confirm {
		does = "reports async jobs"
	}
	switch {
	case apiURL == "":
		return fmt.Errorf("SLUICE_API_URL (--api-url) is required: the simulated executor %s through the API", does)
	case token == "":
		return fmt.Errorf("SLUICE_EXECUTOR_TOKEN (--executor-token) is required: the simulated executor %s through the API at %s with it (an executor or admin token)", does, apiURL)
	}
	cfg := simexec.Config{APIURL: apiURL, Token: token, UnconfirmedStarts: !confirm,
		Secret: []byte(c.get("executor-secret")), Audience: c.get("executor-id"), Log: log}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("SLUICE_API_URL (--api-url): %w", err)
	}
	ex := simexec.New(cfg)
	defer ex.Close()
	stop, addr, err := serveHTTP(ctx, c.get("simexec-listen"), ex.Handler())
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "simulated executor listening on http://%s (dispatch: POST /dispatch, stats: GET /stats)\n", addr)
	<-ctx.Done()
	stop()
	return nil
}
