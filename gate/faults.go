package gate

import (
	"context"
)

// Faults are deterministic fault-injection points for tests. A nil *Faults and nil fields do
// nothing; production code never sets them.
type Faults struct {
	// AfterReserve runs after the rate-limit reservation; an error aborts the admission there.
	AfterReserve func(ctx context.Context) error
	// AfterInsert runs after the job rows were inserted, before COMMIT.
	AfterInsert func(ctx context.Context) error
	// Commit replaces the COMMIT: it may commit or roll back and then report any error, which
	// is how a test makes a COMMIT's outcome unknown.
	Commit func(ctx context.Context, tx Tx) error
}
