package integration_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/drainer"
	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/drainertest"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/testdb"
)

// start confirms job id's start with nonce, as the start attempt named startID ("" for none).
func (e *harnessEnv) start(t *testing.T, id int64, nonce, startID string) harness.Response {
	t.Helper()
	body := map[string]any{"nonce": nonce}
	if startID != "" {
		body["start_id"] = startID
	}
	return e.Do(t, http.MethodPost, "/v1/jobs/"+strconv.FormatInt(id, 10)+"/start", harness.ExecutorToken, body)
}

type harnessEnv struct{ *harness.Env }

func wantCode(t *testing.T, what string, r harness.Response, status int, code string) {
	t.Helper()
	got, _ := r.Body["error_code"].(string)
	if r.Status != status || got != code {
		t.Errorf("%s: HTTP %d %q, want %d %q (%s)", what, r.Status, got, status, code, r.Raw)
	}
}

// TestStartConfirmation drives the start-confirmation protocol of SPEC §4 through the API with
// drainers run one pass at a time on an injected clock: a repeated /start while running is 200,
// a nonce of a finished dispatch is nonce_used, an expired one nonce_expired, and a dispatch
// voided by recovery is dispatch_void while the job runs once elsewhere.
func TestStartConfirmation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Each case has a sluice of its own, so no case's leftovers are recovered by another's drainer.
	newEnv := func(t *testing.T) *harnessEnv {
		return &harnessEnv{harness.Start(t, harness.Options{API: true, Relay: true})}
	}

	t.Run("repeat and used", func(t *testing.T) {
		t.Parallel()
		env := newEnv(t)
		fake := clock.NewFake(time.Now())
		s := drainertest.NewHeld()
		d := drainertest.NewDrainer(t, drainer.Config{DB: env.DB.DB, Executor: s, Clock: fake, ID: "d-used"}, 100*time.Millisecond)
		id := env.Admit(t, "used", nil)
		if _, err := d.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		disp := s.Next(t)
		if disp.JobID != id || disp.Attempt != 1 {
			t.Fatalf("dispatched %+v, want job %d attempt 1", disp, id)
		}
		if r := env.start(t, id, disp.Nonce, "attempt-1"); r.Status != 200 || r.Body["status"] != "running" {
			t.Fatalf("first /start: HTTP %d %s", r.Status, r.Raw)
		}
		if r := env.start(t, id, disp.Nonce, "attempt-1"); r.Status != 200 {
			t.Errorf("the same start attempt repeated while running: HTTP %d %s, want 200", r.Status, r.Raw)
		}
		// The dispatch replayed elsewhere: another start attempt, or one without a name.
		wantCode(t, "another start attempt while running", env.start(t, id, disp.Nonce, "attempt-2"), 409, "nonce_used")
		wantCode(t, "an unnamed start attempt while running", env.start(t, id, disp.Nonce, ""), 409, "nonce_used")
		wantCode(t, "foreign nonce while running", env.start(t, id, "not-the-nonce", "attempt-1"), 409, "nonce_invalid")
		s.Replies <- executor.Answer{Kind: executor.Done, Status: "succeeded"}
		harness.WaitFor(t, 10*time.Second, "the job to succeed", func() (bool, error) {
			return drainertest.ReadJob(t, env.DB.DB, id).Status == "succeeded", nil
		})
		wantCode(t, "/start after the dispatch finished", env.start(t, id, disp.Nonce, "attempt-1"), 409, "nonce_used")
	})

	t.Run("row held elsewhere", func(t *testing.T) {
		// Confirmations share transactions that never wait for a lock: one whose job another
		// transaction holds waits on its own, and the others' starts go on meanwhile.
		t.Parallel()
		env := newEnv(t)
		s := drainertest.NewHeld()
		d := drainertest.NewDrainer(t, drainer.Config{DB: env.DB.DB, Executor: s, Clock: clock.NewFake(time.Now()), ID: "d-held"}, 100*time.Millisecond)
		held, free := env.Admit(t, "held", nil), env.Admit(t, "free", nil)
		if p, err := d.RunOnce(ctx); err != nil || p.Claimed != 2 {
			t.Fatalf("pass %+v (%v), want both jobs claimed", p, err)
		}
		disps := map[int64]executor.Dispatch{}
		for range 2 {
			disp := s.Next(t).Dispatch
			disps[disp.JobID] = disp
		}
		hold, err := env.DB.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = hold.Rollback() }()
		var v int64
		if err := hold.QueryRowContext(ctx, "SELECT version FROM jobs WHERE id = ? FOR UPDATE", held).Scan(&v); err != nil {
			t.Fatal(err)
		}
		waited := make(chan int, 1)
		go func() {
			body := strings.NewReader(`{"nonce":"` + disps[held].Nonce + `","start_id":"a1"}`)
			req, _ := http.NewRequest(http.MethodPost, env.URL+"/v1/jobs/"+strconv.FormatInt(held, 10)+"/start", body)
			req.Header.Set("Authorization", "Bearer "+harness.ExecutorToken)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				waited <- 0
				return
			}
			res.Body.Close()
			waited <- res.StatusCode
		}()
		harness.WaitFor(t, 10*time.Second, "the held job's start to wait for its row", func() (bool, error) {
			select {
			case got := <-waited:
				return false, fmt.Errorf("the start answered HTTP %d without waiting", got)
			default:
			}
			// The read that waits for the row, not the shared transactions' that skips it. (A lock
			// wait in the optimizer's read of a constant row is not always in INNODB_LOCK_WAITS.)
			var n int
			err := env.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.PROCESSLIST
				WHERE DB = DATABASE() AND INFO LIKE 'SELECT % FROM jobs WHERE id IN (%) ORDER BY id FOR UPDATE'`).Scan(&n)
			return n == 1, err
		})
		if r := env.start(t, free, disps[free].Nonce, "a2"); r.Status != 200 {
			t.Fatalf("another job's start while one waits for its row: HTTP %d %s", r.Status, r.Raw)
		}
		if err := hold.Rollback(); err != nil {
			t.Fatal(err)
		}
		if got := <-waited; got != 200 {
			t.Fatalf("the held job's start once its row was free: HTTP %d, want 200", got)
		}
		if st := drainertest.ReadJob(t, env.DB.DB, held).Status; st != "running" {
			t.Errorf("the held job is %s, want running", st)
		}
		s.Replies <- executor.Answer{Kind: executor.Done, Status: "succeeded"}
		s.Replies <- executor.Answer{Kind: executor.Done, Status: "succeeded"}
	})

	t.Run("expired", func(t *testing.T) {
		t.Parallel()
		env := newEnv(t)
		// The drainer's clock is 301 s behind the database's, so the nonce it mints has already
		// expired by the time the API (on the database clock) judges the confirmation.
		fake := clock.NewFake(time.Now().Add(-301 * time.Second))
		s := drainertest.NewHeld()
		d := drainertest.NewDrainer(t, drainer.Config{DB: env.DB.DB, Executor: s, Clock: fake, ID: "d-expired"}, 100*time.Millisecond)
		id := env.Admit(t, "expired", nil)
		if _, err := d.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		disp := s.Next(t)
		wantCode(t, "/start with an expired nonce", env.start(t, id, disp.Nonce, "attempt-1"), 409, "nonce_expired")
		if st := drainertest.ReadJob(t, env.DB.DB, id).Status; st != "dispatched" {
			t.Errorf("job is %s after a refused start, want dispatched", st)
		}
	})

	t.Run("voided by recovery", func(t *testing.T) {
		t.Parallel()
		env := newEnv(t)
		fake := clock.NewFake(time.Now())
		first := drainertest.NewHeld()
		d1 := drainertest.NewDrainer(t, drainer.Config{DB: env.DB.DB, Executor: first, Clock: fake, ID: "d-first"}, 100*time.Millisecond)
		id := env.Admit(t, "voided", nil)
		if _, err := d1.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		old := first.Next(t)
		// d1 stops renewing (it runs no more passes); past its lease another drainer recovers
		// the job and dispatches it again in the same pass.
		fake.Advance(11 * time.Second)
		second := drainertest.NewHeld()
		d2 := drainertest.NewDrainer(t, drainer.Config{DB: env.DB.DB, Executor: second, Clock: fake, ID: "d-second"}, 100*time.Millisecond)
		p, err := d2.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if p.Recovered != 1 || p.Claimed != 1 {
			t.Fatalf("rescuing pass %+v, want 1 recovered and 1 claimed", p)
		}
		redo := second.Next(t)
		if redo.JobID != id || redo.Attempt != 2 || redo.Version <= old.Version || redo.Nonce == old.Nonce {
			t.Fatalf("redispatch %+v after %+v: want the same job, attempt 2, a higher version, a new nonce", redo, old)
		}
		wantCode(t, "/start with the voided nonce", env.start(t, id, old.Nonce, "attempt-1"), 409, "dispatch_void")
		if r := env.start(t, id, redo.Nonce, "attempt-1"); r.Status != 200 {
			t.Fatalf("/start with the current nonce: HTTP %d %s", r.Status, r.Raw)
		}
		second.Replies <- executor.Answer{Kind: executor.Done, Status: "succeeded"}
		harness.WaitFor(t, 10*time.Second, "the job to succeed", func() (bool, error) {
			return drainertest.ReadJob(t, env.DB.DB, id).Status == "succeeded", nil
		})
		// The first drainer's dispatch now ends as unknown; its fenced write must change nothing.
		stopCtx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		d1.Stop(stopCtx)
		cancel()
		if j := drainertest.ReadJob(t, env.DB.DB, id); j.Status != "succeeded" {
			t.Errorf("after the first drainer gave up, the job is %s, want succeeded", j.Status)
		}
	})
}

// answerInTurn queues one job for a drainer (cfg with its DB, Executor, Clock and Observer filled
// in) whose executor gives answers in turn, one a pass, and calls check after each is recorded,
// with the fake clock's time when the pass began. Between answers the clock moves a minute, past
// any not-before the answer set.
func answerInTurn(t *testing.T, cfg drainer.Config, answers []executor.Answer,
	check func(i int, db *testdb.DB, id int64, passAt time.Time)) {
	t.Helper()
	ctx := context.Background()
	db := testdb.New(t)
	clk := clock.NewFake(time.Now())
	recorded := make(chan int64, len(answers))
	cfg.DB, cfg.Clock, cfg.Observer = db.DB, clk, drainer.ObserverFuncs{OnRecorded: func(id int64) { recorded <- id }}
	cfg.Executor = &drainertest.Executor{Answer: func(_ context.Context, n int, _ executor.Dispatch) executor.Answer { return answers[n-1] }}
	d := drainertest.NewDrainer(t, cfg, 10*time.Second)
	t0, _ := clk.Now(ctx)
	id := drainertest.QueueOneJob(t, db, t0)
	for i := range answers {
		passAt, _ := clk.Now(ctx)
		if p, err := d.RunOnce(ctx); err != nil || p.Claimed != 1 {
			t.Fatalf("pass %d: %+v, %v; want one claim", i+1, p, err)
		}
		drainertest.AwaitRecorded(t, recorded, 1)
		check(i, db, id, passAt)
		clk.Advance(time.Minute)
	}
}

// TestUnconfirmedRefusalsRequeue proves that with starts not confirmed
// (SLUICE_EXECUTOR_CONFIRM_START=false) a 429 or a 503 still puts the job back in the queue
// (SPEC §8: queued again if the start was never confirmed; §5: a 429 never fails a job), while
// an answer that says nothing still makes it lost, since nothing proves it did not start.
func TestUnconfirmedRefusalsRequeue(t *testing.T) {
	t.Parallel()
	answers := []executor.Answer{
		{Kind: executor.RateLimited, HTTPStatus: 429, RetryAfter: 5},
		{Kind: executor.Refused, HTTPStatus: 503, RetryAfter: 5},
		{Kind: executor.Unknown, Err: context.DeadlineExceeded},
	}
	wants := []struct{ status, code string }{
		{"queued", "rate_limited"}, {"queued", "executor_refused"}, {"lost", "outcome_unknown"},
	}
	answerInTurn(t, drainer.Config{ID: "unconfirmed", UnconfirmedStarts: true}, answers, func(i int, db *testdb.DB, id int64, _ time.Time) {
		var status, code string
		if err := db.QueryRow("SELECT status, error_code FROM jobs WHERE id = ?", id).Scan(&status, &code); err != nil {
			t.Fatal(err)
		}
		if want := wants[i]; status != want.status || code != want.code {
			t.Fatalf("after answer %d (%+v): %s/%s, want %s/%s", i+1, answers[i], status, code, want.status, want.code)
		}
	})
}

// TestRefusalBackoffDoublesPerRefusal: a 503 without Retry-After holds the job back 1 s, doubling
// with each refusal (SPEC §8), counted in the job's refusals: a job claimed again after a 429 or
// a dispatch error has not been refused more often, so its first 503 still waits 1 s.
func TestRefusalBackoffDoublesPerRefusal(t *testing.T) {
	t.Parallel()
	answers := []executor.Answer{
		{Kind: executor.RateLimited, HTTPStatus: 429, RetryAfter: 1},
		{Kind: executor.Unknown, Err: context.DeadlineExceeded},
		{Kind: executor.Refused, HTTPStatus: 503},
		{Kind: executor.Refused, HTTPStatus: 503},
		{Kind: executor.Refused, HTTPStatus: 503},
	}
	// The wait after each answer: the 429's own (its key could not be gated), none after the
	// dispatch error, then 1, 2 and 4 s for the three refusals.
	waits := []time.Duration{6 * time.Second, 0, time.Second, 2 * time.Second, 4 * time.Second}
	answerInTurn(t, drainer.Config{ID: "refused"}, answers, func(i int, db *testdb.DB, id int64, passAt time.Time) {
		var status string
		var notBefore sql.NullTime
		var refusals int
		if err := db.QueryRow("SELECT status, not_before, refusals FROM jobs WHERE id = ?", id).
			Scan(&status, &notBefore, &refusals); err != nil {
			t.Fatal(err)
		}
		var wait time.Duration
		if notBefore.Valid {
			wait = notBefore.Time.Sub(passAt)
		}
		if status != "queued" || wait != waits[i] || refusals != max(0, i-1) {
			t.Fatalf("after answer %d (%+v): %s, held back %s with %d refusals; want queued, %s, %d",
				i+1, answers[i], status, wait, refusals, waits[i], max(0, i-1))
		}
	})
}

// TestExecutorErrorFieldsStored proves that an executor's error fields cannot make its outcome
// unstorable (SPEC §12 invariants 1 and 8). A dispatch answer whose error_code does not fit the
// column (too long, not ASCII) and whose error_message is longer than the column is still
// recorded as failed: the code becomes executor_error, kept in the message, and the message is
// cut at a character boundary. The same fields sent to /complete get a 400 naming the field and
// change nothing.
func TestExecutorErrorFieldsStored(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{API: true})
	long := strings.Repeat("x", 65534) + "é and more" // the cut falls inside the é
	stub, _ := byTenant(map[string]executor.Answer{
		"noisy": {Kind: executor.Done, HTTPStatus: 200, Status: "failed", ErrorCode: "délai_" + strings.Repeat("z", 80), ErrorMessage: long},
		"later": {Kind: executor.Accepted, HTTPStatus: 202},
	})
	recorded := make(chan int64, 4)
	d := drainertest.NewDrainer(t, drainer.Config{DB: env.DB.DB, Executor: stub, ID: "noisy",
		Observer: drainer.ObserverFuncs{OnRecorded: func(id int64) { recorded <- id }}}, 10*time.Second)
	ctx := context.Background()
	noisy := env.Admit(t, "noisy", nil)
	later := env.Admit(t, "later", nil)
	if p, err := d.RunOnce(ctx); err != nil || p.Claimed != 2 {
		t.Fatalf("pass: %+v, %v; want 2 claimed", p, err)
	}
	drainertest.AwaitRecorded(t, recorded, 2)
	var status, code, msg string
	if err := env.DB.QueryRowContext(ctx, "SELECT status, error_code, error_message FROM jobs WHERE id = ?", noisy).Scan(&status, &code, &msg); err != nil {
		t.Fatal(err)
	}
	if status != "failed" || code != "executor_error" || !strings.HasPrefix(msg, `error_code "délai_zzz`) ||
		len(msg) > 65535 || !utf8.ValidString(msg) {
		t.Errorf("noisy answer stored as %s/%s with a %d-byte message starting %.40q, want failed/executor_error, the code kept, at most 65535 valid bytes",
			status, code, len(msg), msg)
	}

	nonce := stub.Sent(later)[0].Nonce
	path := "/v1/jobs/" + strconv.FormatInt(later, 10) + "/complete"
	for _, bad := range []struct {
		field string
		body  map[string]any
	}{
		{"error_code", map[string]any{"nonce": nonce, "status": "failed", "error_code": "délai"}},
		{"error_code", map[string]any{"nonce": nonce, "status": "failed", "error_code": strings.Repeat("z", 65)}},
		{"error_message", map[string]any{"nonce": nonce, "status": "failed", "error_message": strings.Repeat("m", 65536)}},
	} {
		if r := env.Do(t, http.MethodPost, path, harness.ExecutorToken, bad.body); r.Status != http.StatusBadRequest || r.Body["field"] != bad.field {
			t.Errorf("/complete with a bad %s: HTTP %d %.200s, want 400 naming it", bad.field, r.Status, r.Raw)
		}
	}
	if err := env.DB.QueryRowContext(ctx, "SELECT status FROM jobs WHERE id = ?", later).Scan(&status); err != nil || status != "dispatched" {
		t.Errorf("refused completions left the job %s (%v), want dispatched", status, err)
	}
	r := env.Do(t, http.MethodPost, path, harness.ExecutorToken, map[string]any{"nonce": nonce, "status": "failed",
		"error_code": "upstream_timeout", "error_message": strings.Repeat("m", 65535)})
	if r.Status != http.StatusOK || r.Body["status"] != "failed" {
		t.Errorf("/complete with fields at their bounds: HTTP %d %.200s", r.Status, r.Raw)
	}
}

// notStartedEnv is a sluice whose jobs of tenant "later" are dispatched, by a drainer the test
// drives one pass at a time, to an executor that answers 202: they stay dispatched until the
// test reports their outcome through /complete.
type notStartedEnv struct {
	*harnessEnv
	stub     *drainertest.Executor
	d        *drainer.Drainer
	recorded chan int64
}

func newNotStartedEnv(t *testing.T) *notStartedEnv {
	t.Helper()
	e := &notStartedEnv{harnessEnv: &harnessEnv{harness.Start(t, harness.Options{API: true})},
		recorded: make(chan int64, 16)}
	e.stub, _ = byTenant(map[string]executor.Answer{
		"later": {Kind: executor.Accepted, HTTPStatus: 202},
	})
	e.d = drainertest.NewDrainer(t, drainer.Config{DB: e.DB.DB, Executor: e.stub, ID: "not-started",
		Observer: drainer.ObserverFuncs{OnRecorded: func(id int64) { e.recorded <- id }}}, 10*time.Second)
	return e
}

// dispatch runs one drainer pass that must send job id, and returns the nonce it was sent.
func (e *notStartedEnv) dispatch(t *testing.T, id int64) string {
	t.Helper()
	n := len(e.stub.Sent(id))
	if p, err := e.d.RunOnce(context.Background()); err != nil || p.Claimed != 1 {
		t.Fatalf("pass: %+v, %v; want job %d claimed", p, err, id)
	}
	select {
	case got := <-e.recorded:
		if got != id {
			t.Fatalf("the drainer recorded an answer for job %d, want %d", got, id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the executor's 202 was not recorded")
	}
	sent := e.stub.Sent(id)
	if len(sent) != n+1 {
		t.Fatalf("job %d sent %d times, want %d", id, len(sent), n+1)
	}
	return sent[n].Nonce
}

func (e *notStartedEnv) complete(t *testing.T, id int64, nonce, status string) harness.Response {
	t.Helper()
	return e.Do(t, http.MethodPost, "/v1/jobs/"+strconv.FormatInt(id, 10)+"/complete", harness.ExecutorToken,
		map[string]any{"nonce": nonce, "status": status})
}

func (e *notStartedEnv) position(t *testing.T, id int64) any {
	t.Helper()
	r := e.Do(t, http.MethodGet, "/v1/jobs/"+strconv.FormatInt(id, 10), harness.ProducerToken, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET job %d: HTTP %d %s", id, r.Status, r.Raw)
	}
	return r.Body["position"]
}

// TestCompleteNotStarted: /complete with status not_started on a job whose start was never
// confirmed queues it again, and the answer carries its position like every queued job (SPEC
// §6): the job keeps its place by its original queued_at, ahead of a job admitted while it was
// away. The same report again (an executor retrying a lost answer) is 200 with the job as it is
// now and changes nothing; another outcome on that nonce is outcome_conflict.
func TestCompleteNotStarted(t *testing.T) {
	t.Parallel()
	e := newNotStartedEnv(t)
	first := e.Admit(t, "later", nil)
	nonce := e.dispatch(t, first)
	second := e.Admit(t, "later", nil)
	r := e.complete(t, first, nonce, "not_started")
	if r.Status != http.StatusOK || r.Body["status"] != "queued" || r.Body["position"] != 1.0 {
		t.Fatalf("not_started: HTTP %d %s, want 200 queued at position 1", r.Status, r.Raw)
	}
	if p := e.position(t, first); p != 1.0 {
		t.Errorf("GET of the requeued job: position %v, want 1", p)
	}
	if p := e.position(t, second); p != 2.0 {
		t.Errorf("GET of the job admitted meanwhile: position %v, want 2", p)
	}
	again := e.complete(t, first, nonce, "not_started")
	if again.Status != http.StatusOK || again.Body["status"] != "queued" || again.Body["position"] != 1.0 ||
		again.Body["version"] != r.Body["version"] || again.Body["error_code"] != "not_started" {
		t.Errorf("not_started repeated: HTTP %d %s, want 200 with the job unchanged, at position 1", again.Status, again.Raw)
	}
	wantCode(t, "succeeded after not_started", e.complete(t, first, nonce, "succeeded"), 409, "outcome_conflict")
	if j := drainertest.ReadJob(t, e.DB.DB, first); j.Status != "queued" {
		t.Errorf("after the repeats the job is %s, want queued", j.Status)
	}
}

// TestCompleteNotStartedVoidedNonce: two jobs end up alike, queued with their dispatch's nonce
// voided, one by the executor's not_started, the other by lease recovery. A not_started on the
// first is the same outcome again: 200 with the job. On the second it is a late report on a
// dispatch sluice voided: 409 dispatch_void with the job's status.
func TestCompleteNotStartedVoidedNonce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := &harnessEnv{harness.Start(t, harness.Options{API: true})}
	fake := clock.NewFake(time.Now())
	stub, _ := byTenant(map[string]executor.Answer{
		"later": {Kind: executor.Accepted, HTTPStatus: 202},
	})
	recorded := make(chan int64, 4)
	d1 := drainertest.NewDrainer(t, drainer.Config{DB: env.DB.DB, Executor: stub, Clock: fake, ID: "d-gone",
		Observer: drainer.ObserverFuncs{OnRecorded: func(id int64) { recorded <- id }}}, 100*time.Millisecond)
	reported := env.Admit(t, "later", nil)
	recovered := env.Admit(t, "later", nil)
	if p, err := d1.RunOnce(ctx); err != nil || p.Claimed != 2 {
		t.Fatalf("pass: %+v, %v; want 2 claimed", p, err)
	}
	drainertest.AwaitRecorded(t, recorded, 2)
	complete := func(id int64) harness.Response {
		t.Helper()
		return env.Do(t, http.MethodPost, "/v1/jobs/"+strconv.FormatInt(id, 10)+"/complete", harness.ExecutorToken,
			map[string]any{"nonce": stub.Sent(id)[0].Nonce, "status": "not_started"})
	}
	if r := complete(reported); r.Status != http.StatusOK || r.Body["status"] != "queued" {
		t.Fatalf("not_started: HTTP %d %s, want 200 queued", r.Status, r.Raw)
	}
	// The other job's lease, moved to its wall by the 202, runs out, and another drainer
	// recovers it. With dispatch paused both jobs stay queued.
	env.SetConfig(t, func(c *config.Config) { c.GlobalInFlight = 0 })
	fake.Advance(config.Default().Wall() + time.Second)
	d2 := drainertest.NewDrainer(t, drainer.Config{DB: env.DB.DB, Executor: stub, Clock: fake, ID: "d-rescuer"}, 100*time.Millisecond)
	if p, err := d2.RunOnce(ctx); err != nil || p.Recovered != 1 || p.Claimed != 0 {
		t.Fatalf("rescuing pass %+v, %v; want 1 recovered, none claimed", p, err)
	}
	if a, b := drainertest.ReadJob(t, env.DB.DB, reported).Status, drainertest.ReadJob(t, env.DB.DB, recovered).Status; a != "queued" || b != "queued" {
		t.Fatalf("jobs are %s and %s, want both queued", a, b)
	}
	if r := complete(reported); r.Status != http.StatusOK || r.Body["status"] != "queued" {
		t.Errorf("not_started repeated: HTTP %d %s, want 200 queued", r.Status, r.Raw)
	}
	r := complete(recovered)
	wantCode(t, "not_started after lease recovery", r, 409, "dispatch_void")
	if r.Body["status"] != "queued" {
		t.Errorf("the dispatch_void answer names status %v, want queued", r.Body["status"])
	}
}

// TestCompleteAfterSluiceEnded drives a drainer one pass at a time through the dispatches that
// sluice ends without the executor's own report, and then has the executor report late through
// the API: failed with dispatch_failed (the budget spent by an unknown answer), failed after the
// start because the executor answered 429 or 503, and lost after the start (lease recovery). A
// late /complete of either outcome and a late /start answer 409 dispatch_void with the job's
// status (SPEC §6), and the job stays as it ended. A 2xx answer with a status is the executor's
// own outcome: /complete repeating it is 200, another outcome outcome_conflict, /start nonce_used.
func TestCompleteAfterSluiceEnded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := &harnessEnv{harness.Start(t, harness.Options{API: true})}
	env.SetConfig(t, func(c *config.Config) { c.DispatchAttempts = 1 }) // one unknown answer spends it
	fake := clock.NewFake(time.Now())
	s := drainertest.NewHeld()
	recorded := make(chan int64, 8)
	d := drainertest.NewDrainer(t, drainer.Config{DB: env.DB.DB, Executor: s, Clock: fake, ID: "d-ends",
		Observer: drainer.ObserverFuncs{OnRecorded: func(id int64) { recorded <- id }}}, 100*time.Millisecond)
	dispatch := func(tenant string, start bool) (int64, string) {
		t.Helper()
		id := env.Admit(t, tenant, nil)
		if p, err := d.RunOnce(ctx); err != nil || p.Claimed != 1 {
			t.Fatalf("pass: %+v, %v; want job %d claimed", p, err, id)
		}
		disp := s.Next(t)
		if start {
			if r := env.start(t, id, disp.Nonce, "attempt-1"); r.Status != http.StatusOK {
				t.Fatalf("/start: HTTP %d %s", r.Status, r.Raw)
			}
		}
		return id, disp.Nonce
	}
	answer := func(id int64, a executor.Answer) {
		t.Helper()
		s.Replies <- a
		if got := drainertest.AwaitRecorded(t, recorded, 1)[0]; got != id {
			t.Fatalf("recorded job %d, want %d", got, id)
		}
	}
	complete := func(id int64, nonce, status string) harness.Response {
		t.Helper()
		return env.Do(t, http.MethodPost, "/v1/jobs/"+strconv.FormatInt(id, 10)+"/complete", harness.ExecutorToken,
			map[string]any{"nonce": nonce, "status": status})
	}
	version := func(id int64) (string, int64) {
		t.Helper()
		var st string
		var v int64
		if err := env.DB.QueryRowContext(ctx, "SELECT status, version FROM jobs WHERE id = ?", id).Scan(&st, &v); err != nil {
			t.Fatal(err)
		}
		return st, v
	}
	lateIsVoid := func(what string, id int64, nonce, status, code string) {
		t.Helper()
		st, v := version(id)
		var ec string
		if err := env.DB.QueryRowContext(ctx, "SELECT error_code FROM jobs WHERE id = ?", id).Scan(&ec); err != nil {
			t.Fatal(err)
		}
		if st != status || ec != code {
			t.Fatalf("%s: the job ended %s/%s, want %s/%s", what, st, ec, status, code)
		}
		for _, r := range []harness.Response{complete(id, nonce, "failed"), complete(id, nonce, "succeeded"), env.start(t, id, nonce, "attempt-1")} {
			wantCode(t, what+": late report", r, http.StatusConflict, "dispatch_void")
			if r.Body["status"] != status {
				t.Errorf("%s: the dispatch_void answer names status %v, want %s", what, r.Body["status"], status)
			}
		}
		if st2, v2 := version(id); st2 != st || v2 != v {
			t.Errorf("%s: the late reports moved the job from %s v%d to %s v%d", what, st, v, st2, v2)
		}
	}

	id, nonce := dispatch("budget", false)
	answer(id, executor.Answer{Kind: executor.Unknown, Err: errors.New("connection reset")})
	lateIsVoid("budget spent", id, nonce, "failed", "dispatch_failed")

	id, nonce = dispatch("limited", true)
	answer(id, executor.Answer{Kind: executor.RateLimited, HTTPStatus: 429, RetryAfter: 5})
	lateIsVoid("429 after the start", id, nonce, "failed", "rate_limited")

	id, nonce = dispatch("refused", true)
	answer(id, executor.Answer{Kind: executor.Refused, HTTPStatus: 503})
	lateIsVoid("503 after the start", id, nonce, "failed", "executor_refused")

	id, nonce = dispatch("own", true)
	answer(id, executor.Answer{Kind: executor.Done, HTTPStatus: 200, Status: "failed", ErrorCode: "upstream_down"})
	if r := complete(id, nonce, "failed"); r.Status != http.StatusOK || r.Body["status"] != "failed" {
		t.Errorf("/complete repeating the executor's 2xx outcome: HTTP %d %s, want 200 failed", r.Status, r.Raw)
	}
	wantCode(t, "another outcome than the executor's 2xx", complete(id, nonce, "succeeded"), http.StatusConflict, "outcome_conflict")
	wantCode(t, "/start after the executor's 2xx outcome", env.start(t, id, nonce, "attempt-1"), http.StatusConflict, "nonce_used")

	// Last, since this drainer stops renewing its lease: another drainer recovers the running
	// job past the lease and it is lost.
	id, nonce = dispatch("lost", true)
	fake.Advance(11 * time.Second)
	d2 := drainertest.NewDrainer(t, drainer.Config{DB: env.DB.DB, Executor: s, Clock: fake, ID: "d-rescuer"}, 100*time.Millisecond)
	if p, err := d2.RunOnce(ctx); err != nil || p.Recovered != 1 {
		t.Fatalf("rescuing pass: %+v, %v; want 1 recovered", p, err)
	}
	lateIsVoid("lost", id, nonce, "lost", "lease_expired")
}
