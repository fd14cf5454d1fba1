// Package client is a small Go client for sluice's HTTP API (SPEC §6), used by the CLI and the
// integration tests. Every method takes a context and returns either the decoded answer or an
// *Error carrying the API's stable error_code.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gate/job"
)

// Client talks to one sluice API. Safe for concurrent use.
type Client struct {
	// BaseURL is the API's base, e.g. http://127.0.0.1:7480. Required.
	BaseURL string
	// Token is the bearer token sent with every request.
	Token string
	// HTTP is the client to use. Default (New): a 30 s timeout and up to 64 idle connections.
	HTTP *http.Client
	// SlotDeadline bounds Acquire's request: past it, or when sluice cannot be reached, Acquire
	// fails open (see Acquire). Default 500 ms.
	SlotDeadline time.Duration
	// Log receives one line when Acquire fails open, at most one per 15 s. Default: none.
	Log *slog.Logger

	slotsOpen slotFailOpen
}

// New returns a client for baseURL authenticating with token. Its transport keeps up to 64
// idle connections to the API (net/http's default keeps 2, so a producer with more concurrent
// requests than that would open a new connection for most of them).
func New(baseURL, token string) *Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 64
	t.MaxIdleConnsPerHost = 64
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), Token: token,
		HTTP: &http.Client{Timeout: 30 * time.Second, Transport: t}}
}

// Error is an API error answer.
type Error struct {
	HTTPStatus int
	Code       job.Code
	Message    string
	// Body is the whole error body (scope, retry_after, field, id...).
	Body map[string]any
	// RetryAfter is the Retry-After header in seconds, 0 if absent.
	RetryAfter int
}

func (e *Error) Error() string {
	return fmt.Sprintf("sluice API: HTTP %d %s: %s", e.HTTPStatus, e.Code, e.Message)
}

// Code returns the error_code of err if it is an *Error, else "".
func Code(err error) job.Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// Response is a successful answer's status and headers.
type Response struct {
	HTTPStatus int
	Header     http.Header
}

// Do sends method path with in encoded as JSON (nil: no body) and decodes a 2xx answer into out
// (nil: discard). A non-2xx answer is returned as *Error.
func (c *Client) Do(ctx context.Context, method, path string, in, out any) (Response, error) {
	return c.do(ctx, method, path, in, out, nil)
}

// do is Do with extra request headers.
func (c *Client) do(ctx context.Context, method, path string, in, out any, header http.Header) (Response, error) {
	var body io.Reader
	if in != nil {
		raw, err := json.Marshal(in)
		if err != nil {
			return Response{}, fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, body)
	if err != nil {
		return Response{}, fmt.Errorf("build request: %w", err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return Response{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return Response{}, fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	r := Response{HTTPStatus: resp.StatusCode, Header: resp.Header}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		e := &Error{HTTPStatus: resp.StatusCode}
		if err := json.Unmarshal(raw, &e.Body); err == nil {
			code, _ := e.Body["error_code"].(string)
			msg, _ := e.Body["message"].(string)
			e.Code, e.Message = job.Code(code), msg
		} else {
			e.Message = strings.TrimSpace(string(raw))
		}
		e.RetryAfter, _ = strconv.Atoi(resp.Header.Get("Retry-After"))
		return r, e
	}
	if out != nil && len(bytes.TrimSpace(raw)) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return r, fmt.Errorf("%s %s: decode answer: %w", method, path, err)
		}
	}
	return r, nil
}

// AdmitRequest is the body of POST /v1/jobs.
type AdmitRequest struct {
	Tenant         string `json:"tenant"`
	RateKey        string `json:"rate_key,omitempty"`
	Payload        any    `json:"payload,omitempty"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	Queue          *bool  `json:"queue,omitempty"`
	// Priority (0-9, default 5) orders the tenant's own queued jobs, higher first.
	Priority *int `json:"priority,omitempty"`
}

// Admit submits a job. A replayed idempotency key answers 200 and the job as it is now.
func (c *Client) Admit(ctx context.Context, req AdmitRequest) (job.Job, Response, error) {
	var j job.Job
	r, err := c.Do(ctx, http.MethodPost, "/v1/jobs", req, &j)
	return j, r, err
}

// Job reads job id.
func (c *Client) Job(ctx context.Context, id int64) (job.Job, error) {
	var j job.Job
	_, err := c.Do(ctx, http.MethodGet, "/v1/jobs/"+strconv.FormatInt(id, 10), nil, &j)
	return j, err
}

// Cancel cancels a queued job.
func (c *Client) Cancel(ctx context.Context, id int64) (job.Job, error) {
	var j job.Job
	_, err := c.Do(ctx, http.MethodDelete, "/v1/jobs/"+strconv.FormatInt(id, 10), nil, &j)
	return j, err
}

// AdmitBatch submits up to 1,000 jobs in one transaction (POST /v1/jobs:batch) and returns one
// result per job, in order. A refused item is a result with its error body, not an error.
func (c *Client) AdmitBatch(ctx context.Context, reqs []AdmitRequest) ([]BatchItem, error) {
	var out struct {
		Results []BatchItem `json:"results"`
	}
	_, err := c.Do(ctx, http.MethodPost, "/v1/jobs:batch", map[string]any{"jobs": reqs}, &out)
	return out.Results, err
}

// BatchItem is one result of AdmitBatch.
type BatchItem = job.BatchItem

// ListOptions filter List. Zero values mean "no filter" and the server's default limit (50).
type ListOptions struct {
	Tenant string
	Status job.Status
	Limit  int
	Cursor string
}

// Page is one page of List: NextCursor is "" on the last page.
type Page struct {
	Jobs       []job.Job `json:"jobs"`
	NextCursor string    `json:"next_cursor"`
}

// List reads one page of jobs, newest first (GET /v1/jobs). A producer sees only its tenants.
func (c *Client) List(ctx context.Context, o ListOptions) (Page, error) {
	q := url.Values{}
	if o.Tenant != "" {
		q.Set("tenant", o.Tenant)
	}
	if o.Status != "" {
		q.Set("status", string(o.Status))
	}
	path := pagePath("/v1/jobs", q, o.Limit, o.Cursor)
	var p struct {
		Jobs       []job.Job `json:"jobs"`
		NextCursor *string   `json:"next_cursor"`
	}
	_, err := c.Do(ctx, http.MethodGet, path, nil, &p)
	out := Page{Jobs: p.Jobs}
	if p.NextCursor != nil {
		out.NextCursor = *p.NextCursor
	}
	return out, err
}

// pagePath is path with the query q plus a page's limit (0: the server's default) and cursor.
func pagePath(path string, q url.Values, limit int, cursor string) string {
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	return path
}

// Redrive admits a new job from a lost or failed one (admin). The answer is 201 with the new
// job, or 200 with the job an earlier redrive of the same id created.
func (c *Client) Redrive(ctx context.Context, id int64) (job.Job, Response, error) {
	var j job.Job
	r, err := c.Do(ctx, http.MethodPost, "/v1/jobs/"+strconv.FormatInt(id, 10)+"/redrive", nil, &j)
	return j, r, err
}

// Start confirms the start of a dispatched job with its nonce (executor). startID names this
// start attempt: pass a fresh random value, and the same one when repeating a Start whose answer
// was lost, which is then answered as the first was (SPEC §4); "" cannot be repeated. A *Error
// with code nonce_invalid, nonce_expired, nonce_used or dispatch_void means: do not run the job.
func (c *Client) Start(ctx context.Context, id int64, nonce, startID string) (job.Job, error) {
	var j job.Job
	body := map[string]string{"nonce": nonce}
	if startID != "" {
		body["start_id"] = startID
	}
	_, err := c.Do(ctx, http.MethodPost, "/v1/jobs/"+strconv.FormatInt(id, 10)+"/start", body, &j)
	return j, err
}

// Completion is the body of POST /v1/jobs/{id}/complete.
type Completion struct {
	Nonce        string          `json:"nonce"`
	Status       string          `json:"status"` // succeeded, failed or not_started
	ErrorCode    string          `json:"error_code,omitempty"`
	ErrorMessage string          `json:"error_message,omitempty"`
	Result       json.RawMessage `json:"result,omitempty"`
	Gate         *GateRequest    `json:"gate,omitempty"`
}

// GateRequest asks for the job's rate key to be gated for RetryAfter seconds.
type GateRequest struct {
	RetryAfter int `json:"retry_after"`
}

// Complete reports a dispatched job's outcome (executor).
func (c *Client) Complete(ctx context.Context, id int64, o Completion) (job.Job, error) {
	var j job.Job
	_, err := c.Do(ctx, http.MethodPost, "/v1/jobs/"+strconv.FormatInt(id, 10)+"/complete", o, &j)
	return j, err
}
