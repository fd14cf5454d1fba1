package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/sqldb"
)

// ErrNotCancelable is returned by Cancel for a job that is in flight or terminal.
var ErrNotCancelable = errors.New("store: job is not cancelable")

// Cancel moves a queued job to canceled in tx. A job already canceled is returned as it is, with
// moved false: moved reports whether this call wrote the transition, for the caller to count once
// tx commits.
func (s *Store) Cancel(ctx context.Context, tx sqldb.DB, now time.Time, id int64) (r Row, moved bool, err error) {
	r, err = Get(ctx, tx, id, true)
	if err != nil {
		return r, false, err
	}
	switch r.Status {
	case job.Canceled:
		return r, false, nil
	case job.Queued:
	default:
		return r, false, ErrNotCancelable
	}
	if _, err := tx.ExecContext(ctx, `UPDATE jobs SET status = 'canceled', version = version + 1,
		finished_at = ? WHERE id = ? AND version = ? AND status = 'queued'`, now, id, r.Version); err != nil {
		return r, false, fmt.Errorf("cancel job %d: %w", id, err)
	}
	// The row is locked (Get above), so the UPDATE moved it.
	if err := s.insertAudit(ctx, tx, transitionEvent(s.actor(ctx), r, job.Canceled, r.Version+1, r.Attempt, "")); err != nil {
		return r, false, fmt.Errorf("cancel job %d: %w", id, err)
	}
	s.LogTransition(ctx, r, job.Canceled, r.Version+1, now, "")
	r.Status = job.Canceled
	r.Version++
	r.FinishedAt = &now
	return r, true, nil
}
