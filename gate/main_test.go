package gate_test

import (
	"testing"

	"github.com/sluicehq/sluice/integration/testmain"
)

// TestMain checks once that MariaDB answers, and that the tests leave no database or goroutine
// behind.
func TestMain(m *testing.M) { testmain.Run(m, testmain.MariaDB) }
