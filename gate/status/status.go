// Package status reads what an operator needs to see at a glance (SPEC §6 GET /v1/status, §13
// scenario 8): queue depth and age overall and per tenant, in-flight counts and caps, gated rate
// keys, drainer heartbeats with a state derived at read time, the outbox backlog, the broker and
// memcached, and the runtime config version in force. Everything is read from the database (the
// truth) at call time; nothing is cached, so two readers agree.
package status

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/recent"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/outbox"
)

// Drainer states (SPEC §6).
const (
	// Active: the drainer has work in flight or claimed within its last poll period, or the
	// fleet has work in flight and the queue waits only for that capacity.
	Active = "active"
	// Idle: no queued work.
	Idle = "idle"
	// Gated: queued work exists but none of it may start now: every queued job's rate key is
	// gated or its own not-before is in the future, or the caps are 0 (paused).
	Gated = "gated"
	// Stalled: no heartbeat for 3 poll periods, or eligible work with free capacity left
	// unclaimed for StallAfter.
	Stalled = "stalled"
)

// RateGates reads rate gates; a gate store (memcached) implements it. NotBefore returns the gate
// instant of each gated key among hashes, and fails open: what it could read and an error.
type RateGates interface {
	NotBefore(ctx context.Context, hashes []string) (map[string]time.Time, error)
}

// Config configures a Reader. Field docs give the defaults.
type Config struct {
	// DB is the sluice database. Required.
	DB *sql.DB
	// Limits is the process's runtime config cache, for config.version and config.stale.
	// Default: the version is read from the database and stale is false.
	Limits *config.Cache
	// RateGates, if set, is asked which queued rate keys are gated. Nil: no gates.
	RateGates RateGates
	// BrokerConnected reports whether this process's NATS connection is up. Nil: false.
	BrokerConnected func() bool
	// MemcachedReachable reports whether the gate store answers. Nil: false.
	MemcachedReachable func(ctx context.Context) bool
	// Clock is "now". Default: the database's clock, the one leases are judged by.
	Clock clock.Clock
	// StallAfter is how long eligible work with free capacity may stay unclaimed before the
	// drainers are reported stalled. Default 5 s (SPEC §6).
	StallAfter time.Duration
	// GoneAfter hides drainers whose last heartbeat is older than this: a drainer killed and
	// restarted under a new id leaves its old row behind. Default 10 min.
	GoneAfter time.Duration
	// HeadsPerTenant bounds how many queued jobs per tenant are inspected to decide whether
	// work is eligible (gated keys at the head hide the rest beyond it). Default 16.
	HeadsPerTenant int
	// MaxTenants is how many tenants' queue heads are inspected for eligibility, those whose
	// oldest queued job is oldest and below their cap first: a fixed number of sub-selects in
	// one statement, whatever the number of tenants with work. Default 100.
	MaxTenants int
	// ListTenants is how many of the deepest tenants Read lists (SPEC §6: the 100 deepest; all
	// of them at Tenants). Default 100.
	ListTenants int
	// Recent is this process's window of job ends and dispatch waits (store.Metrics.Recent),
	// served as Status.Recent. Nil: an empty series.
	Recent *recent.Window
}

// Reader reads the status. Safe for concurrent use.
type Reader struct {
	cfg   Config
	heads *store.HeadsRead
}

// New returns a Reader, or an "invalid config" error naming the field.
func New(cfg Config) (*Reader, error) {
	if cfg.DB == nil {
		return nil, errors.New("invalid config: DB: required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.DB{DB: cfg.DB}
	}
	if cfg.StallAfter <= 0 {
		cfg.StallAfter = 5 * time.Second
	}
	if cfg.GoneAfter <= 0 {
		cfg.GoneAfter = 10 * time.Minute
	}
	if cfg.HeadsPerTenant <= 0 {
		cfg.HeadsPerTenant = 16
	}
	if cfg.MaxTenants <= 0 {
		cfg.MaxTenants = 100
	}
	if cfg.ListTenants <= 0 {
		cfg.ListTenants = 100
	}
	return &Reader{cfg: cfg, heads: store.NewHeadsRead(cfg.MaxTenants)}, nil
}

// Status is the body of GET /v1/status (SPEC §6).
type Status struct {
	Queue    Queue `json:"queue"`
	InFlight int   `json:"in_flight"`
	// TenantsWithWork counts the tenants with queued jobs; Tenants lists the deepest of them.
	TenantsWithWork int       `json:"tenants_with_work"`
	Tenants         []Tenant  `json:"tenants"`
	Gates           []Gate    `json:"gates"`
	Drainers        []Drainer `json:"drainers"`
	Outbox          Outbox    `json:"outbox"`
	Broker          Broker    `json:"broker"`
	Memcached       Memcached `json:"memcached"`
	Config          ConfigRef `json:"config"`
	// Caps are the limits in force that in_flight and queue.depth are measured against.
	Caps Caps `json:"caps"`
	// Slots are the live slots (SPEC §5a), which count against the caps with in_flight.
	Slots Slots `json:"slots"`
	// Lanes are the configured lanes with their limits and what is in flight in each (SPEC §5a):
	// jobs and live slots.
	Lanes map[string]LaneUse `json:"lanes"`
	// Recent is the last minutes of job ends and dispatch waits as this process saw them (the
	// API's completions and cancels, and its drainer's outcomes when it runs one).
	Recent recent.Series `json:"recent"`
	// At is the database time the status was read at.
	At time.Time `json:"at"`
}

// Slots are the live slots, in total and by tier and lane (a slot naming two lanes counts in
// both). Per tenant, they are each Tenant's Slots.
type Slots struct {
	Total  int            `json:"total"`
	ByTier map[string]int `json:"by_tier"`
	ByLane map[string]int `json:"by_lane"`
}

// Caps are the runtime config's global and default per-tenant limits (SPEC §9).
type Caps struct {
	GlobalInFlight   int `json:"global_in_flight"`
	TenantInFlight   int `json:"tenant_in_flight"`
	GlobalQueueDepth int `json:"global_queue_depth"`
	TenantQueueDepth int `json:"tenant_queue_depth"`
}

// LaneUse is one lane's limit and what is in flight in it: jobs and live slots.
type LaneUse struct {
	Limit    int `json:"limit"`
	InFlight int `json:"in_flight"`
}

// lanes returns every lane cfg configures with what is in flight in it: jobs, the jobs in flight
// (store.ReadInFlightUsage), read only when a lane is configured, and slots, the live slots by
// lane.
func (r *Reader) lanes(ctx context.Context, cfg config.Config, jobs *config.Usage, slots map[string]int) (map[string]LaneUse, error) {
	out := make(map[string]LaneUse, len(cfg.Lanes))
	if len(cfg.Lanes) == 0 {
		return out, nil
	}
	if jobs == nil {
		us, err := store.ReadInFlightUsage(ctx, r.cfg.DB, cfg)
		if err != nil {
			return nil, fmt.Errorf("status: %w", err)
		}
		jobs = &us
	}
	for l, n := range cfg.Lanes {
		out[l] = LaneUse{Limit: n, InFlight: jobs.Lane[l] + slots[l]}
	}
	return out, nil
}

// Queue is the whole queue.
type Queue struct {
	Depth            int     `json:"depth"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
}

// Tenant is one tenant with queued or in-flight work. Tenants are sorted by depth, deepest
// first, then by in flight, most first, then by name.
type Tenant struct {
	Tenant           string  `json:"tenant"`
	Depth            int     `json:"depth"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	InFlight         int     `json:"in_flight"`
	Cap              int     `json:"cap"`
	// Slots are the tenant's live slots; they count against its cap with InFlight.
	Slots int `json:"slots"`
	// Tier is the tenant's tier (runtime config tenant_tiers).
	Tier string `json:"tier"`
	// Weight is the tenant's weight under fair ordering (tenant_weights, tier_weights; 1).
	Weight float64 `json:"weight"`
}

// Gate is a gated rate key among the keys of queued jobs.
type Gate struct {
	RateKeySHA256 string    `json:"rate_key_sha256"`
	NotBefore     time.Time `json:"not_before"`
	Queued        int       `json:"queued"`
}

// Drainer is one drainer's heartbeat and derived state.
type Drainer struct {
	ID                  string   `json:"id"`
	Host                string   `json:"host"`
	PID                 int      `json:"pid"`
	Version             string   `json:"version"`
	State               string   `json:"state"`
	HeartbeatAgeSeconds float64  `json:"heartbeat_age_seconds"`
	LastClaimAgeSeconds *float64 `json:"last_claim_age_seconds"`
	InFlight            int      `json:"in_flight"`
	PollIntervalSeconds float64  `json:"poll_interval_seconds"`
	// Reason says why a drainer is stalled or gated, in words.
	Reason string `json:"reason,omitempty"`
}

// Outbox is the relay's backlog.
type Outbox struct {
	Unpublished                 int64   `json:"unpublished"`
	OldestUnpublishedAgeSeconds float64 `json:"oldest_unpublished_age_seconds"`
}

// Broker is this process's NATS connection.
type Broker struct {
	Connected bool `json:"connected"`
}

// Memcached is the gate store.
type Memcached struct {
	Reachable bool `json:"reachable"`
}

// ConfigRef is the runtime config version this process runs on.
type ConfigRef struct {
	Version int64 `json:"version"`
	Stale   bool  `json:"stale"`
}

// Read reads the status. It fails only if the database cannot be read; an unreachable gate store
// reads as "no gates" (the drainer fails open the same way).
func (r *Reader) Read(ctx context.Context) (Status, error) {
	var s Status
	now, err := r.cfg.Clock.Now(ctx)
	if err != nil {
		return s, err
	}
	s.At = now
	cfg, err := r.config(ctx, &s)
	if err != nil {
		return s, err
	}
	s.Caps = Caps{GlobalInFlight: cfg.GlobalInFlight, TenantInFlight: cfg.TenantInFlight,
		GlobalQueueDepth: cfg.GlobalQueueDepth, TenantQueueDepth: cfg.TenantQueueDepth}
	s.Recent = r.cfg.Recent.Series(now)
	inFlight, err := r.inFlight(ctx, now, cfg)
	if err != nil {
		return s, err
	}
	for _, t := range inFlight {
		s.InFlight += t.InFlight
	}
	slots, perTenant, err := r.slots(ctx, cfg)
	if err != nil {
		return s, err
	}
	s.Slots = slots
	if s.Lanes, err = r.lanes(ctx, cfg, nil, slots.ByLane); err != nil {
		return s, err
	}
	if err := r.totals(ctx, now, &s); err != nil {
		return s, err
	}
	deepest, err := r.deepest(ctx, now, cfg, nil, r.cfg.ListTenants)
	if err != nil {
		return s, err
	}
	s.Tenants = listTenants(cfg, deepest, inFlight, perTenant, r.cfg.ListTenants)
	gated, err := r.gates(ctx, now, &s)
	if err != nil {
		return s, err
	}
	// Live slots take capacity as jobs in flight do: work left queued behind them is not a
	// stalled drainer's.
	units := withSlots(inFlight, perTenant)
	elig, err := r.eligible(ctx, now, cfg, s.InFlight+s.Slots.Total, units, gated)
	if err != nil {
		return s, err
	}
	if err := r.drainers(ctx, now, cfg, &s, elig); err != nil {
		return s, err
	}
	ob, err := outbox.ReadStats(ctx, r.cfg.DB, now)
	if err != nil {
		return s, fmt.Errorf("status: %w", err)
	}
	s.Outbox = Outbox{Unpublished: ob.Unpublished, OldestUnpublishedAgeSeconds: ob.OldestAgeSeconds}
	local := r.Local(ctx)
	s.Broker, s.Memcached = local.Broker, local.Memcached
	if r.cfg.Limits != nil {
		s.Config = local.Config
	}
	return s, nil
}

// listTenants is the status's tenants: the deepest, those with work in flight (as many as the
// global cap allows) and those holding slots only, the deepest most of them, depth first, then
// in flight, then name.
func listTenants(cfg config.Config, deepest, inFlight []Tenant, slots map[string]int, most int) []Tenant {
	byTenant := make(map[string]Tenant, len(deepest)+len(inFlight))
	for _, t := range deepest {
		byTenant[t.Tenant] = t
	}
	for _, t := range inFlight {
		byTenant[t.Tenant] = t
	}
	for name, n := range slots {
		t, ok := byTenant[name]
		if !ok {
			t = Tenant{Tenant: name, Cap: cfg.TenantCap(name), Tier: cfg.Tier(name), Weight: cfg.Weight(name)}
		}
		t.Slots = n
		byTenant[name] = t
	}
	ts := make([]Tenant, 0, len(byTenant))
	for _, t := range byTenant {
		ts = append(ts, t)
	}
	sort.Slice(ts, func(i, j int) bool {
		a, b := ts[i], ts[j]
		if a.Depth != b.Depth {
			return a.Depth > b.Depth
		}
		if a.InFlight != b.InFlight {
			return a.InFlight > b.InFlight
		}
		return a.Tenant < b.Tenant
	})
	if len(ts) > most {
		ts = ts[:most]
	}
	return ts
}

// withSlots is each tenant's units in use: its jobs in flight and its live slots.
func withSlots(inFlight []Tenant, slots map[string]int) []Tenant {
	units := make([]Tenant, 0, len(inFlight)+len(slots))
	seen := make(map[string]bool, len(inFlight))
	for _, t := range inFlight {
		t.InFlight += slots[t.Tenant]
		units = append(units, t)
		seen[t.Tenant] = true
	}
	for name, n := range slots {
		if !seen[name] {
			units = append(units, Tenant{Tenant: name, InFlight: n})
		}
	}
	return units
}

// Local returns what this process knows without the database: its broker connection, the gate
// store's reachability and the config version it runs on (stale when its re-reads fail). The
// metrics report these even while the database is down, which is when they matter.
func (r *Reader) Local(ctx context.Context) Status {
	var s Status
	if r.cfg.BrokerConnected != nil {
		s.Broker.Connected = r.cfg.BrokerConnected()
	}
	if r.cfg.MemcachedReachable != nil {
		s.Memcached.Reachable = r.cfg.MemcachedReachable(ctx)
	}
	if r.cfg.Limits != nil {
		s.Config = ConfigRef{Version: r.cfg.Limits.Current().Version, Stale: r.cfg.Limits.Stale()}
	}
	return s
}

// config returns the configuration the drainers claim under (the newest row: claims read it in
// their own transaction) and fills s.Config with this process's view.
func (r *Reader) config(ctx context.Context, s *Status) (config.Config, error) {
	v, err := config.Load(ctx, r.cfg.DB)
	if err != nil {
		return config.Config{}, fmt.Errorf("status: %w", err)
	}
	s.Config = ConfigRef{Version: v.Version}
	return v.Config, nil
}

// maxRateKeys bounds the queued rate keys looked up in the gate store per read.
const maxRateKeys = 10000

// gates fills s.Gates with the gated keys among the rate keys of queued jobs and returns them.
func (r *Reader) gates(ctx context.Context, now time.Time, s *Status) (map[string]time.Time, error) {
	s.Gates = []Gate{}
	if r.cfg.RateGates == nil {
		return nil, nil
	}
	counts, err := store.QueuedRateKeys(ctx, r.cfg.DB, maxRateKeys)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	if len(counts) == 0 {
		return nil, nil
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	nb, _ := r.cfg.RateGates.NotBefore(ctx, keys) // fails open, like the drainer
	gated := map[string]time.Time{}
	for k, t := range nb {
		if t.After(now) {
			gated[k] = t
			s.Gates = append(s.Gates, Gate{RateKeySHA256: k, NotBefore: t.UTC(), Queued: int(counts[k])})
		}
	}
	sort.Slice(s.Gates, func(i, j int) bool { return s.Gates[i].RateKeySHA256 < s.Gates[j].RateKeySHA256 })
	return gated, nil
}

// eligibility is what the drainer states are derived from.
type eligibility struct {
	// startable: some queued job could start now (key not gated, its not-before passed, its
	// tenant below its cap) and the global cap has room.
	startable bool
	// since is when the oldest startable job became eligible (queued, or its not-before).
	since time.Time
	// ungated: some queued job is neither gated nor held by its own not-before.
	ungated bool
}

// inFlight returns each tenant with jobs in flight, with its queue state (store.ReadInFlight).
func (r *Reader) inFlight(ctx context.Context, now time.Time, cfg config.Config) ([]Tenant, error) {
	rows, err := store.ReadInFlight(ctx, r.cfg.DB)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	out := make([]Tenant, 0, len(rows))
	for _, t := range rows {
		tn := tenantOf(now, cfg, t.TenantQueue)
		tn.InFlight = t.InFlight
		out = append(out, tn)
	}
	return out, nil
}

// slots reads the live slots that count (store.LiveSlots: bounded by those, which the global cap
// bounds; a slot granted past a limit is not read) and returns them in total, by tier and lane,
// and per tenant.
func (r *Reader) slots(ctx context.Context, cfg config.Config) (Slots, map[string]int, error) {
	us, err := store.LiveSlots(ctx, r.cfg.DB, cfg)
	if err != nil {
		return Slots{}, nil, fmt.Errorf("status: %w", err)
	}
	return Slots{Total: us.Total, ByTier: us.Tier, ByLane: us.Lane}, us.Tenant, nil
}

// totals fills the queue depth, the oldest queued age and the count of tenants with work
// (store.ReadQueueTotals: from the tenants rows, never a count of jobs).
func (r *Reader) totals(ctx context.Context, now time.Time, s *Status) error {
	q, err := store.ReadQueueTotals(ctx, r.cfg.DB)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	s.TenantsWithWork, s.Queue.Depth = q.TenantsWithWork, q.Queued
	if q.OldestHead != nil {
		s.Queue.OldestAgeSeconds = age(now, *q.OldestHead)
	}
	return nil
}

// maxQueued is above any tenants.queued (INT UNSIGNED): the upper bound of a first page.
const maxQueued = int64(1) << 32

// deepest returns at most n tenants with queued work in the order (queued DESC, tenant), after
// the one at key after if set. Each read is a range of the depth index (queued, tenant) that
// stops after the rows returned: the tail is read backwards (queued DESC, tenant DESC, the
// order the index serves) and the last depth it reached, of which it may have taken only the
// names at the end, is read again forwards from its first name.
func (r *Reader) deepest(ctx context.Context, now time.Time, cfg config.Config, after *TenantKey, n int) ([]Tenant, error) {
	var out []Tenant
	below := maxQueued
	if after != nil {
		got, err := r.tenantRows(ctx, now, cfg, store.TenantQueuesParams{By: store.AtDepthAfter, Depth: after.Depth,
			After: after.Tenant, Limit: n})
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
		below = after.Depth
	}
	if len(out) >= n || below <= 1 {
		return out, nil
	}
	want := n - len(out)
	tail, err := r.tenantRows(ctx, now, cfg, store.TenantQueuesParams{By: store.BelowDepth, Depth: below, Limit: want})
	if err != nil {
		return nil, err
	}
	if len(tail) == want {
		// The last depth reached may have more tenants than were read, and the read took the
		// last names: take its first names instead.
		last := tail[len(tail)-1].Depth
		k := 0
		for len(tail) > 0 && tail[len(tail)-1].Depth == last {
			tail, k = tail[:len(tail)-1], k+1
		}
		first, err := r.tenantRows(ctx, now, cfg, store.TenantQueuesParams{By: store.AtDepth, Depth: int64(last), Limit: k})
		if err != nil {
			return nil, err
		}
		tail = append(tail, first...)
	}
	sort.SliceStable(tail, func(i, j int) bool {
		if tail[i].Depth != tail[j].Depth {
			return tail[i].Depth > tail[j].Depth
		}
		return tail[i].Tenant < tail[j].Tenant
	})
	return append(out, tail...), nil
}

// tenantRows reads a page of tenants' queue states (store.ReadTenantQueues).
func (r *Reader) tenantRows(ctx context.Context, now time.Time, cfg config.Config, p store.TenantQueuesParams) ([]Tenant, error) {
	rows, err := store.ReadTenantQueues(ctx, r.cfg.DB, p)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	out := make([]Tenant, 0, len(rows))
	for _, t := range rows {
		out = append(out, tenantOf(now, cfg, t))
	}
	return out, nil
}

// tenantOf is t as status shows it, with its cap under cfg.
func tenantOf(now time.Time, cfg config.Config, t store.TenantQueue) Tenant {
	out := Tenant{Tenant: t.Tenant, Depth: t.Queued, Cap: cfg.TenantCap(t.Tenant), Tier: cfg.Tier(t.Tenant), Weight: cfg.Weight(t.Tenant)}
	if t.HeadAt != nil {
		out.OldestAgeSeconds = age(now, *t.HeadAt)
	}
	return out
}

// eligible inspects the queue heads of at most MaxTenants tenants, the way a claim does: the
// tenants whose oldest queued job is oldest (the head index), those below their cap first.
// It reads MaxTenants plus the number of tenants in flight (bounded by the global cap) names
// from the head index, then the heads of the chosen ones in one statement of constant text
// (store.HeadsRead), whatever the number of tenants with work.
func (r *Reader) eligible(ctx context.Context, now time.Time, cfg config.Config, globalInFlight int, inFlight []Tenant, gated map[string]time.Time) (eligibility, error) {
	var e eligibility
	busy := make(map[string]int, len(inFlight))
	for _, t := range inFlight {
		busy[t.Tenant] = t.InFlight
	}
	names, err := store.TenantsByHead(ctx, r.cfg.DB, r.cfg.MaxTenants+len(inFlight))
	if err != nil {
		return e, fmt.Errorf("status: %w", err)
	}
	var free, full []string
	for _, t := range names {
		if busy[t] < cfg.TenantCap(t) {
			free = append(free, t)
		} else {
			full = append(full, t)
		}
	}
	chosen := append(free, full...)
	if len(chosen) == 0 {
		return e, nil
	}
	if len(chosen) > r.cfg.MaxTenants {
		chosen = chosen[:r.cfg.MaxTenants]
	}
	heads, err := r.heads.Read(ctx, r.cfg.DB, chosen, r.cfg.HeadsPerTenant)
	if err != nil {
		return e, fmt.Errorf("status: %w", err)
	}
	globalRoom := globalInFlight < cfg.GlobalInFlight
	for _, h := range heads {
		if h.RateKeySHA256 != nil {
			if _, ok := gated[*h.RateKeySHA256]; ok {
				continue
			}
		}
		if h.NotBefore != nil && h.NotBefore.After(now) {
			continue
		}
		e.ungated = true
		if !globalRoom || busy[h.Tenant] >= cfg.TenantCap(h.Tenant) {
			continue
		}
		since := h.QueuedAt
		if h.NotBefore != nil && h.NotBefore.After(since) {
			since = *h.NotBefore
		}
		if !e.startable || since.Before(e.since) {
			e.startable, e.since = true, since
		}
	}
	return e, nil
}

// drainers fills s.Drainers, deriving each state at read time (SPEC §6).
func (r *Reader) drainers(ctx context.Context, now time.Time, cfg config.Config, s *Status, e eligibility) error {
	rows, err := store.ReadDrainers(ctx, r.cfg.DB, now.Add(-r.cfg.GoneAfter))
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	type beat struct {
		d         Drainer
		heartbeat time.Time
		lastClaim *time.Time
		started   time.Time
		poll      time.Duration
	}
	beats := make([]beat, 0, len(rows))
	var lastFleetClaim time.Time
	for _, row := range rows {
		b := beat{d: Drainer{ID: row.ID, Host: row.Host, PID: row.PID, Version: row.Version, InFlight: row.InFlight},
			heartbeat: row.HeartbeatAt, lastClaim: row.LastClaim, started: row.StartedAt, poll: row.PollInterval}
		if b.poll <= 0 {
			b.poll = time.Second
		}
		b.d.PollIntervalSeconds = b.poll.Seconds()
		b.d.HeartbeatAgeSeconds = age(now, b.heartbeat)
		if b.lastClaim != nil {
			a := age(now, *b.lastClaim)
			b.d.LastClaimAgeSeconds = &a
			if b.lastClaim.After(lastFleetClaim) {
				lastFleetClaim = *b.lastClaim
			}
		}
		beats = append(beats, b)
	}
	// The fleet is stuck when startable work has waited StallAfter since it became eligible and
	// no drainer has claimed anything since then.
	stuck := e.startable && now.Sub(e.since) >= r.cfg.StallAfter && now.Sub(lastFleetClaim) >= r.cfg.StallAfter
	s.Drainers = make([]Drainer, 0, len(beats))
	for _, b := range beats {
		d := b.d
		switch {
		case now.Sub(b.heartbeat) > 3*b.poll:
			d.State, d.Reason = Stalled, fmt.Sprintf("no heartbeat for %.1f s (3 poll periods are %.1f s)", d.HeartbeatAgeSeconds, 3*b.poll.Seconds())
		case stuck && now.Sub(b.started) >= r.cfg.StallAfter:
			d.State, d.Reason = Stalled, fmt.Sprintf("eligible work with free capacity has waited %.1f s unclaimed", now.Sub(e.since).Seconds())
		case d.InFlight > 0 || (b.lastClaim != nil && now.Sub(*b.lastClaim) <= b.poll):
			d.State = Active
		case s.Queue.Depth == 0:
			d.State = Idle
		case !e.ungated:
			d.State, d.Reason = Gated, "every queued job's rate key is gated or its not-before is in the future"
		case s.InFlight+s.Slots.Total == 0 && !e.startable:
			d.State, d.Reason = Gated, "queued work waits on caps that are 0 (paused)"
		default:
			d.State = Active // the queue waits for capacity that work in flight (or a slot) holds
		}
		s.Drainers = append(s.Drainers, d)
	}
	return nil
}

func age(now, t time.Time) float64 {
	if a := now.Sub(t).Seconds(); a > 0 {
		return a
	}
	return 0
}
