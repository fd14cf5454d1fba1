// Package config is sluice's runtime configuration (SPEC §9): the caps, depths, timeouts and
// modes that an operator changes without a restart. Every version is a row in config_versions,
// so the table is its own history; the newest row is in force. A database with no row runs on
// Default().
package config

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
	// FairTime: the tenant furthest below its weighted share of executor time first: the time
	// its jobs used from start to outcome over FairTimeWindow, and its jobs in flight so far,
	// plus FairTimeHorizon for each unit it holds, divided by its weight; ties by the oldest
	// eligible job.
	FairTime Ordering = "fair_time"
)

// FairTimeWindow is fair_time's sliding window: time used counts with the weight e^(-age/window),
// so that a minute ago counts about a third as much as now.
const FairTimeWindow = time.Minute

// FairTimeHorizon is what fair_time charges ahead for each unit a tenant holds, beside the time
// its jobs in flight have run so far: a job just started has run nothing, so without it one pass
// would give every free unit to the tenant furthest behind.
const FairTimeHorizon = 250 * time.Millisecond

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
	// Ordering is fair, fair_time, fifo or round_robin. Default fair.
	Ordering Ordering `json:"ordering"`
	// ExecutionWallSeconds bounds dispatch to outcome, at most MaxSeconds. Default 310.
	ExecutionWallSeconds int `json:"execution_wall_seconds"`
	// MaxQueueAgeSeconds expires jobs queued longer than this, at most MaxSeconds. Default 0
	// (never).
	MaxQueueAgeSeconds int `json:"max_queue_age_seconds"`
	// LeaseSeconds is the claim lease, renewed at most every third of it, at most MaxSeconds.
	// Default 10.
	LeaseSeconds int `json:"lease_seconds"`
	// NonceTTLSeconds is the time from minting in which /start is accepted, at most MaxSeconds.
	// Default 300.
	NonceTTLSeconds int `json:"nonce_ttl_seconds"`
	// DispatchAttempts is the budget of never-started dispatch failures. Default 3.
	DispatchAttempts int `json:"dispatch_attempts"`
	// MaxPayloadBytes is the admission payload limit, at most MaxPayloadCap. Default 262144.
	MaxPayloadBytes int `json:"max_payload_bytes"`
	// RetentionDays is how long terminal jobs are kept, at most MaxDays. Default 90.
	RetentionDays int `json:"retention_days"`
	// OutboxRetentionDays is how long published outbox rows are kept, at most MaxDays. Default 7.
	OutboxRetentionDays int `json:"outbox_retention_days"`
	// AuditRetentionDays is how long audit events are kept, at most MaxDays. Default 30.
	AuditRetentionDays int `json:"audit_retention_days"`
	// Lanes maps a lane name to its cluster-wide in-flight limit (SPEC §5a). Default empty.
	Lanes map[string]int `json:"lanes"`
	// TenantTiers maps a tenant to its tier; a tenant not named is in DefaultTier.
	TenantTiers map[string]string `json:"tenant_tiers"`
	// TierInFlight maps a tier to a ceiling on the in flight of all its tenants together.
	TierInFlight map[string]int `json:"tier_in_flight"`
	// TierTenantInFlight maps a tier to the per-tenant cap of its tenants (an override still
	// wins).
	TierTenantInFlight map[string]int `json:"tier_tenant_in_flight"`
	// InteractiveReserve is how many of the global units only interactive work may take.
	// Default 0.
	InteractiveReserve int `json:"interactive_reserve"`
	// EnforceFor is all or aware: with aware, only requests that say they handle a refusal
	// (Sluice-Capacity-Aware: true) are refused; others are treated as in shadow. Default all.
	EnforceFor string `json:"enforce_for"`
	// TenantWeights maps a tenant to its weight under fair ordering. Default empty (weight 1).
	TenantWeights map[string]float64 `json:"tenant_weights"`
	// TierWeights maps a tier to the weight of each of its tenants (a tenant's own weight wins).
	TierWeights map[string]float64 `json:"tier_weights"`
	// PriorityAgingSeconds: a queued job waiting longer goes as if at the top priority, so that
	// no priority starves; at most MaxSeconds. Default 300.
	PriorityAgingSeconds int `json:"priority_aging_seconds"`
}

// EnforceFor values (SPEC §5a).
const (
	EnforceAll   = "all"
	EnforceAware = "aware"
)

// DefaultTier is the tier of a tenant that tenant_tiers does not name.
const DefaultTier = "default"

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
		Lanes:                   map[string]int{},
		TenantTiers:             map[string]string{},
		TierInFlight:            map[string]int{},
		TierTenantInFlight:      map[string]int{},
		EnforceFor:              EnforceAll,
		TenantWeights:           map[string]float64{},
		TierWeights:             map[string]float64{},
		PriorityAgingSeconds:    300,
	}
}

// TenantCap returns the in-flight cap of tenant: its override, else its tier's per-tenant cap,
// else tenant_in_flight.
func (c Config) TenantCap(tenant string) int {
	if n, ok := c.TenantInFlightOverrides[tenant]; ok {
		return n
	}
	if n, ok := c.TierTenantInFlight[c.Tier(tenant)]; ok {
		return n
	}
	return c.TenantInFlight
}

// Weight returns the weight of tenant under fair ordering: its own, else its tier's, else 1.
func (c Config) Weight(tenant string) float64 {
	if w, ok := c.TenantWeights[tenant]; ok {
		return w
	}
	if w, ok := c.TierWeights[c.Tier(tenant)]; ok {
		return w
	}
	return 1
}

// FairBefore reports whether tenant a, with na units in flight, goes strictly before tenant b,
// with nb, in fair order: the lower in flight ÷ weight first (SPEC §5). Equal shares tie, and
// the caller breaks the tie by the oldest job. The products compare the shares without dividing,
// so equal weights decide exactly as the counts do.
func (c Config) FairBefore(a string, na int, b string, nb int) bool {
	if len(c.TenantWeights) == 0 && len(c.TierWeights) == 0 {
		return na < nb
	}
	return float64(na)*c.Weight(b) < float64(nb)*c.Weight(a)
}

// MaxWeight bounds a weight: a million times the default is a tenant that goes first whenever
// it has work, which is as far as a share can mean anything.
const MaxWeight = 1e6

// MinWeight bounds a weight from below, for the same reason.
const MinWeight = 1e-6

// Tier returns the tier of tenant.
func (c Config) Tier(tenant string) string {
	if t, ok := c.TenantTiers[tenant]; ok {
		return t
	}
	return DefaultTier
}

// MaxDays bounds the *_days keys: 100 years, which is "keep for ever" in practice. A day count
// becomes a time.Duration, nanoseconds in an int64 (about 292 years), and a purge cutoff in a
// DATETIME column: 213,504 days, an operator's "never purge", wrapped to 25 minutes and purged
// every finished job and audit event at once.
const MaxDays = 36500

// MaxSeconds bounds the *_seconds keys: a year. Past it an execution wall, lease, nonce TTL or
// queue age means nothing a queue can act on (0 already turns the queue age off), and far past
// it the conversion to a time.Duration overflows into a small or negative one.
const MaxSeconds = 365 * 24 * 60 * 60

// days and seconds convert a key's value, saturating at its bound: Validate refuses more, but a
// configuration stored before the bounds existed is read without validation, and must not wrap.
func days(n int) time.Duration    { return time.Duration(min(n, MaxDays)) * 24 * time.Hour }
func seconds(n int) time.Duration { return time.Duration(min(n, MaxSeconds)) * time.Second }

// Lease returns the lease duration.
func (c Config) Lease() time.Duration { return seconds(c.LeaseSeconds) }

// Wall returns the execution wall.
func (c Config) Wall() time.Duration { return seconds(c.ExecutionWallSeconds) }

// PriorityAging returns priority_aging_seconds as a duration.
func (c Config) PriorityAging() time.Duration { return seconds(c.PriorityAgingSeconds) }

// NonceTTL returns the nonce TTL.
func (c Config) NonceTTL() time.Duration { return seconds(c.NonceTTLSeconds) }

// MaxQueueAge returns the age past which a queued job expires; 0 (or less) means never.
func (c Config) MaxQueueAge() time.Duration { return seconds(c.MaxQueueAgeSeconds) }

// Retention returns how long terminal jobs are kept.
func (c Config) Retention() time.Duration { return days(c.RetentionDays) }

// OutboxRetention returns how long published outbox rows are kept.
func (c Config) OutboxRetention() time.Duration { return days(c.OutboxRetentionDays) }

// AuditRetention returns how long audit events are kept.
func (c Config) AuditRetention() time.Duration { return days(c.AuditRetentionDays) }

// Validate returns a *FieldError naming the first invalid key and why.
func (c Config) Validate() error {
	if err := c.validateNumbers(); err != nil {
		return err
	}
	if err := c.validateMaps(); err != nil {
		return err
	}
	if err := c.validateChoices(); err != nil {
		return err
	}
	if c.MaxPayloadBytes > MaxPayloadCap {
		return invalidf("max_payload_bytes", "at most %d (what one statement to the database can carry), got %d", MaxPayloadCap, c.MaxPayloadBytes)
	}
	return nil
}

// validateNumbers checks the plain numbers: those that may be 0, those that may not, and those
// bounded by a year or a century.
func (c Config) validateNumbers() error {
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
		{"interactive_reserve", c.InteractiveReserve},
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
		{"priority_aging_seconds", c.PriorityAgingSeconds},
	}
	for _, f := range positive {
		if f.v <= 0 {
			return invalidf(f.key, "must be at least 1, got %d", f.v)
		}
	}
	bounded := []struct {
		key  string
		v    int
		max  int
		unit string
	}{
		{"execution_wall_seconds", c.ExecutionWallSeconds, MaxSeconds, "seconds (a year)"},
		{"max_queue_age_seconds", c.MaxQueueAgeSeconds, MaxSeconds, "seconds (a year; 0 turns it off)"},
		{"lease_seconds", c.LeaseSeconds, MaxSeconds, "seconds (a year)"},
		{"nonce_ttl_seconds", c.NonceTTLSeconds, MaxSeconds, "seconds (a year)"},
		{"priority_aging_seconds", c.PriorityAgingSeconds, MaxSeconds, "seconds (a year)"},
		{"retention_days", c.RetentionDays, MaxDays, "days (100 years)"},
		{"outbox_retention_days", c.OutboxRetentionDays, MaxDays, "days (100 years)"},
		{"audit_retention_days", c.AuditRetentionDays, MaxDays, "days (100 years)"},
	}
	for _, f := range bounded {
		if f.v > f.max {
			return invalidf(f.key, "at most %d %s, got %d", f.max, f.unit, f.v)
		}
	}
	return nil
}

// validateMaps checks the per-tenant, per-lane and per-tier maps: their names and their values.
func (c Config) validateMaps() error {
	for t, n := range c.TenantInFlightOverrides {
		if n < 0 {
			return invalidf("tenant_in_flight_overrides", "tenant %q: must be 0 or more, got %d", t, n)
		}
	}
	for _, m := range []struct {
		key string
		v   map[string]int
	}{{"lanes", c.Lanes}, {"tier_in_flight", c.TierInFlight}, {"tier_tenant_in_flight", c.TierTenantInFlight}} {
		for name, n := range m.v {
			if err := validName(name); err != "" {
				return invalidf(m.key, "name %q: %s", name, err)
			}
			if n < 0 {
				return invalidf(m.key, "%q: must be 0 or more, got %d", name, n)
			}
		}
	}
	for _, m := range []struct {
		key string
		v   map[string]float64
	}{{"tenant_weights", c.TenantWeights}, {"tier_weights", c.TierWeights}} {
		for name, w := range m.v {
			if m.key == "tier_weights" {
				if err := validName(name); err != "" {
					return invalidf(m.key, "name %q: %s", name, err)
				}
			}
			if !(w >= MinWeight && w <= MaxWeight) {
				return invalidf(m.key, "%q: must be a number from %g to %g, got %g", name, MinWeight, MaxWeight, w)
			}
		}
	}
	for t, tier := range c.TenantTiers {
		if err := validName(tier); err != "" {
			return invalidf("tenant_tiers", "tenant %q: tier %q: %s", t, tier, err)
		}
	}
	return nil
}

// validateChoices checks the keys that take one of a few words.
func (c Config) validateChoices() error {
	switch c.EnforceFor {
	case EnforceAll, EnforceAware:
	default:
		return invalidf("enforce_for", "must be all or aware, got %q", c.EnforceFor)
	}
	switch c.AdmissionMode {
	case ModeEnforce, ModeShadow, ModeOff:
	default:
		return invalidf("admission_mode", "must be enforce, shadow or off, got %q", c.AdmissionMode)
	}
	switch c.Ordering {
	case Fair, FIFO, RoundRobin, FairTime:
	default:
		return invalidf("ordering", "must be fair, fair_time, fifo or round_robin, got %q", c.Ordering)
	}
	return nil
}

// MaxNameBytes bounds a lane or tier name.
const MaxNameBytes = 64

// validName says what is wrong with a lane or tier name, or "" if nothing: 1 to 64 bytes of
// letters, digits, '-', '_' and '.', so a name is safe in a header, a metric label and a scope
// ("lane:<name>").
func validName(n string) string {
	if n == "" || len(n) > MaxNameBytes {
		return fmt.Sprintf("must be 1 to %d bytes", MaxNameBytes)
	}
	for _, r := range n {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return "may hold only letters, digits, '-', '_' and '.'"
		}
	}
	return ""
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
	cfg.fillDefaults()
	return cfg, nil
}

// fillDefaults gives empty maps for maps stored as null, and the default enforce_for to a
// configuration stored before it existed.
func (c *Config) fillDefaults() {
	if c.TenantInFlightOverrides == nil {
		c.TenantInFlightOverrides = map[string]int{}
	}
	if c.Lanes == nil {
		c.Lanes = map[string]int{}
	}
	if c.TenantTiers == nil {
		c.TenantTiers = map[string]string{}
	}
	if c.TierInFlight == nil {
		c.TierInFlight = map[string]int{}
	}
	if c.TierTenantInFlight == nil {
		c.TierTenantInFlight = map[string]int{}
	}
	if c.EnforceFor == "" {
		c.EnforceFor = EnforceAll
	}
	if c.TenantWeights == nil {
		c.TenantWeights = map[string]float64{}
	}
	if c.TierWeights == nil {
		c.TierWeights = map[string]float64{}
	}
}
