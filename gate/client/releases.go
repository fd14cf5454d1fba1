package client

import (
	"context"
	"net/http"
)

// Release reports capacity freed for tenant outside sluice's job transitions (POST /v1/releases,
// executor or admin token) and returns the outbox id of the release event it wrote.
func (c *Client) Release(ctx context.Context, tenant string) (int64, error) {
	var out struct {
		OutboxID int64 `json:"outbox_id"`
	}
	if _, err := c.Do(ctx, http.MethodPost, "/v1/releases", map[string]string{"tenant": tenant}, &out); err != nil {
		return 0, err
	}
	return out.OutboxID, nil
}
