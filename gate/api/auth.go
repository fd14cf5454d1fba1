package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// Role is what a token may do (SPEC §6).
type Role string

// The roles of SPEC §6.
const (
	Producer Role = "producer"
	Executor Role = "executor"
	Admin    Role = "admin"
)

// Token is one configured bearer token.
type Token struct {
	Name    string   `json:"name"`
	Token   string   `json:"token"`
	Role    Role     `json:"role"`
	Tenants []string `json:"tenants"`
	// Builtin marks a token sluice itself configures rather than an operator: `sluice dev`'s
	// `dev` admin token, the one exception to MinTokenLength (SPEC §9). Never read from
	// configuration.
	Builtin bool `json:"-"`
}

// MinTokenLength is the shortest configured token, in bytes (SPEC §9): long enough that
// guessing one is hopeless, whatever the rate of attempts.
const MinTokenLength = 32

// Caller is the authenticated caller of a request.
type Caller struct {
	Name    string
	Role    Role
	Tenants []string
}

// MayActFor reports whether the caller may act for tenant: admins for all, producers for their
// list (or "*"), executors for none through the producer endpoints.
func (c Caller) MayActFor(tenant string) bool {
	switch c.Role {
	case Admin:
		return true
	case Producer:
		return slices.Contains(c.Tenants, "*") || slices.Contains(c.Tenants, tenant)
	}
	return false
}

// Tokens authenticates bearer tokens. Safe for concurrent use.
type Tokens struct {
	entries []tokenEntry
	roles   map[string]Role // by token name
}

type tokenEntry struct {
	hash   [32]byte
	caller Caller
}

// DecodeTokens decodes the SLUICE_TOKENS JSON array; NewTokens checks it.
func DecodeTokens(raw []byte) ([]Token, error) {
	var list []Token
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("tokens: not a JSON array of {name, token, role, tenants}: %w", err)
	}
	return list, nil
}

// NewTokens checks list and returns the authenticator.
func NewTokens(list []Token) (*Tokens, error) {
	t := &Tokens{roles: map[string]Role{}}
	seen := map[string]bool{}
	names := map[string]int{}
	for i, tok := range list {
		first, dupName := names[tok.Name]
		switch {
		case tok.Name == "":
			return nil, fmt.Errorf("tokens[%d]: name is required", i)
		case dupName:
			// The name is the caller in logs, audit events and config history: two callers with
			// one name could not be told apart there.
			return nil, fmt.Errorf("tokens[%d] (%s): the name is already used by tokens[%d]; names must be unique", i, tok.Name, first)
		case tok.Token == "":
			return nil, fmt.Errorf("tokens[%d] (%s): token is missing", i, tok.Name)
		case len(tok.Token) < MinTokenLength && !tok.Builtin:
			return nil, fmt.Errorf("tokens[%d] (%s): token is %d characters; at least %d are required (e.g. `openssl rand -hex 24`)", i, tok.Name, len(tok.Token), MinTokenLength)
		case tok.Role != Producer && tok.Role != Executor && tok.Role != Admin:
			return nil, fmt.Errorf("tokens[%d] (%s): role must be producer, executor or admin, got %q", i, tok.Name, tok.Role)
		case tok.Role == Producer && len(tok.Tenants) == 0:
			return nil, fmt.Errorf("tokens[%d] (%s): a producer needs tenants (a list, or [\"*\"])", i, tok.Name)
		case seen[tok.Token]:
			return nil, fmt.Errorf("tokens[%d] (%s): token is used twice", i, tok.Name)
		}
		seen[tok.Token] = true
		names[tok.Name] = i
		t.roles[tok.Name] = tok.Role
		t.entries = append(t.entries, tokenEntry{hash: sha256.Sum256([]byte(tok.Token)),
			caller: Caller{Name: tok.Name, Role: tok.Role, Tenants: tok.Tenants}})
	}
	return t, nil
}

// RoleOf returns the role of the token named name, if one is configured.
func (t *Tokens) RoleOf(name string) (Role, bool) {
	r, ok := t.roles[name]
	return r, ok
}

// Authenticate returns the caller of r's bearer token. Every configured token is compared, in
// constant time over equal-length hashes, so timing tells nothing about which one nearly matched.
func (t *Tokens) Authenticate(r *http.Request) (Caller, bool) {
	// The scheme is case-insensitive (RFC 9110 §11.1): "bearer" is as good as "Bearer".
	scheme, raw, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	raw = strings.TrimSpace(raw)
	if !ok || !strings.EqualFold(scheme, "Bearer") || raw == "" {
		return Caller{}, false
	}
	sum := sha256.Sum256([]byte(raw))
	var found Caller
	match := 0
	for _, e := range t.entries {
		if subtle.ConstantTimeCompare(sum[:], e.hash[:]) == 1 {
			found = e.caller
			match = 1
		}
	}
	return found, match == 1
}
