// Package limits is sluice's runtime configuration (SPEC §9): the caps, depths, timeouts and
// modes that an operator changes without a restart. Every version is a row in config_versions,
// so the table is its own history; the newest row is in force. A database with no row runs on
// Default().
package limits

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/gate/sqldb"
)

// Ordering is how the drainer picks among tenants with eligible work (SPEC §5).
type Ordering string

// The orderings of SPEC §5.
const (
	// Fair: the tenant with the fewest jobs in flight first, ties by the oldest eligible job.
	Fair Ordering = "fair"
	// FIFO: the oldest eligible job first.
	FIFO Ordering = "fifo"
	// RoundRobin: tenants in turn.
	RoundRobin Ordering = "round_robin"
)

// Admission rollout modes (SPEC §5).
const (
	ModeEnforce = "enforce"
	ModeShadow  = "shadow"
	ModeOff     = "off"
)

// Config is the runtime configuration. Field docs give the default.
type Config struct {
	// GlobalInFlight caps jobs in flight across all tenants. Default 4; 0 pauses dispatch.
	GlobalInFlight int `json:"global_in_flight"`
	// TenantInFlight caps one tenant's jobs in flight. Default 2.
	TenantInFlight int `json:"tenant_in_flight"`
	// TenantInFlightOverrides maps a tenant to its own cap. Default empty.
	TenantInFlightOverrides map[string]int `json:"tenant_in_flight_overrides"`
	// TenantQueueDepth is the per-tenant queued depth at which admission refuses. Default 500.
	TenantQueueDepth int `json:"tenant_queue_depth"`
	// GlobalQueueDepth is the total queued depth at which admission refuses. Default 2000.
	GlobalQueueDepth int `json:"global_queue_depth"`
	// AdmissionMode is enforce, shadow or off. Default enforce.
	AdmissionMode string `json:"admission_mode"`
	// AdmissionRatePerMinute limits admissions per tenant per minute. Default 0 (off).
	AdmissionRatePerMinute int `json:"admission_rate_per_minute"`
	// Ordering is fair, fifo or round_robin. Default fair.
	Ordering Ordering `json:"ordering"`
	// ExecutionWallSeconds bounds dispatch to outcome. Default 310.
	ExecutionWallSeconds int `json:"execution_wall_seconds"`
	// MaxQueueAgeSeconds expires jobs queued longer than this. Default 0 (never).
	MaxQueueAgeSeconds int `json:"max_queue_age_seconds"`
	// LeaseSeconds is the claim lease, renewed at most every third of it. Default 10.
	LeaseSeconds int `json:"lease_seconds"`
	// NonceTTLSeconds is the time from minting in which /start is accepted. Default 300.
	NonceTTLSeconds int `json:"nonce_ttl_seconds"`
	// DispatchAttempts is the budget of never-started dispatch failures. Default 3.
	DispatchAttempts int `json:"dispatch_attempts"`
	// MaxPayloadBytes is the admission payload limit, at most MaxPayloadCap. Default 262144.
	MaxPayloadBytes int `json:"max_payload_bytes"`
	// RetentionDays is how long terminal jobs are kept. Default 90.
	RetentionDays int `json:"retention_days"`
	// OutboxRetentionDays is how long published outbox rows are kept. Default 7.
	OutboxRetentionDays int `json:"outbox_retention_days"`
	// AuditRetentionDays is how long audit events are kept. Default 30.
	AuditRetentionDays int `json:"audit_retention_days"`
}

// Default returns a fresh default configuration.
func Default() Config {
	return Config{
		GlobalInFlight:          4,
		TenantInFlight:          2,
		TenantInFlightOverrides: map[string]int{},
		TenantQueueDepth:        500,
		GlobalQueueDepth:        2000,
		AdmissionMode:           ModeEnforce,
		Ordering:                Fair,
		ExecutionWallSeconds:    310,
		LeaseSeconds:            10,
		NonceTTLSeconds:         300,
		DispatchAttempts:        3,
		MaxPayloadBytes:         262144,
		RetentionDays:           90,
		OutboxRetentionDays:     7,
		AuditRetentionDays:      30,
	}
}

// TenantCap returns the in-flight cap of tenant.
func (c Config) TenantCap(tenant string) int {
	if n, ok := c.TenantInFlightOverrides[tenant]; ok {
		return n
	}
	return c.TenantInFlight
}

// Lease returns the lease duration.
func (c Config) Lease() time.Duration { return time.Duration(c.LeaseSeconds) * time.Second }

// Wall returns the execution wall.
func (c Config) Wall() time.Duration { return time.Duration(c.ExecutionWallSeconds) * time.Second }

// NonceTTL returns the nonce TTL.
func (c Config) NonceTTL() time.Duration { return time.Duration(c.NonceTTLSeconds) * time.Second }

// Validate returns a *FieldError naming the first invalid key and why.
func (c Config) Validate() error {
	nonNeg := []struct {
		key string
		v   int
	}{
		{"global_in_flight", c.GlobalInFlight},
		{"tenant_in_flight", c.TenantInFlight},
		{"tenant_queue_depth", c.TenantQueueDepth},
		{"global_queue_depth", c.GlobalQueueDepth},
		{"admission_rate_per_minute", c.AdmissionRatePerMinute},
		{"max_queue_age_seconds", c.MaxQueueAgeSeconds},
	}
	for _, f := range nonNeg {
		if f.v < 0 {
			return invalidf(f.key, "must be 0 or more, got %d", f.v)
		}
	}
	positive := []struct {
		key string
		v   int
	}{
		{"execution_wall_seconds", c.ExecutionWallSeconds},
		{"lease_seconds", c.LeaseSeconds},
		{"nonce_ttl_seconds", c.NonceTTLSeconds},
		{"dispatch_attempts", c.DispatchAttempts},
		{"max_payload_bytes", c.MaxPayloadBytes},
		{"retention_days", c.RetentionDays},
		{"outbox_retention_days", c.OutboxRetentionDays},
		{"audit_retention_days", c.AuditRetentionDays},
	}
	for _, f := range positive {
		if f.v <= 0 {
			return invalidf(f.key, "must be at least 1, got %d", f.v)
		}
	}
	for t, n := range c.TenantInFlightOverrides {
		if n < 0 {
			return invalidf("tenant_in_flight_overrides", "tenant %q: must be 0 or more, got %d", t, n)
		}
	}
	switch c.AdmissionMode {
	case ModeEnforce, ModeShadow, ModeOff:
	default:
		return invalidf("admission_mode", "must be enforce, shadow or off, got %q", c.AdmissionMode)
	}
	switch c.Ordering {
	case Fair, FIFO, RoundRobin:
	default:
		return invalidf("ordering", "must be fair, fifo or round_robin, got %q", c.Ordering)
	}
	if c.MaxPayloadBytes > MaxPayloadCap {
		return invalidf("max_payload_bytes", "at most %d (what one statement to the database can carry), got %d", MaxPayloadCap, c.MaxPayloadBytes)
	}
	return nil
}

// MaxPayloadCap bounds max_payload_bytes. A payload, or an executor's result (which may be as
// large), travels inside one statement, escaped, so at up to twice its size: the statement
// must fit the server's max_allowed_packet (16 MiB on MariaDB by default), or the server
// drops the connection and the request fails. At 16 MiB (the column's size, less one byte)
// such payloads were admitted by the configuration and refused by the database as an internal
// error; 4 MiB keeps the worst case at about half MariaDB's default packet.
const MaxPayloadCap = 4 << 20

// Versioned is a configuration with its version (0: never changed, the defaults).
type Versioned struct {
	Version int64
	Config  Config
}

// Load reads the configuration in force. Inside a claim transaction this is what makes a change
// apply to the very next claim.
func Load(ctx context.Context, q sqldb.DB) (Versioned, error) {
	var v Versioned
	var raw string
	err := q.QueryRowContext(ctx, "SELECT version, config FROM config_versions ORDER BY version DESC LIMIT 1").Scan(&v.Version, &raw)
	if errors.Is(err, sql.ErrNoRows) {
		return Versioned{Config: Default()}, nil
	}
	if err != nil {
		return v, fmt.Errorf("load runtime config: %w", err)
	}
	cfg, err := Decode([]byte(raw))
	if err != nil {
		return v, fmt.Errorf("load runtime config version %d: %w", v.Version, err)
	}
	v.Config = cfg
	return v, nil
}

// Decode parses a stored configuration over the defaults, so that keys added by a later release
// take their defaults.
func Decode(raw []byte) (Config, error) {
	cfg := Default()
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return cfg, fmt.Errorf("decode runtime config: %w", err)
	}
	if cfg.TenantInFlightOverrides == nil {
		cfg.TenantInFlightOverrides = map[string]int{}
	}
	return cfg, nil
}
