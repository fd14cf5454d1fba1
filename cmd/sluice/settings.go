package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/cmd/sluice/app"
	"github.com/sluicehq/sluice/publisher"
)

// setting is one static setting (SPEC §9): a flag, a SLUICE_* environment variable and a key of
// the config file, in that order of precedence.
type setting struct {
	flag, env, def, usage string
}

var settings = []setting{
	{"mysql-dsn", "SLUICE_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/sluice", "MySQL/MariaDB DSN (sluice adds the parameters it needs)"},
	{"nats-url", "SLUICE_NATS_URL", "", "NATS URL (default nats://127.0.0.1:4222; sluice dev: an embedded server)"},
	{"nats-core", "SLUICE_NATS_CORE", "false", "publish with core NATS, without JetStream"},
	{"nats-creds", "SLUICE_NATS_CREDS", "", "NATS credentials file (user JWT and nkey seed)"},
	{"nats-nkey", "SLUICE_NATS_NKEY", "", "NATS nkey seed file (instead of a credentials file)"},
	{"nats-ca", "SLUICE_NATS_CA", "", "CA file that signed the NATS server's TLS certificate"},
	{"metrics-listen", "SLUICE_METRICS_LISTEN", "", "serve /metrics on this address instead of the API listener"},
	{"metrics-token", "SLUICE_METRICS_TOKEN", "", "bearer token a /metrics scrape must carry (default: open)"},
	{"metrics-tenant-labels", "SLUICE_METRICS_TENANT_LABELS", "true", "tenant names as metric labels (the 20 deepest)"},
	{"memcached", "SLUICE_MEMCACHED", "127.0.0.1:11211", "memcached servers, comma-separated"},
	{"listen", "SLUICE_LISTEN", "127.0.0.1:7480", "API listen address"},
	{"cors-origins", "SLUICE_CORS_ORIGINS", "", "browser origins allowed to call the API, comma-separated"},
	{"executor-url", "SLUICE_EXECUTOR_URL", "", "executor dispatch URL"},
	{"executor-secret", "SLUICE_EXECUTOR_SECRET", "", "secret that signs dispatches"},
	{"executor-confirm-start", "SLUICE_EXECUTOR_CONFIRM_START", "true", "the executor confirms starts with POST /v1/jobs/{id}/start"},
	{"executor-id", "SLUICE_EXECUTOR_ID", "", "the executor's id, named as the audience of every dispatch (the executor refuses others)"},
	{"tokens", "SLUICE_TOKENS", "", "API tokens as inline JSON"},
	{"tokens-file", "SLUICE_TOKENS_FILE", "", "file holding the API tokens JSON"},
	{"drainer-id", "SLUICE_DRAINER_ID", "", "drainer id (default hostname-pid)"},
	{"subject-prefix", "SLUICE_SUBJECT_PREFIX", "sluice", "NATS subject prefix"},
	{"grace", "SLUICE_SHUTDOWN_GRACE", "30s", "how long a stopping process waits for in-flight dispatches"},
	{"log-level", "SLUICE_LOG_LEVEL", "info", "debug, info, warn or error"},
	{"simexec-listen", "SLUICE_SIMEXEC_LISTEN", "127.0.0.1:7481", "simulated executor listen address"},
	{"api-url", "SLUICE_API_URL", "http://127.0.0.1:7480", "sluice API URL (for the simulated executor)"},
	{"executor-token", "SLUICE_EXECUTOR_TOKEN", "", "the simulated executor's API token"},

	// Transport security: HTTPS for the listeners, TLS to MySQL/MariaDB (tls.go).
	{"tls-cert", "SLUICE_TLS_CERT", "", "PEM certificate (chain) for HTTPS on the API and metrics listeners, with --tls-key; reloaded on SIGHUP and when the files change"},
	{"tls-key", "SLUICE_TLS_KEY", "", "PEM private key of --tls-cert"},
	{"mysql-ca", "SLUICE_MYSQL_CA", "", "CA file that signed the MySQL/MariaDB server's certificate: connect over TLS and verify it"},
	{"mysql-cert", "SLUICE_MYSQL_CERT", "", "PEM client certificate for MySQL/MariaDB over TLS, with --mysql-key"},
	{"mysql-key", "SLUICE_MYSQL_KEY", "", "PEM private key of --mysql-cert"},

	// --- Listener and memory bounds, parsed by boundsOptions (bounds.go). ---
	{"max-conns", "SLUICE_MAX_CONNS", "1024", "connections open at once on the API listener (0: no bound)"},
	{"max-conns-per-source", "SLUICE_MAX_CONNS_PER_SOURCE", "64", "connections open at once from one address outside SLUICE_EXECUTOR_SOURCES (an IPv6 /64 counts as one; 0: no bound)"},
	{"reserved-conns", "SLUICE_RESERVED_CONNS", "128", "connections of SLUICE_MAX_CONNS only SLUICE_EXECUTOR_SOURCES may take (unset: 128, or an eighth of a smaller SLUICE_MAX_CONNS; 0: none)"},
	{"executor-sources", "SLUICE_EXECUTOR_SOURCES", "127.0.0.0/8,::1/128", "addresses (CIDR, comma-separated) the executors call /start and /complete from, or none"},
	{"memory-budget", "SLUICE_MEMORY_BUDGET", "256MiB", "bytes API request bodies and pages of jobs in progress may hold together; past it 503 busy (KiB, MiB, GiB; 0: no budget)"},
}

// settingValues holds resolved settings by flag name.
type settingValues struct {
	values map[string]string
	set    map[string]bool // given explicitly (flag, environment or file)
}

// parseSettings registers every setting as a flag on fs (plus --config), parses args, and
// resolves each value: flag, else environment, else config file, else default. An environment
// variable or file line that is set but empty counts as unset: `SLUICE_MYSQL_DSN=` left in a
// unit file or exported by a template means "no value here", and taking it literally would hide
// the config file and the default behind an empty DSN or listen address. A flag given empty
// is typed on purpose and stays explicit.
func parseSettings(fs *flag.FlagSet, args []string) (*settingValues, error) {
	flags := map[string]*string{}
	for _, s := range settings {
		flags[s.flag] = fs.String(s.flag, "", s.usage+" ("+s.env+", default "+strconv.Quote(s.def)+")")
	}
	file := fs.String("config", os.Getenv("SLUICE_CONFIG"), "config file of SLUICE_*=value lines (SLUICE_CONFIG)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	fileValues := map[string]string{}
	if *file != "" {
		var err error
		if fileValues, err = readConfigFile(*file); err != nil {
			return nil, err
		}
	}
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	c := &settingValues{values: map[string]string{}, set: map[string]bool{}}
	for _, s := range settings {
		switch v := os.Getenv(s.env); {
		case explicit[s.flag]:
			c.values[s.flag], c.set[s.flag] = *flags[s.flag], true
		case v != "":
			c.values[s.flag], c.set[s.flag] = v, true
		case fileValues[s.env] != "":
			c.values[s.flag], c.set[s.flag] = fileValues[s.env], true
		default:
			c.values[s.flag] = s.def
		}
	}
	return c, nil
}

func (c *settingValues) get(name string) string { return c.values[name] }

func (c *settingValues) bool(name string) (bool, error) {
	v, err := strconv.ParseBool(c.values[name])
	if err != nil {
		return false, fmt.Errorf("%s: want true or false, got %q", name, c.values[name])
	}
	return v, nil
}

// readConfigFile reads KEY=VALUE lines (the systemd EnvironmentFile format): blank lines and
// lines starting with # are ignored, values may be quoted.
func readConfigFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("config file %s:%d: want KEY=value", path, n)
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' && v[len(v)-1] == '"' || v[0] == '\'' && v[len(v)-1] == '\'') {
			v = v[1 : len(v)-1]
		}
		out[strings.TrimSpace(k)] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	return out, nil
}

// natsAuth returns the NATS credentials the settings name.
func (c settingValues) natsAuth() publisher.NATSAuth {
	return publisher.NATSAuth{CredsFile: c.get("nats-creds"), NKeyFile: c.get("nats-nkey"), CAFile: c.get("nats-ca")}
}

// connectNATS connects an operator's command to the broker the settings name, with their
// credentials, failing fast: a command is not a long-running process.
func (c settingValues) connectNATS(name string) (*nats.Conn, error) {
	url := c.get("nats-url")
	if url == "" {
		url = nats.DefaultURL
	}
	auth, err := c.natsAuth().Options()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(url, append(auth, nats.Name(name), nats.Timeout(5*time.Second), nats.ReconnectBufSize(-1))...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", app.RedactURL(url), app.RedactError(err, url))
	}
	return nc, nil
}
