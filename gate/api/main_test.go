package api_test

import (
	"testing"

	"github.com/sluicehq/sluice/integration/testmain"
)

// TestMain checks once that MariaDB and the shared memcached answer (the front door tests run
// over a database of their own, and some rate-limit or gate admissions through memcached), and
// that the tests leave no database or goroutine behind.
func TestMain(m *testing.M) { testmain.Run(m, testmain.MariaDB, testmain.Memcached) }
