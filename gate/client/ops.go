package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/status"
)

// Status reads GET /v1/status (admin).
func (c *Client) Status(ctx context.Context) (status.Status, error) {
	var s status.Status
	_, err := c.Do(ctx, http.MethodGet, "/v1/status", nil, &s)
	return s, err
}

// ConfigVersion is the runtime configuration in force and its version; Change is set by
// PatchConfig when a new version was written.
type ConfigVersion struct {
	Version int64          `json:"version"`
	Config  config.Config  `json:"config"`
	Change  *config.Change `json:"change,omitempty"`
}

// Config reads GET /v1/config (admin).
func (c *Client) Config(ctx context.Context) (ConfigVersion, error) {
	var v ConfigVersion
	_, err := c.Do(ctx, http.MethodGet, "/v1/config", nil, &v)
	return v, err
}

// PatchConfig applies changes (key → new value, any JSON value) with note, all or none. An
// invalid change is an *Error with code invalid_request whose Body names the "field".
func (c *Client) PatchConfig(ctx context.Context, changes map[string]any, note string) (ConfigVersion, error) {
	raw := make(map[string]json.RawMessage, len(changes))
	for k, v := range changes {
		b, err := json.Marshal(v)
		if err != nil {
			return ConfigVersion{}, fmt.Errorf("encode %s: %w", k, err)
		}
		raw[k] = b
	}
	var v ConfigVersion
	_, err := c.Do(ctx, http.MethodPatch, "/v1/config", map[string]any{"changes": raw, "note": note}, &v)
	return v, err
}

// ConfigHistoryOptions select a page of ConfigHistory; zero values take the API's defaults (the
// 50 newest changes).
type ConfigHistoryOptions struct {
	Limit  int
	Cursor string
}

// ConfigHistoryPage is one page of ConfigHistory: NextCursor is "" on the last page.
type ConfigHistoryPage struct {
	History    []config.Change `json:"history"`
	NextCursor string          `json:"next_cursor"`
}

// ConfigHistory reads one page of GET /v1/config/history (admin), newest first: pass NextCursor
// back as Cursor for the next.
func (c *Client) ConfigHistory(ctx context.Context, o ConfigHistoryOptions) (ConfigHistoryPage, error) {
	var p struct {
		History    []config.Change `json:"history"`
		NextCursor *string         `json:"next_cursor"`
	}
	_, err := c.Do(ctx, http.MethodGet, pagePath("/v1/config/history", url.Values{}, o.Limit, o.Cursor), nil, &p)
	out := ConfigHistoryPage{History: p.History}
	if p.NextCursor != nil {
		out.NextCursor = *p.NextCursor
	}
	return out, err
}

// TenantsOptions selects a page of GET /v1/tenants; zero values take the API's defaults (order
// name, limit 100, the first page).
type TenantsOptions struct {
	Order  string
	Limit  int
	Cursor string
}

// TenantPage is one page of GET /v1/tenants; NextCursor is empty on the last page.
type TenantPage struct {
	Tenants    []status.TenantRow
	NextCursor string
}

// Tenants reads one page of GET /v1/tenants (admin): the tenants with queued work.
func (c *Client) Tenants(ctx context.Context, o TenantsOptions) (TenantPage, error) {
	q := url.Values{}
	if o.Order != "" {
		q.Set("order", o.Order)
	}
	path := pagePath("/v1/tenants", q, o.Limit, o.Cursor)
	var p struct {
		Tenants    []status.TenantRow `json:"tenants"`
		NextCursor *string            `json:"next_cursor"`
	}
	_, err := c.Do(ctx, http.MethodGet, path, nil, &p)
	out := TenantPage{Tenants: p.Tenants}
	if p.NextCursor != nil {
		out.NextCursor = *p.NextCursor
	}
	return out, err
}
