package api

import (
	"net/http"
	"slices"
	"strings"
)

// CORS (SPEC §5a, §9 SLUICE_CORS_ORIGINS): a browser page of an allowed origin may call the API
// with a token and read the capacity headers of its answers.

// corsAllowHeaders are the request headers a preflight allows.
var corsAllowHeaders = strings.Join([]string{"Authorization", "Content-Type", AwareHeader}, ", ")

// corsMethods are the methods a preflight allows: those the API serves.
const corsMethods = "GET, POST, PATCH, DELETE"

// cors adds the CORS headers for a request from an allowed origin, and answers its preflight
// (an OPTIONS with Access-Control-Request-Method), reporting whether it did. A request from
// another origin, or with none, gets no CORS header: the browser then withholds the answer.
func (s *Server) cors(w http.ResponseWriter, r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" || len(s.cfg.CORSOrigins) == 0 {
		return false
	}
	h := w.Header()
	h.Add("Vary", "Origin")
	if !slices.Contains(s.cfg.CORSOrigins, origin) && !slices.Contains(s.cfg.CORSOrigins, "*") {
		return false
	}
	h.Set("Access-Control-Allow-Origin", origin)
	h.Set("Access-Control-Expose-Headers", strings.Join(capacityHeaders, ", "))
	if r.Method != http.MethodOptions || r.Header.Get("Access-Control-Request-Method") == "" {
		return false
	}
	h.Set("Access-Control-Allow-Methods", corsMethods)
	h.Set("Access-Control-Allow-Headers", corsAllowHeaders)
	h.Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
	return true
}
