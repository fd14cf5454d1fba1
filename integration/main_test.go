package integration_test

import (
	"testing"

	"github.com/sluicehq/sluice/integration/testmain"
)

// TestMain checks once that MariaDB and the shared memcached answer, and that the tests leave no
// database or goroutine behind.
func TestMain(m *testing.M) { testmain.Run(m, testmain.MariaDB, testmain.Memcached) }
