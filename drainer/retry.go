package drainer

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/drainer/executor"
)

// recordRetrying records ans like record, retrying failed attempts (a database restart, a
// dropped connection) with backoff until ctx ends (startDispatch gives it 30 s). An outcome
// that is never recorded is left to lease recovery, which cannot know it and so marks a started
// job lost; retrying carries a job through a database outage shorter than its lease (10 s by
// default) to its real outcome. Retrying is safe: every attempt is fenced on the claimed
// version, so an attempt whose COMMIT did land makes the next one a no-op ("moved on").
func (d *Drainer) recordRetrying(ctx context.Context, c claimed, ans executor.Answer) error {
	gateRetry, gated := d.gateAnswer(ctx, c, ans)
	wait := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := d.record(ctx, c, ans, gateRetry, gated)
		if err == nil {
			if attempt > 1 {
				d.cfg.Log.Info("dispatch outcome recorded after retries", "job_id", c.row.ID, "attempts", attempt)
			}
			return nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}
