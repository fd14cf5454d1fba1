package api

import (
	"context"
	"net/http"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/status"
)

// TenantsReader reads GET /v1/tenants; *status.Reader is one. A Config.Status that implements
// it serves the endpoint too.
type TenantsReader interface {
	ReadTenants(ctx context.Context, q status.TenantsQuery) (status.TenantPage, error)
}

// Page sizes of GET /v1/tenants (SPEC §6).
const (
	defaultTenantsLimit = 100
	maxTenantsLimit     = 1000
)

// tenantsCursor encodes the key a page continues after, with its order: a cursor of one order
// is refused by the other.
func tenantsCursor(order string, k status.TenantKey) string {
	if order == status.ByDepth {
		return encodeOpaque("depth", strconv.FormatInt(k.Depth, 10)+":"+k.Tenant)
	}
	return encodeOpaque("name", k.Tenant)
}

func decodeTenantsCursor(order, s string) (*status.TenantKey, error) {
	if order == status.ByDepth {
		v, ok := decodeOpaque("depth", s)
		if d, name, cut := strings.Cut(v, ":"); ok && cut && name != "" {
			if n, err := strconv.ParseInt(d, 10, 64); err == nil && n > 0 {
				return &status.TenantKey{Depth: n, Tenant: name}, nil
			}
		}
		return nil, badCursor()
	}
	if name, ok := decodeOpaque("name", s); ok && name != "" {
		return &status.TenantKey{Tenant: name}, nil
	}
	return nil, badCursor()
}

// listTenants is GET /v1/tenants?cursor=&limit=&order= (admin): every tenant with queued work,
// a page at a time; with tenant=, that tenant's row alone.
func (s *Server) listTenants(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	tq := status.TenantsQuery{Order: status.ByName, Limit: defaultTenantsLimit}
	if v := q.Get("order"); v != "" {
		if v != status.ByName && v != status.ByDepth {
			s.fail(w, r, job.Invalid("order", "order must be %s or %s", status.ByName, status.ByDepth))
			return
		}
		tq.Order = v
	}
	var err error
	if tq.Limit, err = listLimit(q, defaultTenantsLimit, maxTenantsLimit); err != nil {
		s.fail(w, r, err)
		return
	}
	if q.Has("tenant") {
		t := q.Get("tenant")
		if err := job.ValidTenant("tenant", t); err != nil {
			s.fail(w, r, err)
			return
		}
		tq.Tenant = t
	}
	if v := q.Get("cursor"); v != "" && tq.Tenant == "" {
		k, err := decodeTenantsCursor(tq.Order, v)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		tq.After = k
	}
	reader, ok := s.cfg.Status.(TenantsReader)
	if !ok {
		sr, err := status.New(status.Config{DB: s.cfg.DB, Limits: s.cfg.Limits})
		if err != nil {
			s.fail(w, r, err)
			return
		}
		reader = sr
	}
	page, err := reader.ReadTenants(r.Context(), tq)
	if err != nil {
		s.fail(w, r, gate.AsUnavailable(err))
		return
	}
	var cursor *string
	if page.Next != nil {
		c := tenantsCursor(tq.Order, *page.Next)
		cursor = &c
	}
	lanes := page.Lanes
	if lanes == nil {
		lanes = map[string]status.LaneUse{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"tenants": page.Tenants, "next_cursor": cursor, "lanes": lanes})
}
