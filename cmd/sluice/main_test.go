package main

import (
	"testing"

	"github.com/sluicehq/sluice/integration/testmain"
)

// TestMain checks once that MariaDB and the shared memcached answer (the command tests run a sluice
// on a test database; the gate command's test uses memcached), and that the tests leave no database
// or goroutine behind. serve's goroutine waiting for a second signal never ends (main.go): in
// the binary the process exits with it, but each serve a test runs leaves one.
func TestMain(m *testing.M) {
	testmain.Run(m, testmain.MariaDB, testmain.Memcached,
		testmain.IgnoreGoroutines("github.com/sluicehq/sluice/cmd/sluice.serve.func2"))
}
