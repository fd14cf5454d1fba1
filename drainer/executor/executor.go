// Package executor is the drainer's side of the dispatch protocol (SPEC §8): it signs and sends a
// job to the executor over HTTP and classifies the answer. It decides nothing about job state.
package executor

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Dispatch is the body the drainer POSTs to the executor (SPEC §8).
type Dispatch struct {
	JobID         int64           `json:"job_id"`
	Tenant        string          `json:"tenant"`
	RateKeySHA256 *string         `json:"rate_key_sha256"`
	Payload       json.RawMessage `json:"payload"`
	Nonce         string          `json:"nonce"`
	Deadline      time.Time       `json:"deadline"`
	Version       int64           `json:"version"`
	Attempt       int             `json:"attempt"`
	// Audience names the executor the dispatch is meant for (SLUICE_EXECUTOR_ID), inside the
	// signed body: an executor configured with another id refuses it, so a dispatch copied to
	// another executor that shares the secret is not run there. Empty: none named.
	Audience string `json:"audience,omitempty"`
}

// Header names of the dispatch request.
const (
	HeaderJobID     = "Sluice-Job-Id"
	HeaderSignature = "Sluice-Signature"
)

// Sign returns the Sluice-Signature value for body: "sha256=" and the hex HMAC-SHA256 of the raw
// body with secret.
func Sign(secret, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// Verify reports whether sig is body's signature with secret, in constant time.
func Verify(secret, body []byte, sig string) bool {
	return hmac.Equal([]byte(Sign(secret, body)), []byte(sig))
}

// Kind classifies an executor's answer (the rows of the SPEC §8 table).
type Kind int

const (
	// Done: 2xx with a terminal status in the body.
	Done Kind = iota + 1
	// Accepted: 202, the executor will call /complete.
	Accepted
	// RateLimited: 429, gate the rate key.
	RateLimited
	// Refused: 503, the executor refused to start.
	Refused
	// Unknown: any other answer, a timeout or a lost connection.
	Unknown
)

// Gate is the optional gate field of an executor's answer.
type Gate struct {
	RetryAfter int `json:"retry_after"`
}

// Answer is the classified answer.
type Answer struct {
	Kind         Kind
	HTTPStatus   int
	Status       string // succeeded or failed, for Done
	ErrorCode    string
	ErrorMessage string
	Result       json.RawMessage
	Gate         *Gate
	// RetryAfter is the Retry-After header in seconds, 0 if absent.
	RetryAfter int
	Err        error // for Unknown
}

type body struct {
	Status       string          `json:"status"`
	ErrorCode    string          `json:"error_code"`
	ErrorMessage string          `json:"error_message"`
	Result       json.RawMessage `json:"result"`
	Gate         *Gate           `json:"gate"`
}

// Client sends dispatches. Safe for concurrent use.
type Client struct {
	// URL is the executor's dispatch endpoint. Required.
	URL string
	// Secret signs every request body. Required.
	Secret []byte
	// Audience is written into every dispatch that names none (Dispatch.Audience). Default "":
	// dispatches name no audience.
	Audience string
	// HTTP is the client to use. Default: a client with keep-alive connections and no overall
	// timeout (Send bounds each request by its context). Send never follows a redirect, whatever
	// this client's CheckRedirect says: a 307 or 308 would re-send the signed body, payload and
	// nonce to whatever host the answer names.
	HTTP *http.Client
}

// NewClient returns a client for url signed with secret.
func NewClient(url string, secret []byte) *Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 256
	tr.MaxIdleConnsPerHost = 256
	return &Client{URL: url, Secret: secret, HTTP: &http.Client{Transport: tr, CheckRedirect: noRedirect}}
}

// noRedirect is a CheckRedirect that hands the redirect answer itself back to the caller, which
// then classifies it as any other unexpected status (Unknown).
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// PlainHTTPToRemote reports whether rawURL sends dispatches unencrypted (http://) to a host
// other than a loopback address or localhost: the signed payload and the nonce then cross the
// network in clear text. A URL that does not parse reports false (validation is elsewhere).
func PlainHTTPToRemote(rawURL string) bool {
	u, err := url.Parse(rawURL)
	if err != nil || !strings.EqualFold(u.Scheme, "http") {
		return false
	}
	host := u.Hostname()
	if strings.EqualFold(host, "localhost") || strings.HasSuffix(strings.ToLower(host), ".localhost") {
		return false
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return false
	}
	return true
}

// maxAnswer bounds how much of an answer is read.
const maxAnswer = 1 << 20

// Send posts d and waits for the answer until ctx ends (the caller sets the execution wall).
func (c *Client) Send(ctx context.Context, d Dispatch) Answer {
	if d.Audience == "" {
		d.Audience = c.Audience
	}
	raw, err := json.Marshal(d)
	if err != nil {
		return Answer{Kind: Unknown, Err: fmt.Errorf("encode dispatch: %w", err)}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL, bytes.NewReader(raw))
	if err != nil {
		return Answer{Kind: Unknown, Err: fmt.Errorf("build dispatch request: %w", err)}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderJobID, strconv.FormatInt(d.JobID, 10))
	req.Header.Set(HeaderSignature, Sign(c.Secret, raw))
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	// A shallow copy (the transport and its connections are shared), so that a caller's client
	// is left as it was and still never follows a redirect here.
	cp := *hc
	cp.CheckRedirect = noRedirect
	resp, err := cp.Do(req)
	if err != nil {
		return Answer{Kind: Unknown, Err: fmt.Errorf("dispatch job %d: %w", d.JobID, err)}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return Answer{Kind: Unknown, HTTPStatus: resp.StatusCode, Err: fmt.Errorf("read answer to job %d: %w", d.JobID, err)}
	}
	return Classify(resp.StatusCode, resp.Header.Get("Retry-After"), data)
}

// Classify maps an HTTP answer to a Kind per SPEC §8.
func Classify(status int, retryAfter string, data []byte) Answer {
	a := Answer{HTTPStatus: status, RetryAfter: parseRetryAfter(retryAfter)}
	var b body
	if len(bytes.TrimSpace(data)) > 0 {
		if err := json.Unmarshal(data, &b); err != nil && status >= 200 && status < 300 && status != http.StatusAccepted {
			a.Kind, a.Err = Unknown, fmt.Errorf("executor answered %d with an unreadable body: %w", status, err)
			return a
		}
	}
	a.Gate = b.Gate
	switch {
	case status == http.StatusAccepted:
		a.Kind = Accepted
	case status >= 200 && status < 300:
		if b.Status != "succeeded" && b.Status != "failed" {
			a.Kind, a.Err = Unknown, fmt.Errorf("executor answered %d with status %q, want succeeded or failed", status, b.Status)
			return a
		}
		a.Kind, a.Status, a.ErrorCode, a.ErrorMessage, a.Result = Done, b.Status, b.ErrorCode, b.ErrorMessage, b.Result
	case status == http.StatusTooManyRequests:
		a.Kind = RateLimited
	case status == http.StatusServiceUnavailable:
		a.Kind = Refused
	case status >= 300 && status < 400:
		// Redirects are never followed (see Client.HTTP): the answer is an error like any other.
		a.Kind, a.Err = Unknown, errors.New("executor answered HTTP "+strconv.Itoa(status)+", a redirect, which is not followed")
	default:
		a.Kind, a.Err = Unknown, errors.New("executor answered HTTP "+strconv.Itoa(status))
	}
	return a
}

func parseRetryAfter(v string) int {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil && n > 0 {
		return n
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := time.Until(t); d > 0 {
			return int(d.Seconds() + 0.999)
		}
	}
	return 0
}
