// Package wait is the one way tests wait: on a condition, with a deadline, never a sleep that
// hopes. It imports nothing of sluice, so the tests of any package may use it (integration/harness
// builds a whole process and re-exports it as harness.WaitFor).
package wait

import (
	"testing"
	"time"
)

// For polls cond every 5 ms until it returns true with no error, failing tb with what, and the
// last error, once timeout has passed.
func For(tb testing.TB, timeout time.Duration, what string, cond func() (bool, error)) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		ok, err := cond()
		if ok && err == nil {
			return
		}
		lastErr = err
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s waiting for %s (last error: %v)", timeout, what, lastErr)
		}
		<-tick.C
	}
}

// Until is For with a condition that cannot fail.
func Until(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	For(tb, timeout, what, func() (bool, error) { return cond(), nil })
}
