package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/gate/store"
)

// Event is one audit event (SPEC §10).
type Event = store.AuditEvent

// JobEvents reads job id's audit trail, oldest first (GET /v1/jobs/{id}/events). A producer
// gets not_found for another tenant's job.
func (c *Client) JobEvents(ctx context.Context, id int64) ([]Event, error) {
	var out struct {
		Events []Event `json:"events"`
	}
	_, err := c.Do(ctx, http.MethodGet, "/v1/jobs/"+strconv.FormatInt(id, 10)+"/events", nil, &out)
	return out.Events, err
}

// AuditOptions filter Audit. Zero values mean "no filter" and the server's default limit (50).
type AuditOptions struct {
	Tenant string
	Event  string
	Since  time.Time
	Limit  int
	Cursor string
}

// AuditPage is one page of Audit: NextCursor is "" on the last page.
type AuditPage struct {
	Events     []Event `json:"events"`
	NextCursor string  `json:"next_cursor"`
}

// Audit reads one page of audit events, newest first (GET /v1/audit, admin).
func (c *Client) Audit(ctx context.Context, o AuditOptions) (AuditPage, error) {
	q := url.Values{}
	if o.Tenant != "" {
		q.Set("tenant", o.Tenant)
	}
	if o.Event != "" {
		q.Set("event", o.Event)
	}
	if !o.Since.IsZero() {
		q.Set("since", o.Since.UTC().Format(time.RFC3339Nano))
	}
	var p struct {
		Events     []Event `json:"events"`
		NextCursor *string `json:"next_cursor"`
	}
	_, err := c.Do(ctx, http.MethodGet, pagePath("/v1/audit", q, o.Limit, o.Cursor), nil, &p)
	out := AuditPage{Events: p.Events}
	if p.NextCursor != nil {
		out.NextCursor = *p.NextCursor
	}
	return out, err
}
