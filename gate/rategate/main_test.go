package rategate_test

import (
	"testing"

	"github.com/sluicehq/sluice/integration/testmain"
)

// TestMain checks once that the shared memcached answers, and that the tests leave no goroutine
// behind.
func TestMain(m *testing.M) { testmain.Run(m, testmain.Memcached) }
