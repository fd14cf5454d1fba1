package api

import "net/http"

// WhoAmI is the body of GET /v1/whoami: the caller a token authenticates as. The console reads
// it at sign-in to show only what the role may do; the server enforces scope on every request
// regardless, so this answer grants nothing.
type WhoAmI struct {
	Name string `json:"name"`
	Role Role   `json:"role"`
	// Tenants are a producer's tenants ("*" for all); empty for the other roles.
	Tenants []string `json:"tenants"`
}

// whoami is GET /v1/whoami (any valid token).
func (s *Server) whoami(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	tenants := c.Tenants
	if c.Role != Producer || tenants == nil {
		tenants = []string{}
	}
	writeJSON(w, http.StatusOK, WhoAmI{Name: c.Name, Role: c.Role, Tenants: tenants})
}
