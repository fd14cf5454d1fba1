package drainer

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/gate/store"
)

// outcomesBeside is the transaction that writes the outcomes a pass brings (outcomeHandoff), on a
// connection of its own beside the claim's (claimer.claimCandidates): the server writes them while
// it runs the claim, rather than after it in one round trip. It locks their jobs in one round trip
// (lockOutcomes), then writes and commits them in another (write); each runs in a goroutine that
// the claim waits for (locked, wait), and close waits for both before it gives the connection back.
type outcomesBeside struct {
	tx      *store.ConnTx
	rows    []store.Row   // the jobs as locked, in id order
	lockErr error         // how the lock's round trip went
	lockEnd chan struct{} // closed once it is over

	wrote   chan error // the write's outcome, once it was started
	written error      // the write's outcome, once wait read it
	waited  bool
}

// lockOutcomes begins the outcomes' transaction and locks the jobs of outs (store.LockJobs: in id
// order, the lock order's first step), in a goroutine, so that its round trip runs beside the
// claim lock's.
func (cl *claimer) lockOutcomes(ctx context.Context, outs *outcomeBatch) *outcomesBeside {
	b := &outcomesBeside{lockEnd: make(chan struct{})}
	go func() {
		defer close(b.lockEnd)
		if b.tx, b.lockErr = store.BeginConnTx(ctx, cl.cfg.TxDB); b.lockErr == nil {
			b.rows, b.lockErr = store.LockJobs(ctx, b.tx, batchIDs(outs.reqs))
		}
	}()
	return b
}

// locked waits for the lock's round trip and returns the jobs it locked.
func (b *outcomesBeside) locked() ([]store.Row, error) {
	<-b.lockEnd
	return b.rows, b.lockErr
}

// write writes items, settled on the rows locked, and commits (outcomeWriter.finish), in a
// goroutine: wait returns how it went. Like the claim's last round trip, it does not follow ctx's
// cancellation, which would drop the connection and leave the COMMIT's outcome unknown.
func (b *outcomesBeside) write(ctx context.Context, w *outcomeWriter, now time.Time, items []store.Finishing) {
	b.wrote = make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimCommitTimeout)
		defer cancel()
		b.wrote <- w.finish(cctx, b.tx, now, items)
	}()
}

// wait returns how the write went, once it is over; it may be called again.
func (b *outcomesBeside) wait() error {
	if !b.waited {
		b.written, b.waited = <-b.wrote, true
	}
	return b.written
}

// close waits for what is under way and gives the connection back, rolling back what did not
// commit (the jobs' locks, when nothing was written).
func (b *outcomesBeside) close() {
	<-b.lockEnd
	if b.wrote != nil {
		b.wait()
	}
	if b.tx != nil {
		b.tx.Close()
	}
}
