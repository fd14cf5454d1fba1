package client

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Gate is a gated rate key as GET /v1/gates lists it.
type Gate struct {
	RateKeySHA256 string    `json:"rate_key_sha256"`
	NotBefore     time.Time `json:"not_before"`
	Queued        int64     `json:"queued"`
}

// SetGateRequest is the body of POST /v1/gates: give RateKey or RateKeySHA256.
type SetGateRequest struct {
	RateKey       string `json:"rate_key,omitempty"`
	RateKeySHA256 string `json:"rate_key_sha256,omitempty"`
	RetryAfter    int    `json:"retry_after"`
}

// SetGateAnswer is the answer of POST /v1/gates: the gate now in force (never shorter than a
// gate that was already there).
type SetGateAnswer struct {
	RateKeySHA256 string    `json:"rate_key_sha256"`
	NotBefore     time.Time `json:"not_before"`
}

// SetGate gates a rate key for req.RetryAfter seconds (plus sluice's margin), never shortening a
// longer gate.
func (c *Client) SetGate(ctx context.Context, req SetGateRequest) (SetGateAnswer, error) {
	var a SetGateAnswer
	_, err := c.Do(ctx, http.MethodPost, "/v1/gates", req, &a)
	return a, err
}

// Gates lists the gated keys among the rate keys of queued jobs.
func (c *Client) Gates(ctx context.Context) ([]Gate, error) {
	var out struct {
		Gates []Gate `json:"gates"`
	}
	_, err := c.Do(ctx, http.MethodGet, "/v1/gates", nil, &out)
	return out.Gates, err
}

// ClearGate lifts the gate of the rate key whose SHA-256 hex is hash.
func (c *Client) ClearGate(ctx context.Context, hash string) error {
	_, err := c.Do(ctx, http.MethodDelete, "/v1/gates/"+url.PathEscape(hash), nil, nil)
	return err
}
