// Package testmain is the TestMain of every package whose tests use the shared local services
// (MariaDB, memcached): it checks once, before any test, that each service the package needs
// answers, and after the tests that they left no test database and no goroutine behind.
//
//	func TestMain(m *testing.M) { testmain.Run(m, testmain.MariaDB, testmain.Memcached) }
//
// A missing service then costs one line naming it and how to start it, instead of a failure per
// test. NATS is not a shared service: tests run their own embedded servers (natstest).
package testmain

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/integration/memcachedtest"
	"github.com/sluicehq/sluice/integration/testdb"
)

// Option is a Service or IgnoreGoroutines.
type Option interface{ apply(*settings) }

type settings struct {
	services []Service
	ignore   []goleak.Option
}

// Service is a shared service a package's tests need.
type Service int

func (s Service) apply(o *settings) { o.services = append(o.services, s) }

type ignoreTop string

func (f ignoreTop) apply(o *settings) {
	o.ignore = append(o.ignore, goleak.IgnoreTopFunction(string(f)))
}

// IgnoreGoroutines makes the leak check pass over goroutines whose top function is fn (as a
// stack prints it: "github.com/sluicehq/sluice/cmd/sluice.serve.func2"). Say why at the call.
func IgnoreGoroutines(fn string) Option { return ignoreTop(fn) }

// The shared services (deploy/local/setup.sh starts them).
const (
	// MariaDB at testdb.ServerDSN (SLUICE_TEST_MYSQL_DSN).
	MariaDB Service = iota + 1
	// Memcached at memcachedtest.SharedAddr (SLUICE_TEST_MEMCACHED_ADDR).
	Memcached
)

// probeTimeout bounds each probe: a local service answers in milliseconds.
const probeTimeout = 3 * time.Second

// Run probes the services among opts, runs the package's tests and exits: with 1 and one line per missing
// service if any is missing (no test runs), with 1 if the tests passed but left a database from
// testdb.New undropped or a goroutine running, else with the tests' code. It does not return.
func Run(m *testing.M, opts ...Option) {
	var o settings
	for _, opt := range opts {
		opt.apply(&o)
	}
	if err := Probe(o.services...); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ignore := append(o.ignore, goleak.IgnoreCurrent())
	code := m.Run()
	if leaked := testdb.Undropped(); len(leaked) > 0 {
		fmt.Fprintf(os.Stderr, "testmain: the tests left %d database(s) undropped: %s\n", len(leaked), strings.Join(leaked, ", "))
		code = 1
	}
	testdb.Close()
	if code == 0 {
		// Find retries for a while: goroutines of stopped servers and closed pools may still be
		// on their way out.
		if err := goleak.Find(ignore...); err != nil {
			fmt.Fprintf(os.Stderr, "testmain: the tests left goroutines running: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Probe checks that each service answers within a few seconds and returns an error naming each
// one that does not, one per line, with how to start it; nil if all answer.
func Probe(services ...Service) error {
	var missing []string
	for _, s := range services {
		var err error
		switch s {
		case MariaDB:
			err = probeMariaDB()
		case Memcached:
			err = probeMemcached()
		default:
			err = fmt.Errorf("testmain: unknown service %d", s)
		}
		if err != nil {
			missing = append(missing, err.Error())
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s", strings.Join(missing, "\n"))
	}
	return nil
}

const howToStart = "start the local services with `make services` (deploy/local/setup.sh)"

func probeMariaDB() error {
	cfg, err := mysql.ParseDSN(testdb.ServerDSN())
	if err != nil {
		return fmt.Errorf("testmain: MariaDB: SLUICE_TEST_MYSQL_DSN is not a valid DSN: %v", err)
	}
	cfg.Timeout = probeTimeout
	connector, err := mysql.NewConnector(cfg)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		defer cancel()
		var c interface{ Close() error }
		if c, err = connector.Connect(ctx); err == nil {
			c.Close()
			return nil
		}
	}
	return fmt.Errorf("testmain: MariaDB is not reachable at %s (SLUICE_TEST_MYSQL_DSN): %v; %s", cfg.Addr, err, howToStart)
}

func probeMemcached() error {
	addr := memcachedtest.SharedAddr()
	err := func() error {
		c, err := net.DialTimeout("tcp", addr, probeTimeout)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(probeTimeout))
		if _, err := c.Write([]byte("version\r\n")); err != nil {
			return err
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return err
		}
		if !strings.HasPrefix(line, "VERSION ") {
			return fmt.Errorf("answered %q to version, not a memcached", strings.TrimSpace(line))
		}
		return nil
	}()
	if err != nil {
		return fmt.Errorf("testmain: memcached is not reachable at %s (SLUICE_TEST_MEMCACHED_ADDR): %v; %s", addr, err, howToStart)
	}
	return nil
}
