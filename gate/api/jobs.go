package api

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/sqldb"
	"github.com/sluicehq/sluice/gate/store"
)

// maxBatchBody bounds a batch request body: 1,000 jobs of typical size fit many times over,
// and a body this size still decodes in well under a second.
const maxBatchBody = 32 << 20

// readRaw reads at most limit bytes of r's body; more is payload_too_large. The body is charged
// to the memory budget before it is read (Config.MemoryBudget): a spent budget is 503 busy.
func readRaw(r *http.Request, limit int) ([]byte, error) {
	if r.ContentLength > int64(limit) {
		// Refused unread: reading a body already declared too large, up to its limit, costs as
		// much as admitting it.
		return nil, tooLarge(limit)
	}
	hold := holdOf(r.Context())
	var body io.Reader = io.LimitReader(r.Body, int64(limit)+1)
	// Sized once from Content-Length when the client sent one (at most limit+1, a body that
	// claims more is still read only that far), rather than grown by doubling: a 32 MiB batch
	// then costs one 32 MiB buffer instead of the garbage of every smaller one.
	var buf bytes.Buffer
	if n := r.ContentLength; n > 0 {
		size := min(n, int64(limit)+1)
		if err := hold.take(bodyCost(size)); err != nil {
			return nil, err
		}
		buf.Grow(int(size) + bytes.MinRead) // ReadFrom wants MinRead free to not grow
	} else if n < 0 {
		body = &heldReader{r: body, h: hold}
	}
	_, err := buf.ReadFrom(body)
	data := buf.Bytes()
	var busy *job.Error
	if errors.As(err, &busy) {
		return nil, busy
	}
	if err != nil {
		return nil, job.Invalid("body", "could not read the request body: %v", err)
	}
	if len(data) > limit {
		return nil, tooLarge(limit)
	}
	return data, nil
}

func tooLarge(limit int) error {
	return &job.Error{Code: job.CodePayloadTooLarge, Message: "the request body is too large",
		Detail: map[string]any{"limit_bytes": limit}}
}

// setCapacityHeaders writes the SPEC §5 and §5a admission headers (none when the rollout mode
// is off): the capacity verdict's, and the queue position of a queued job.
func setCapacityHeaders(w http.ResponseWriter, res gate.Result) {
	if res.Decision == "" {
		return
	}
	setVerdictHeaders(w.Header(), string(res.Decision), res.Verdict)
	if res.Job.Position != nil && res.Job.Status == job.Queued {
		w.Header().Set("Sluice-Queue-Position", strconv.FormatInt(*res.Job.Position, 10))
	}
}

func (s *Server) admit(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	cfg := s.cfg.Limits.Current().Config
	data, err := readRaw(r, cfg.MaxPayloadBytes+bodyOverhead)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	req, err := gate.DecodeRequest(data)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	wait, err := admissionWait(r, data)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	req.Aware = capacityAware(r)
	res, err := s.cfg.Admitter.Admit(r.Context(), c.Name, req, c.MayActFor)
	setCapacityHeaders(w, res)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	status := http.StatusAccepted
	if wait > 0 && !res.Job.Status.Terminal() {
		// The job is admitted whatever the wait meets: a wait refused (busy) or cut short (the
		// database gone) answers with the admission, never with an error a producer would retry.
		if row, err := s.awaitEnd(r.Context(), w, c.Name, res.Job.ID, wait); err == nil {
			res.Job = row.Job
		}
	}
	if wait > 0 && res.Job.Status.Terminal() {
		status = http.StatusOK
	}
	writeCreated(w, res, status)
}

// writeCreated answers with the job an admission or redrive created (status), or with 200 and
// Idempotent-Replayed when it returned one that already existed.
func writeCreated(w http.ResponseWriter, res gate.Result, status int) {
	w.Header().Set("Location", "/v1/jobs/"+strconv.FormatInt(res.Job.ID, 10))
	if res.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
		status = http.StatusOK
	}
	writeJob(w, status, res.Job)
}

// BatchItem is one result of POST /v1/jobs:batch.
type BatchItem = job.BatchItem

func (s *Server) admitBatch(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	// Taken before the body is read: a batch refused as busy has cost nothing.
	if !s.acquire(w, r, s.batches, "too many batches in progress; retry shortly") {
		return
	}
	defer release(s.batches)
	data, err := readRaw(r, maxBatchBody)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	reqs, decodeErrs, err := decodeBatch(data)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	aware := capacityAware(r)
	for i := range reqs {
		reqs[i].Aware = aware
	}
	results, err := s.cfg.Admitter.AdmitBatch(r.Context(), c.Name, reqs, c.MayActFor, decodeErrs)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]BatchItem, len(results))
	for i, res := range results {
		it := BatchItem{Decision: string(res.Decision)}
		switch {
		case res.Err != nil:
			it.Status, it.Error = s.errorBody(r, res.Err)
		case res.Replayed:
			j := res.Job
			it.Status, it.Replayed, it.Job = http.StatusOK, true, &j
		default:
			j := res.Job
			it.Status, it.Job = http.StatusAccepted, &j
		}
		out[i] = it
	}
	writeBatch(w, out)
}

// decodeBatch decodes a batch body: an error for the envelope (the whole request is refused),
// else one request per item and, in order, each item's own decoding error or nil.
func decodeBatch(data []byte) ([]gate.Request, []error, error) {
	var body struct {
		Jobs []json.RawMessage `json:"jobs"`
	}
	if err := json.Unmarshal(data, &body); err != nil {
		return nil, nil, gate.DecodeError(err)
	}
	switch {
	case body.Jobs == nil:
		return nil, nil, job.Invalid("jobs", "jobs is required: an array of admissions")
	case len(body.Jobs) == 0:
		return nil, nil, job.Invalid("jobs", "jobs is empty")
	case len(body.Jobs) > gate.MaxBatch:
		return nil, nil, job.Invalid("jobs", "a batch holds at most %d jobs, got %d", gate.MaxBatch, len(body.Jobs))
	}
	reqs := make([]gate.Request, len(body.Jobs))
	errs := make([]error, len(body.Jobs))
	for i, raw := range body.Jobs {
		reqs[i], errs[i] = gate.DecodeRequest(raw)
		body.Jobs[i] = nil // decoded: its bytes may go while the rest are decoded
	}
	return reqs, errs, nil
}

// nextCursor is a listing's next_cursor for the next page's id bound: null when next is 0, the
// last page.
func nextCursor(next int64) *string {
	if next <= 0 {
		return nil
	}
	c := encodeCursor(next)
	return &c
}

// encodeCursor and decodeCursor make the list cursor opaque: clients pass it back unchanged.
func encodeCursor(id int64) string {
	return encodeOpaque("before", strconv.FormatInt(id, 10))
}

func decodeCursor(s string) (int64, error) {
	if v, ok := decodeOpaque("before", s); ok {
		if id, err := strconv.ParseInt(v, 10, 64); err == nil && id > 0 {
			return id, nil
		}
	}
	return 0, badCursor()
}

// encodeOpaque makes the cursor "kind:value" opaque; decodeOpaque returns the value of a
// cursor of that kind. Every paginated endpoint builds its cursors with them.
func encodeOpaque(kind, value string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(kind + ":" + value))
}

func decodeOpaque(kind, s string) (string, bool) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return "", false
	}
	return strings.CutPrefix(string(raw), kind+":")
}

func badCursor() error { return job.Invalid("cursor", "cursor is not one this API returned") }

// listLimit reads a listing's limit parameter: def when it is absent, else a whole number from
// 1 to most.
func listLimit(q url.Values, def, most int) (int, error) {
	v := q.Get("limit")
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > most {
		return 0, job.Invalid("limit", "limit must be a whole number from 1 to %d", most)
	}
	return n, nil
}

// idPage reads the paging of a listing newest first by id (GET /v1/jobs, GET /v1/audit): its
// limit, and the id its cursor says the page starts before (0: the first page).
func idPage(q url.Values) (limit int, before int64, err error) {
	if limit, err = listLimit(q, gate.DefaultListLimit, gate.MaxListLimit); err != nil {
		return 0, 0, err
	}
	if v := q.Get("cursor"); v != "" {
		if before, err = decodeCursor(v); err != nil {
			return 0, 0, err
		}
	}
	return limit, before, nil
}

var listStatuses = append([]job.Status{job.Queued, job.Claimed, job.Dispatched, job.Running}, job.TerminalStates()...)

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	q := r.URL.Query()
	f := gate.ListFilter{Limit: gate.DefaultListLimit}
	if t := q.Get("tenant"); q.Has("tenant") {
		if err := job.ValidTenant("tenant", t); err != nil {
			s.fail(w, r, err)
			return
		}
		if !c.MayActFor(t) {
			s.fail(w, r, job.Errorf(job.CodeForbidden, "this token may not read that tenant's jobs"))
			return
		}
		f.Tenants = []string{t}
	} else if c.Role == Producer && !slices.Contains(c.Tenants, "*") {
		f.Tenants = c.Tenants
	}
	if v := q.Get("status"); v != "" {
		if !slices.Contains(listStatuses, job.Status(v)) {
			s.fail(w, r, job.Invalid("status", "status must be one of %v", listStatuses))
			return
		}
		f.Status = job.Status(v)
	}
	var err error
	if f.Limit, f.Before, err = idPage(q); err != nil {
		s.fail(w, r, err)
		return
	}
	// The page is charged to the memory budget before it is read: its rows' estimate now, its
	// results and error messages once the listing knows their size.
	hold := holdOf(r.Context())
	if err := hold.take(pageCost(f.Limit, 0)); err != nil {
		s.fail(w, r, err)
		return
	}
	f.Reserve = func(variable int) error { return hold.take(pageCost(0, variable)) }
	jobs, next, err := s.cfg.Admitter.List(r.Context(), f)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"jobs": jobs, "next_cursor": nextCursor(next)})
}

func (s *Server) redrive(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	res, err := s.cfg.Admitter.Redrive(r.Context(), callerOf(r).Name, id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeCreated(w, res, http.StatusCreated)
}

// visible reads job id for the caller: a producer asking for another tenant's job gets the same
// not_found as for a missing id.
func (s *Server) visible(r *http.Request) (store.Row, error) {
	id, err := pathID(r)
	if err != nil {
		return store.Row{}, err
	}
	row, err := s.cfg.Admitter.Get(r.Context(), id)
	if err != nil {
		return row, err
	}
	c := callerOf(r)
	if c.Role != Executor && !c.MayActFor(row.Tenant) {
		return row, store.ErrNotFound
	}
	return row, nil
}

func (s *Server) cancel(w http.ResponseWriter, r *http.Request) {
	if _, err := s.visible(r); err != nil {
		s.fail(w, r, err)
		return
	}
	id, _ := pathID(r)
	var row store.Row
	var moved bool
	var now time.Time
	err := s.inTx(r.Context(), func(tx *sql.Tx) (err error) {
		if now, err = s.cfg.Clock.Now(r.Context()); err != nil {
			return err
		}
		row, moved, err = s.store.Cancel(r.Context(), tx, now, id)
		return err
	})
	if err == nil && moved {
		s.store.Metrics.Finished(job.Canceled, nil, now)
	}
	if err == store.ErrNotCancelable {
		s.fail(w, r, &job.Error{Code: job.CodeNotCancelable, Message: "only a queued job can be canceled",
			Detail: map[string]any{"status": row.Status}})
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJob(w, http.StatusOK, row.Job)
}

type startRequest struct {
	Nonce string `json:"nonce"`
	// StartID names the executor's start attempt: a retry of the same attempt repeats it and is
	// answered 200 again; any other confirmation of a started dispatch is nonce_used.
	StartID string `json:"start_id"`
}

// maxStartID bounds start_id: a random name needs far less.
const maxStartID = 128

func (s *Server) start(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	data, err := readBody(r, bodyOverhead)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var req startRequest
	if err := decode(data, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Nonce == "" {
		s.fail(w, r, job.Invalid("nonce", "nonce is required"))
		return
	}
	if len(req.StartID) > maxStartID {
		s.fail(w, r, job.Invalid("start_id", "start_id is at most %d bytes", maxStartID))
		return
	}
	st := &store.Start{ID: id, Nonce: req.Nonce, StartID: req.StartID, Actor: store.ActorOf(r.Context())}
	err = s.starts.Do(r.Context(), st)
	if err == nil && st.Locked {
		// Another transaction holds the job's row (the drainer recording an outcome, say): wait
		// for it here, outside the shared transactions, which never wait.
		st.Locked = false
		err = s.confirmStarts(r.Context(), []*store.Start{st}, true)
	}
	if err == nil {
		err = st.Err
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJob(w, http.StatusOK, st.Row.Job)
}

// startGroupSize bounds the start confirmations one shared transaction carries, and startLanes
// how many such transactions run at once. One lane: a group never waits for a lock, so it
// cannot stall the others, and a second lane is no faster while it halves the groups.
const startGroupSize, startLanes = 64, 1

// confirmStarts decides starts in one transaction of two round trips
// (store.ConfirmStartsCommit); s.starts runs groups of concurrent confirmations through it,
// none waiting for another transaction's lock.
func (s *Server) confirmStarts(ctx context.Context, starts []*store.Start, wait bool) error {
	now, err := s.cfg.Clock.Now(ctx)
	if err != nil {
		return gate.AsUnavailable(err)
	}
	err = s.store.ConfirmStartsCommit(ctx, s.cfg.TxDB, now, starts, !wait)
	if errors.Is(err, store.ErrInCommitTrip) && sqldb.ConnectionLost(err) {
		// A start is safe to repeat with its start_id.
		return outcomeUnknown(err)
	}
	return gate.AsUnavailable(err)
}

type completeRequest struct {
	Nonce        string          `json:"nonce"`
	Status       string          `json:"status"`
	ErrorCode    string          `json:"error_code"`
	ErrorMessage string          `json:"error_message"`
	Result       json.RawMessage `json:"result"`
	Gate         *struct {
		RetryAfter *int `json:"retry_after"`
	} `json:"gate"`
}

func (s *Server) complete(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	data, err := readBody(r, s.cfg.Limits.Current().Config.MaxPayloadBytes+bodyOverhead)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var req completeRequest
	if err := decode(data, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	switch {
	case req.Nonce == "":
		s.fail(w, r, job.Invalid("nonce", "nonce is required"))
		return
	case req.Status != "succeeded" && req.Status != "failed" && req.Status != "not_started":
		s.fail(w, r, job.Invalid("status", "status must be succeeded, failed or not_started"))
		return
	case !store.ValidErrorCode(req.ErrorCode):
		s.fail(w, r, job.Invalid("error_code", "error_code is at most %d bytes of printable ASCII", store.MaxErrorCode))
		return
	case len(req.ErrorMessage) > store.MaxErrorMessage:
		s.fail(w, r, job.Invalid("error_message", "error_message is at most %d bytes", store.MaxErrorMessage))
		return
	}
	if req.Gate != nil {
		if err := validRetryAfter("gate.retry_after", req.Gate.RetryAfter); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	var row store.Row
	var moved bool
	var now time.Time
	err = s.inTx(r.Context(), func(tx *sql.Tx) (err error) {
		if now, err = s.cfg.Clock.Now(r.Context()); err != nil {
			return err
		}
		row, moved, err = s.store.Complete(r.Context(), tx, now, id, store.Completion{
			Nonce: req.Nonce, Status: req.Status, ErrorCode: req.ErrorCode,
			ErrorMessage: req.ErrorMessage, Result: req.Result})
		return err
	})
	if err == nil && moved {
		// A not_started outcome requeues the job, which Finished does not count.
		s.store.Metrics.Finished(row.Status, row.DispatchedAt, now)
	}
	if req.Gate != nil {
		s.gateFromCompletion(r.Context(), row, req.Nonce, *req.Gate.RetryAfter)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJob(w, http.StatusOK, row.Job)
}
