package drainer

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/sqldb"
	"github.com/sluicehq/sluice/gate/store"
)

// candidate is a queued job that a pass may claim.
type candidate struct {
	id       int64
	tenant   string
	rateKey  sql.NullString
	queuedAt time.Time
	version  int64
	unit     config.Unit // what it asks of the caps: its tenant, lanes and interactive flag
}

// candidateOf is h as a candidate.
func candidateOf(h store.Head) candidate {
	return candidate{id: h.ID, tenant: h.Tenant, rateKey: h.RateKey, queuedAt: h.QueuedAt, version: h.Version, unit: h.Unit()}
}

func (c candidate) before(o candidate) bool {
	if !c.queuedAt.Equal(o.queuedAt) {
		return c.queuedAt.Before(o.queuedAt)
	}
	return c.id < o.id
}

// claimed is a job this pass moved to dispatched, with what the dispatch needs.
type claimed struct {
	row    store.Row
	nonce  string
	wall   time.Duration
	budget int // the dispatch budget in force at the claim
}

// lockAndCount takes the claim lock of tx, reading the runtime configuration in force, and
// reads what is in flight, in the transaction's first round trip (store.LockClaims).
func lockAndCount(ctx context.Context, tx *store.ConnTx) (cfg config.Config, us config.Usage, err error) {
	cfg, us, _, err = lockCountAndProbe(ctx, tx, false)
	return cfg, us, err
}

// lockCountAndProbe is lockAndCount, and with probe the lone-job probe (store.ProbeQueue) in the
// same round trip, read under the claim lock.
func lockCountAndProbe(ctx context.Context, tx *store.ConnTx, probe bool) (cfg config.Config, us config.Usage, found []probedJob, err error) {
	l, err := store.LockClaims(ctx, tx, probe)
	if err != nil {
		return l.Config, l.Usage, nil, err
	}
	return l.Config, l.Usage, probedJobs(l.Lone), nil
}

// claimUpdate is a claim's UPDATE (store.ClaimParams), with the nonces it gives the chosen jobs
// and the claim and dispatch time it records.
type claimUpdate struct {
	params store.ClaimParams
	nonces []string
	stamp  time.Time
}

func (cl *claimer) claimUpdate(now time.Time, cfg config.Config, chosen []candidate) (claimUpdate, error) {
	nonces := make([]string, len(chosen))
	// A pass's clock reading may predate the admission of a job it found (the job committed
	// while the pass was reading candidates), so the recorded claim and dispatch times are never
	// earlier than the newest admission among the chosen: a dispatch never precedes its
	// admission. Lease and nonce expiry count from the pass's own reading, which only makes them
	// a little shorter.
	stamp := now
	for _, c := range chosen {
		if c.queuedAt.After(stamp) {
			stamp = c.queuedAt
		}
	}
	p := store.ClaimParams{DrainerID: cl.cfg.ID, Stamp: stamp, LeaseUntil: now.Add(cfg.Lease()),
		NonceExpiresAt: now.Add(cfg.NonceTTL()), Jobs: make([]store.ClaimJob, len(chosen))}
	if cl.cfg.UnconfirmedStarts {
		p.StartedAt = &stamp
	}
	for i, c := range chosen {
		n, err := newNonce()
		if err != nil {
			return claimUpdate{}, err
		}
		nonces[i] = n
		p.Jobs[i] = store.ClaimJob{ID: c.id, Version: c.version, Tenant: c.tenant, NonceSHA256: store.HashNonce(n)}
	}
	return claimUpdate{params: p, nonces: nonces, stamp: stamp}, nil
}

// claimed returns the chosen jobs the UPDATE got, as claimed, with their payloads.
func (u claimUpdate) claimed(chosen []candidate, got store.Claimed, cfg config.Config) []claimed {
	stamp := u.stamp
	out := make([]claimed, 0, len(chosen))
	for i, c := range chosen {
		if !got.Got[c.id] {
			continue
		}
		r := store.Row{}
		r.ID, r.Tenant, r.Version, r.Status, r.QueuedAt = c.id, c.tenant, c.version+1, job.Dispatched, c.queuedAt
		r.Lanes, r.Interactive = c.unit.Lanes, c.unit.Interactive
		p := got.Payloads[c.id]
		r.Payload, r.Attempt, r.DispatchFailures = p.Payload, p.Attempt, p.DispatchFailures
		if c.rateKey.Valid {
			k := c.rateKey.String
			r.RateKeySHA256 = &k
		}
		r.DispatchedAt = &stamp
		out = append(out, claimed{row: r, nonce: u.nonces[i], wall: cfg.Wall(), budget: cfg.DispatchAttempts})
	}
	return out
}

// claimAndCommit claims chosen and commits, in one round trip (store.Store.ClaimJobs), and returns
// the jobs it got as claimed, with their payloads. With written, the outcomes whose jobs the claim
// counted out of flight are being written beside it: the claim leaves its transaction open
// (store.Store.OpenClaim), waits for written, and commits only if they were (store.Store.CommitClaim),
// else rolls back.
func (cl *claimer) claimAndCommit(ctx context.Context, tx *store.ConnTx, now time.Time, cfg config.Config, chosen []candidate,
	written func() error) ([]claimed, error) {
	// The claim is stamped from a clock reading taken after its lock's round trip. An outcome
	// whose commit freed what this claim takes committed before that round trip's count, or is
	// one of written, which read its finish time (on the same clock, which never goes back) before
	// the claim's stamp, so no job is recorded as dispatched before the one it replaced finished.
	// The pass's own reading may be older than both.
	if t, err := cl.cfg.Clock.Now(ctx); err == nil && t.After(now) {
		now = t
	}
	u, err := cl.claimUpdate(now, cfg, chosen)
	if err != nil {
		if written != nil {
			err = errors.Join(err, written())
		}
		return nil, err
	}
	// A drainer told to stop (its ctx cancelled) while this round trip is under way lets it
	// finish: the driver answers a cancellation by dropping the connection, which would leave
	// the COMMIT's outcome unknown and the jobs, if it happened, to lease recovery. The caller
	// then hands them back (handBackIfStopping).
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimCommitTimeout)
	defer cancel()
	var got store.Claimed
	committing := written == nil // ClaimJobs's one round trip ends with the COMMIT
	if written == nil {
		got, err = cl.store.ClaimJobs(cctx, tx, u.params)
	} else {
		got, err = cl.store.OpenClaim(cctx, tx, u.params)
		if werr := written(); werr != nil {
			err = errors.Join(err, fmt.Errorf("the outcomes the claim counted out of flight: %w", werr))
		}
		if err == nil {
			committing = true
			err = cl.store.CommitClaim(cctx, tx, u.params)
		}
	}
	if err != nil {
		if committing && sqldb.ConnectionLost(err) {
			cl.handBackUnconfirmed(ctx, cfg, u.params)
		}
		return nil, err
	}
	cl.advanceLater(got.Behind)
	return u.claimed(chosen, got, cfg), nil
}

// newNonce mints the random nonce of one dispatch (SPEC §4, start confirmation).
func newNonce() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("mint nonce: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// claimCommitTimeout bounds the claim's last round trip once it no longer follows the
// drainer's context: its UPDATE may wait for row locks up to innodb_lock_wait_timeout (10 s).
const claimCommitTimeout = 15 * time.Second

// handBackIfStopping hands jobs this pass claimed back to the queue, unsent, when ctx was
// cancelled meanwhile (the drainer is stopping: SPEC §11, claimed jobs not yet sent go back to
// queued), and reports whether it did. The hand-back is fenced on the claim and does not follow
// the cancelled ctx; if the database refuses it, lease recovery takes the jobs later.
func (cl *claimer) handBackIfStopping(ctx context.Context, now time.Time, cs []claimed) bool {
	if ctx.Err() == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimCommitTimeout)
	defer cancel()
	items := make([]store.Finishing, len(cs))
	for i, c := range cs {
		items[i] = handedBack(c.row, "the drainer stopped before sending it")
	}
	err := inTx(ctx, cl.cfg.DB, func(tx *sql.Tx) error {
		_, err := cl.store.FinishMany(ctx, tx, now, items)
		return err
	})
	for _, c := range cs {
		cl.headCache.invalidate(c.row.Tenant)
	}
	if err != nil {
		cl.cfg.Log.Warn("could not hand back claimed jobs that were never sent; lease recovery will", "jobs", len(cs), "error", err)
	}
	return true
}

// handBackUnconfirmed hands back to the queue, unsent, the jobs of a claim whose COMMIT lost its
// connection. The claim may have committed, and its jobs would then stay dispatched under this
// drainer's id without being sent, holding their tenants' and the fleet's room until their leases
// expire: with a global cap of a few jobs, a drain stopped for a lease. On a fresh connection it
// locks the claim's jobs and requeues those that carry the claim's nonces, the proof that it
// committed (a job another drainer claimed since carries that claim's nonce). A new connection to
// a Galera node first waits for the node to apply what the cluster committed (store.Open), so a
// claim committed through the node a proxy has just left is seen. It tries again, backing off,
// while the database cannot be reached, until the drainer stops or the lease would have freed the
// jobs anyway; what it cannot hand back is left to lease recovery.
func (cl *claimer) handBackUnconfirmed(ctx context.Context, cfg config.Config, p store.ClaimParams) {
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.Lease())
	defer cancel()
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 50 * time.Millisecond
	bo.MaxInterval = time.Second
	bo.MaxElapsedTime = 0 // hctx bounds it
	n, err := backoff.RetryWithData(func() (int, error) {
		n, err := cl.requeueIfClaimed(hctx, p)
		if err != nil && ctx.Err() != nil {
			return n, backoff.Permanent(err) // stopping: one try, as handBackIfStopping
		}
		return n, err
	}, backoff.WithContext(bo, hctx))
	if err != nil {
		cl.cfg.Log.Warn("could not tell whether a claim whose commit lost its connection took its jobs; lease recovery will requeue any it did",
			"jobs", len(p.Jobs), "error", err)
		return
	}
	cl.cfg.Log.Info("a claim whose commit lost its connection had committed; its jobs are back in the queue, unsent",
		"jobs", n, "of", len(p.Jobs))
}

// requeueIfClaimed locks p's jobs and requeues those that carry p's nonces, in one transaction of
// two round trips, and returns how many it requeued. The requeue is stamped no earlier than the
// claim's dispatch.
func (cl *claimer) requeueIfClaimed(ctx context.Context, p store.ClaimParams) (int, error) {
	now, err := cl.cfg.Clock.Now(ctx)
	if err != nil {
		return 0, err
	}
	if now.Before(p.Stamp) {
		now = p.Stamp
	}
	ids := make([]int64, len(p.Jobs))
	nonces := make(map[int64][]byte, len(p.Jobs))
	for i, j := range p.Jobs {
		ids[i], nonces[j.ID] = j.ID, j.NonceSHA256
	}
	tx, err := store.BeginConnTx(ctx, cl.cfg.TxDB)
	if err != nil {
		return 0, fmt.Errorf("begin the hand-back: %w", err)
	}
	defer tx.Close()
	locked, err := store.LockJobs(ctx, tx, ids)
	if err != nil {
		return 0, err
	}
	var items []store.Finishing
	for _, r := range locked {
		if r.Status != job.Dispatched || !bytes.Equal(r.NonceSHA256, nonces[r.ID]) {
			continue
		}
		items = append(items, handedBack(r, "the claim's commit lost its connection; handed back unsent"))
	}
	if len(items) == 0 {
		return 0, nil
	}
	if _, err := cl.store.FinishManyCommit(ctx, tx, now, items); err != nil {
		return 0, fmt.Errorf("hand back %d job(s): %w", len(items), err)
	}
	return len(items), nil
}

// handedBack is the requeue of a claimed job r that was never sent, for the reason why: not
// counted against the dispatch budget, since no executor saw it.
func handedBack(r store.Row, why string) store.Finishing {
	return store.Finishing{Row: r, Outcome: store.Outcome{Status: job.Queued, ErrorCode: "dispatch_error", ErrorMessage: why}}
}

// inTx runs fn in a transaction of db, and commits it unless fn fails.
func inTx(ctx context.Context, db *sql.DB, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}
