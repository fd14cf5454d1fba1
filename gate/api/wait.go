package api

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/gate/waiters"
)

// MaxWait bounds the wait a request may ask for (SPEC §6): under the listener's write timeout,
// and short enough that a proxy between a client and sluice keeps the connection open.
const MaxWait = 60 * time.Second

// waitParam returns the request's wait, the `wait` query parameter in seconds (a number from 0
// to 60; absent: 0).
func waitParam(r *http.Request) (time.Duration, error) {
	if r.URL.RawQuery == "" {
		return 0, nil
	}
	v := r.URL.Query().Get("wait")
	if v == "" {
		return 0, nil
	}
	return parseWait(v)
}

// parseWait parses a wait in seconds.
func parseWait(v string) (time.Duration, error) {
	secs, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(secs) || secs < 0 || secs > MaxWait.Seconds() {
		return 0, job.Invalid("wait", "wait must be a number of seconds from 0 to %d, got %q", int(MaxWait.Seconds()), v)
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// requestSlot is the slot of Config.MaxRequests a request holds. A request that starts to wait
// gives it back early: waiters are bounded by the waiter hub instead, so that a thousand
// waiting producers do not refuse every other request.
type requestSlot struct {
	once sync.Once
	sem  chan struct{}
}

func (s *requestSlot) release() { s.once.Do(func() { release(s.sem) }) }

// slotWriter carries a request's slot of Config.MaxRequests to its handler.
type slotWriter struct {
	http.ResponseWriter
	slot requestSlot
}

// Unwrap is for http.ResponseController (the events stream flushes through it).
func (w *slotWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// releaseRequestSlot gives back the slot of Config.MaxRequests the request answered through w
// holds, if it holds one.
func releaseRequestSlot(w http.ResponseWriter) {
	for {
		if sw, ok := w.(*slotWriter); ok {
			sw.slot.release()
			return
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return
		}
		w = u.Unwrap()
	}
}

// Waiters returns the server's waiter hub: its owner runs the hub's backstop (Run) and wakes it
// with the jobs' ends it hears of (Wake).
func (s *Server) Waiters() *waiters.Hub { return s.waiters }

// NewWaiters returns a waiter hub with cfg's bounds and period whose backstop reads the jobs'
// states from db (cfg.Read is set here).
func NewWaiters(db *sql.DB, cfg waiters.Config) (*waiters.Hub, error) {
	cfg.Read = func(ctx context.Context, ids []int64) (map[int64]waiters.State, error) {
		states, err := store.States(ctx, db, ids)
		if err != nil {
			return nil, err
		}
		out := make(map[int64]waiters.State, len(states))
		for id, st := range states {
			out[id] = waiters.State{Status: string(st.Status), Version: st.Version}
		}
		return out, nil
	}
	return waiters.New(cfg)
}

// awaitEnd returns job id once it is terminal, or as it is when d has passed. It registers as a
// waiter before it reads the job again, so an outcome committed since the caller's read wakes
// it; each wake costs one read of the job, never a poll.
func (s *Server) awaitEnd(ctx context.Context, w http.ResponseWriter, caller string, id int64, d time.Duration) (store.Row, error) {
	waiter, err := s.addWaiter(ctx, w, caller, id)
	if err != nil {
		return store.Row{}, err
	}
	defer waiter.Close()
	// The answer comes after the wait: past the listener's write timeout for a slow request.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d + followWriteWindow))
	timer := time.NewTimer(d)
	defer timer.Stop()
	// A wake reads the row alone; the queue position, a count over the tenant's queue, is read
	// once, for the answer of a job still queued when the wait ends.
	answer := func(row store.Row) (store.Row, error) {
		var err error
		row.Job, err = store.WithPosition(ctx, s.cfg.DB, row.Job)
		return row, gate.AsUnavailable(err)
	}
	for {
		row, err := store.Get(ctx, s.cfg.DB, id, false)
		if err != nil || row.Status.Terminal() {
			return row, gate.AsUnavailable(err)
		}
		waiter.Saw(waiters.State{Status: string(row.Status), Version: row.Version})
		select {
		case <-waiter.C():
		case <-timer.C:
			return answer(row)
		case <-s.waiters.Stopping():
			return answer(row)
		case <-ctx.Done():
			return row, nil // the client left: nothing will read the answer, nor is it an error of ours
		}
	}
}

// addWaiter registers caller as a waiter on job id for the request answered through w, which
// then gives back what only its reading needed: its slot of Config.MaxRequests (the hub bounds
// waiters instead) and its body's charge to the memory budget (a waiting admission is done with
// its body). Past the hub's bounds it is 503 busy.
func (s *Server) addWaiter(ctx context.Context, w http.ResponseWriter, caller string, id int64) (*waiters.Waiter, error) {
	waiter, err := s.waiters.Add(caller, id)
	if errors.Is(err, waiters.ErrBusy) {
		return nil, busy("too many requests waiting for jobs; retry shortly")
	}
	if err != nil {
		return nil, err
	}
	releaseRequestSlot(w)
	holdOf(ctx).release()
	return waiter, nil
}

func (s *Server) getJob(w http.ResponseWriter, r *http.Request) {
	wait, err := waitParam(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	row, err := s.visible(r)
	if err == nil && wait > 0 && !row.Status.Terminal() {
		row, err = s.awaitEnd(r.Context(), w, callerOf(r).Name, row.ID, wait)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if row.Status == job.Queued && r.Context().Err() == nil {
		// Why it waits is an answer's extra: a read that fails leaves it out, not the job. A
		// caller gone during its wait gets nothing read for it.
		if err := s.cfg.Admitter.Explain(r.Context(), &row.Job); err != nil {
			s.cfg.Log.Warn("a queued job's waiting_on could not be read", "job_id", row.ID, "error", err)
		}
	}
	writeJob(w, http.StatusOK, row.Job)
}

// admissionWait returns an admission's wait: the `wait` query parameter, else a `wait` field
// of the body (which is not part of the job, so not of the idempotency fingerprint).
func admissionWait(r *http.Request, body []byte) (time.Duration, error) {
	if r.URL.RawQuery != "" && r.URL.Query().Has("wait") {
		return waitParam(r)
	}
	if !bytes.Contains(body, []byte(`"wait"`)) {
		return 0, nil
	}
	var f struct {
		Wait *json.Number `json:"wait"`
	}
	if err := json.Unmarshal(body, &f); err != nil {
		return 0, job.Invalid("wait", "wait must be a number of seconds from 0 to %d", int(MaxWait.Seconds()))
	}
	if f.Wait == nil {
		return 0, nil // "wait" is inside the payload or another field
	}
	return parseWait(f.Wait.String())
}
