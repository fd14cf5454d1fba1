package store

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/sqldb"
)

// FinishManyConn is FinishManyCommit without the COMMIT, so that the tests can see a fence fail
// before anything is committed (ErrFenced) and roll back, as for FinishMany.
func (s *Store) FinishManyConn(ctx context.Context, tx *ConnTx, now time.Time, items []Finishing) ([]job.Status, error) {
	return s.finishConn(ctx, tx, now, items, false)
}

// ScanExpired is ScanExpiredWithSlots without the slots.
func ScanExpired(ctx context.Context, db sqldb.DB, p ScanExpiredParams) ([]Row, error) {
	expired, _, err := ScanExpiredWithSlots(ctx, db, p, 0)
	return expired, err
}

// FirstQueuedSince lets the external tests (package store_test) reach firstQueuedSince. They
// are external because they use integration/testdb, which opens its pools with Open.
var FirstQueuedSince = firstQueuedSince
var RecountSQL = recountSQL

// AuditAdmittedRangesSQL lets the external tests check the admitted events' statement.
var AuditAdmittedRangesSQL = auditAdmittedRangesSQL

// ClaimCountSQL lets the external tests read the plan of a claim's count of its tenants.
var ClaimCountSQL = claimCountSQL

// ClaimUpdateSQL lets the external tests read the plan of a claim's UPDATE.
var ClaimUpdateSQL = claimUpdateSQL
