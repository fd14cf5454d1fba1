package kit

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// confirm confirms the start of j with its nonce and a start id drawn for this attempt. An
// answer that may have been lost (none, or a 503 that says retryable: the database was
// unreachable or the COMMIT's outcome is unknown) is asked again with the same nonce and start id
// until ctx ends: the API answers a repeat of the start attempt that started the job 200 again,
// and any other attempt on the same dispatch 409 nonce_used (SPEC §4), so this retry is safe and
// the same dispatch replayed to another executor is not. Giving up would leave a start recorded
// that the executor never ran. Any other answer than 200 is final: the job must not run.
func (h *Handler) confirm(ctx context.Context, j Job) error {
	startID := newStartID()
	b := backoff.WithContext(backoff.NewExponentialBackOff(backoff.WithInitialInterval(20*time.Millisecond),
		backoff.WithMaxInterval(time.Second), backoff.WithMaxElapsedTime(0)), ctx)
	var last error
	err := backoff.Retry(func() error {
		last = h.post(ctx, fmt.Sprintf("/v1/jobs/%d/start", j.ID), map[string]any{"nonce": j.Nonce, "start_id": startID})
		var refused *refusal
		if errors.As(last, &refused) && !refused.retryable {
			return backoff.Permanent(last)
		}
		return last
	}, b)
	if err != nil && last != nil && !errors.Is(err, last) {
		return fmt.Errorf("%w (last answer: %w)", err, last)
	}
	return err
}

// newStartID is a random start attempt id: 128 bits, so no other attempt draws the same one.
// crypto/rand.Read never fails (it ends the process if the system's source does).
func newStartID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// completion is the body of POST /v1/jobs/{id}/complete.
type completion struct {
	Nonce        string          `json:"nonce"`
	Status       string          `json:"status"`
	ErrorCode    string          `json:"error_code,omitempty"`
	ErrorMessage string          `json:"error_message,omitempty"`
	Result       json.RawMessage `json:"result,omitempty"`
	Gate         *gate           `json:"gate,omitempty"`
}

type gate struct {
	RetryAfter int `json:"retry_after"`
}

// completionOf is the /complete body that reports o for j.
func (h *Handler) completionOf(j Job, o Outcome) completion {
	if o.RetryAfter > 0 {
		c := completion{Nonce: j.Nonce, Status: StatusFailed, ErrorCode: o.ErrorCode, ErrorMessage: o.ErrorMessage,
			Gate: &gate{RetryAfter: retrySeconds(o.RetryAfter)}}
		if c.ErrorCode == "" {
			c.ErrorCode = codeRateLimited
		}
		if h.o.unconfirmed {
			// The API never heard of a start: not_started queues the job again, behind the gate.
			c.Status = "not_started"
		}
		return c
	}
	status, code, msg := settle(o)
	return completion{Nonce: j.Nonce, Status: status, ErrorCode: code, ErrorMessage: msg, Result: o.Result}
}

// report sends o, the outcome of the asynchronous job j, to /complete. It retries whatever may
// be passing (no answer, a 5xx, a 429 or 408) with backoff, until a minute past the job's
// deadline (reportGrace) or the Handler's close; an answer that refuses the report (409: the job
// moved on or another outcome is recorded; another 4xx: a bad report) is final. The outcome is
// the same every time, so a repeat the API already recorded answers 200 again.
func (h *Handler) report(j Job, o Outcome) {
	if h.apiURL == "" {
		h.o.log.Warn("asynchronous outcome not reported: no API URL", "job_id", j.ID)
		return
	}
	now := time.Now()
	deadline := j.Deadline
	if deadline.IsZero() {
		deadline = now.Add(noDeadline)
	}
	giveUp, cancel := context.WithDeadline(h.base, maxTime(deadline, now).Add(reportGrace))
	defer cancel()
	body := h.completionOf(j, o)
	path := fmt.Sprintf("/v1/jobs/%d/complete", j.ID)
	b := backoff.WithContext(backoff.NewExponentialBackOff(backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMaxInterval(5*time.Second), backoff.WithMaxElapsedTime(0)), giveUp)
	var last error
	attempts := 0
	err := backoff.Retry(func() error {
		attempts++
		// Each attempt runs under the Handler, not giveUp, so that a report due past its grace
		// is still tried once.
		last = h.post(h.base, path, body)
		var refused *refusal
		if errors.As(last, &refused) && !refused.transient() {
			return backoff.Permanent(last)
		}
		return last
	}, b)
	switch {
	case err == nil && attempts > 1:
		h.o.log.Info("asynchronous outcome reported after retries", "job_id", j.ID, "attempts", attempts)
	case err != nil:
		h.o.log.Warn("asynchronous outcome not reported", "job_id", j.ID, "status", body.Status,
			"attempts", attempts, "error", last)
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// post sends body to the API's path; nil on 200, a *refusal for any other answer.
func (h *Handler) post(ctx context.Context, path string, body any) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return backoff.Permanent(fmt.Errorf("encode %s: %w", path, err))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.apiURL+path, bytes.NewReader(raw))
	if err != nil {
		return backoff.Permanent(fmt.Errorf("build %s: %w", path, err))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+h.token)
	resp, err := h.o.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	var answer struct {
		Retryable bool `json:"retryable"`
	}
	_ = json.Unmarshal(msg, &answer)
	return &refusal{status: resp.StatusCode, retryable: resp.StatusCode == http.StatusServiceUnavailable && answer.Retryable,
		msg: path + ": HTTP " + strconv.Itoa(resp.StatusCode) + ": " + strings.TrimSpace(string(msg))}
}

// refusal is an API answer other than 200.
type refusal struct {
	status int
	// retryable: a 503 whose body says retryable (the database was unreachable, or the COMMIT's
	// outcome is unknown and the request may be repeated).
	retryable bool
	msg       string
}

func (r *refusal) Error() string { return r.msg }

// transient reports whether the same request may succeed later: the API was unavailable,
// overloaded or cut short, as opposed to refusing the request itself.
func (r *refusal) transient() bool {
	return r.status >= 500 || r.status == http.StatusTooManyRequests || r.status == http.StatusRequestTimeout
}
