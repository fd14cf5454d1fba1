// Package gate is sluice's front door and policy: admission (validation, idempotent replay,
// depth caps, immediate-or-refuse), reading and cancelling jobs, and the executor-facing start
// and completion calls. Its HTTP face is gate/api; the runtime limits it enforces are in
// gate/limits.
package gate

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sluicehq/sluice/drainer/store"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/limits"
	"github.com/sluicehq/sluice/outbox"
)

// Config configures an Admitter.
type Config struct {
	// DB is the sluice database. Required.
	DB *sql.DB
	// Limits supplies the runtime configuration. Required.
	Limits *limits.Cache
	// Prefix is the NATS subject prefix. Default "sluice".
	Prefix string
	// Log receives warnings and job transitions. Default: discard.
	Log *slog.Logger
	// Published, if set, is called after every commit with the outbox rows it wrote: the fast
	// path that publishes them at once. It must not block.
	Published func([]outbox.Row)
	// TxAttempts bounds retries of a transaction that hit a deadlock or lock wait timeout.
	// Default 3.
	TxAttempts int
	// Metrics, if set, counts admissions and depth cap refusals.
	Metrics *Metrics
}

// Admitter admits jobs. Safe for concurrent use.
type Admitter struct {
	cfg   Config
	store *store.Store
}

// New returns an Admitter, or an "invalid config" error naming the field.
func New(cfg Config) (*Admitter, error) {
	if cfg.DB == nil {
		return nil, errors.New("invalid config: DB: required")
	}
	if cfg.Limits == nil {
		return nil, errors.New("invalid config: Limits: required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = outbox.DefaultPrefix
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.TxAttempts <= 0 {
		cfg.TxAttempts = 3
	}
	return &Admitter{cfg: cfg, store: &store.Store{Prefix: cfg.Prefix, Log: cfg.Log}}, nil
}

// Store returns the job store the Admitter writes transitions through.
func (a *Admitter) Store() *store.Store { return a.store }

// Decision is the admission decision of SPEC §5 (the Sluice-Capacity-Decision header); empty
// when the rollout mode is off.
type Decision string

// The decisions of SPEC §5.
const (
	Admitted      Decision = "admitted"
	ShadowRefused Decision = "shadow-refused"
	Refused       Decision = "refused"
)

// Result is an admission's outcome.
type Result struct {
	Job      job.Job
	Replayed bool
	Decision Decision
	// Limit and InFlight describe the tenant's in-flight cap at admission, for the headers.
	Limit    int
	InFlight int
}

// Admit admits req for caller. It returns a Result, or a *job.Error: invalid_request,
// payload_too_large, forbidden, idempotency_conflict, queue_full (with a rejected row's id),
// capacity_exceeded, unavailable or outcome_unknown. Nothing is written for a refusal except a
// queue_full's rejected row.
func (a *Admitter) Admit(ctx context.Context, caller string, req Request) (Result, error) {
	res, err := a.admit(ctx, caller, req)
	a.cfg.Metrics.observe(res, err)
	return res, err
}

func (a *Admitter) admit(ctx context.Context, caller string, req Request) (Result, error) {
	cfg := a.cfg.Limits.Current().Config
	if err := req.Validate(cfg.MaxPayloadBytes); err != nil {
		return Result{}, err
	}
	var res Result
	var rows []outbox.Row
	var err error
	for attempt := 1; ; attempt++ {
		res, rows, err = a.admitTx(ctx, caller, &req, cfg)
		if err == nil || !retryable(err) || attempt >= a.cfg.TxAttempts {
			break
		}
	}
	if err != nil {
		return res, err
	}
	if len(rows) > 0 && a.cfg.Published != nil {
		a.cfg.Published(rows)
	}
	return res, nil
}

type counts struct {
	now            time.Time
	tenantDepth    int
	globalDepth    int
	tenantInFlight int
}

func (a *Admitter) admitTx(ctx context.Context, caller string, req *Request, cfg limits.Config) (res Result, rows []outbox.Row, err error) {
	tx, err := a.cfg.DB.BeginTx(ctx, nil)
	if err != nil {
		return res, nil, unavailable(err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	// Locking the tenant's row serialises this tenant's admissions, which makes its depth cap
	// and idempotent replay exact; other tenants are not blocked.
	if _, err := tx.ExecContext(ctx, `INSERT INTO tenants (tenant, created_at) VALUES (?, UTC_TIMESTAMP(6))
		ON DUPLICATE KEY UPDATE tenant = tenant`, req.Tenant); err != nil {
		return res, nil, a.txErr(err)
	}
	if req.IdempotencyKey != nil {
		existing, err := a.findKeyed(ctx, tx, req.Tenant, *req.IdempotencyKey)
		if err != nil {
			return res, nil, a.txErr(err)
		}
		if existing != nil {
			return a.replay(ctx, tx, caller, req, *existing)
		}
	}
	c, err := a.count(ctx, tx, req.Tenant, cfg)
	if err != nil {
		return res, nil, a.txErr(err)
	}
	res.Limit = cfg.TenantCap(req.Tenant)
	res.InFlight = c.tenantInFlight
	scope := ""
	switch {
	case cfg.AdmissionMode == limits.ModeOff:
	case c.tenantDepth >= cfg.TenantQueueDepth:
		scope = "tenant"
	case c.globalDepth >= cfg.GlobalQueueDepth:
		scope = "global"
	}
	switch {
	case cfg.AdmissionMode == limits.ModeOff:
	case scope != "" && cfg.AdmissionMode == limits.ModeEnforce:
		res.Decision = Refused
		return a.reject(ctx, tx, &committed, caller, req, c, scope)
	case scope != "":
		res.Decision = ShadowRefused
		a.cfg.Log.Warn("depth cap would refuse admission (shadow mode)", "tenant", req.Tenant, "scope", scope)
	default:
		res.Decision = Admitted
	}
	if req.Queue != nil && !*req.Queue && cfg.AdmissionMode != limits.ModeOff {
		if err := immediate(cfg, req.Tenant, c); err != nil {
			if cfg.AdmissionMode == limits.ModeEnforce {
				return res, nil, err
			}
			res.Decision = ShadowRefused
		}
	}
	var rateKey any
	if req.RateKey != nil {
		rateKey = RateKeyHash(*req.RateKey)
	}
	var idem any
	if req.IdempotencyKey != nil {
		idem = *req.IdempotencyKey
	}
	var payload any
	if len(req.Payload) > 0 {
		payload = []byte(req.Payload)
	}
	r, err := tx.ExecContext(ctx, `INSERT INTO jobs (tenant, rate_key_sha256, payload, status, caller,
		idempotency_key, request_sha256, queued_at) VALUES (?, ?, ?, 'queued', ?, ?, ?, ?)`,
		req.Tenant, rateKey, payload, caller, idem, req.fingerprint(), c.now)
	if err != nil {
		return res, nil, a.txErr(err)
	}
	id, err := r.LastInsertId()
	if err != nil {
		return res, nil, a.txErr(err)
	}
	msg := outbox.PokeMessage(a.cfg.Prefix, outbox.Enqueue, req.Tenant, id)
	ids, err := outbox.Write(ctx, tx, c.now, msg)
	if err != nil {
		return res, nil, a.txErr(err)
	}
	if err := tx.Commit(); err != nil {
		committed = true // the transaction is over either way
		return res, nil, a.commitErr(ctx, err, req, id)
	}
	committed = true
	pos := int64(c.tenantDepth + 1)
	res.Job = job.Job{ID: id, Tenant: req.Tenant, Status: job.Queued, QueuedAt: c.now, Position: &pos}
	if rateKey != nil {
		h := rateKey.(string)
		res.Job.RateKeySHA256 = &h
	}
	a.store.LogTransition(ctx, store.Row{Job: job.Job{ID: id, Tenant: req.Tenant, QueuedAt: c.now, Status: "admitted"}}, job.Queued, 0, c.now, "")
	return res, []outbox.Row{{ID: ids[0], Subject: msg.Subject, Payload: msg.Payload, CreatedAt: c.now}}, nil
}

// count reads, under the tenant's lock, the database clock and the depths and in-flight count
// admission decides on. Depth counts stop at the cap, so their cost is bounded by it.
func (a *Admitter) count(ctx context.Context, tx *sql.Tx, tenant string, cfg limits.Config) (counts, error) {
	var c counts
	err := tx.QueryRowContext(ctx, `SELECT UTC_TIMESTAMP(6),
		(SELECT COUNT(*) FROM (SELECT 1 FROM jobs WHERE status = 'queued' AND tenant = ? LIMIT ?) d),
		(SELECT COUNT(*) FROM (SELECT 1 FROM jobs WHERE status = 'queued' LIMIT ?) g),
		(SELECT COUNT(*) FROM jobs WHERE status IN ('claimed','dispatched','running') AND tenant = ?)`,
		tenant, cfg.TenantQueueDepth+1, cfg.GlobalQueueDepth+1, tenant).
		Scan(&c.now, &c.tenantDepth, &c.globalDepth, &c.tenantInFlight)
	if err != nil {
		return c, fmt.Errorf("read admission counts: %w", err)
	}
	c.now = c.now.UTC()
	return c, nil
}

// immediate decides a queue=false admission (SPEC §5): admitted only if the job could be
// claimed now.
func immediate(cfg limits.Config, tenant string, c counts) error {
	tenantCap := cfg.TenantCap(tenant)
	refuse := func(scope string, retryAfter int, paused bool) error {
		return &job.Error{Code: job.CodeCapacityExceeded, Message: "no capacity to start the job now",
			Detail: map[string]any{"scope": scope, "retry_after": retryAfter, "paused": paused}}
	}
	switch {
	case tenantCap == 0:
		return refuse("tenant", 120, true)
	case cfg.GlobalInFlight == 0:
		return refuse("global", 120, true)
	case c.tenantDepth > 0 || c.tenantInFlight >= tenantCap:
		return refuse("tenant", min(30, 5*(c.tenantDepth+1)), false)
	}
	return nil
}

func (a *Admitter) reject(ctx context.Context, tx *sql.Tx, committed *bool, caller string, req *Request, c counts, scope string) (Result, []outbox.Row, error) {
	var rateKey any
	if req.RateKey != nil {
		rateKey = RateKeyHash(*req.RateKey)
	}
	// A rejected row does not consume the idempotency key: the caller may retry with it.
	r, err := tx.ExecContext(ctx, `INSERT INTO jobs (tenant, rate_key_sha256, status, caller, queued_at,
		finished_at, error_code, error_message) VALUES (?, ?, 'rejected', ?, ?, ?, 'queue_full', ?)`,
		req.Tenant, rateKey, caller, c.now, c.now, "queue full ("+scope+" depth cap)")
	if err != nil {
		return Result{}, nil, a.txErr(err)
	}
	id, err := r.LastInsertId()
	if err != nil {
		return Result{}, nil, a.txErr(err)
	}
	if err := tx.Commit(); err != nil {
		*committed = true
		return Result{}, nil, a.txErr(err)
	}
	*committed = true
	a.cfg.Log.Warn("depth cap refused admission", "tenant", req.Tenant, "scope", scope, "job_id", id)
	return Result{Decision: Refused}, nil, &job.Error{Code: job.CodeQueueFull,
		Message: "the " + scope + " queue is full",
		Detail:  map[string]any{"scope": scope, "id": id, "retry_after": 30}}
}

func (a *Admitter) findKeyed(ctx context.Context, tx *sql.Tx, tenant, key string) (*store.Row, error) {
	r, err := store.ScanRow(tx.QueryRowContext(ctx, "SELECT "+store.Columns+
		" FROM jobs WHERE tenant = ? AND idempotency_key = ?", tenant, key))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read idempotency key: %w", err)
	}
	return &r, nil
}

func (a *Admitter) replay(ctx context.Context, tx *sql.Tx, caller string, req *Request, r store.Row) (Result, []outbox.Row, error) {
	if r.Caller != caller {
		return Result{}, nil, job.Errorf(job.CodeForbidden, "the idempotency key belongs to another caller")
	}
	if !bytes.Equal(r.RequestSHA256, req.fingerprint()) {
		return Result{}, nil, &job.Error{Code: job.CodeIdempotencyConflict,
			Message: "the idempotency key was used with a different request",
			Detail:  map[string]any{"id": r.ID}}
	}
	j, err := a.withPosition(ctx, tx, r.Job)
	if err != nil {
		return Result{}, nil, a.txErr(err)
	}
	return Result{Job: j, Replayed: true}, nil, nil
}

func (a *Admitter) withPosition(ctx context.Context, db store.DB, j job.Job) (job.Job, error) {
	if j.Status != job.Queued {
		return j, nil
	}
	p, err := store.Position(ctx, db, j.Tenant, j.QueuedAt, j.ID)
	if err != nil {
		return j, err
	}
	j.Position = &p
	return j, nil
}

// txErr turns a database failure inside an admission transaction into the API's error: the
// database unreachable or the connection lost before COMMIT is "unavailable, retryable"
// (nothing was written); anything else stays an internal error for the log.
func (a *Admitter) txErr(err error) error {
	var je *job.Error
	if errors.As(err, &je) {
		return err
	}
	if connectionLost(err) {
		return unavailable(err)
	}
	return err
}

// commitErr classifies a failed COMMIT. If the connection broke during COMMIT its outcome is
// unknown: an unkeyed request must not be retried blindly (it may create a duplicate); a keyed
// one may, since its replay returns the one job that exists.
func (a *Admitter) commitErr(ctx context.Context, err error, req *Request, id int64) error {
	if !connectionLost(err) {
		return fmt.Errorf("commit admission: %w", err)
	}
	a.cfg.Log.Warn("admission commit outcome unknown", "tenant", req.Tenant, "job_id", id, "error", err)
	return &job.Error{Code: job.CodeOutcomeUnknown, Err: err,
		Message: "the database connection broke during commit; the job may or may not exist",
		Detail:  map[string]any{"retryable": req.IdempotencyKey != nil}}
}

func unavailable(err error) error {
	return &job.Error{Code: job.CodeUnavailable, Err: err, Message: "the database is unavailable; nothing was written",
		Detail: map[string]any{"retryable": true}}
}

// Get returns job id with its position when queued, or store.ErrNotFound.
func (a *Admitter) Get(ctx context.Context, id int64) (store.Row, error) {
	r, err := store.Get(ctx, a.cfg.DB, id, false)
	if err != nil {
		if connectionLost(err) {
			return r, unavailable(err)
		}
		return r, err
	}
	r.Job, err = a.withPosition(ctx, a.cfg.DB, r.Job)
	return r, err
}
