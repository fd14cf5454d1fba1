// Package opsmetrics exports the database-derived gauges of SPEC §10 (queue depth and age, in
// flight, gated keys, the outbox backlog, drainer states, the config version) as a Prometheus
// collector that reads the status on scrape, with a deadline. Reading on scrape rather than in
// a background loop means nothing runs when nobody looks; a read serves every scrape within
// CacheFor of it, and scrapes that arrive while a read runs wait for that read rather than
// start their own, so several scrapers (two Prometheus replicas, a dashboard) cost one read.
// Per-tenant series exist only for the TopTenants deepest tenants; the rest are summed under
// tenant="other", so cardinality is bounded whatever the tenants.
package opsmetrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/gate/status"
)

// Reader reads the status; *status.Reader is one. Local is what the process knows without the
// database (broker, memcached, config version and staleness).
type Reader interface {
	Read(ctx context.Context) (status.Status, error)
	Local(ctx context.Context) status.Status
}

// Config configures a Collector. Field docs give the defaults.
type Config struct {
	// Status is read on every scrape. Required.
	Status Reader
	// Timeout bounds one read. Default 2 s: a scrape must not hang on a stuck database.
	Timeout time.Duration
	// CacheFor is how long a successful read serves later scrapes. Default 2 s: the status
	// read is bounded but not free, and gauges a scrape interval apart need no fresher figures.
	// A failed read is never reused.
	CacheFor time.Duration
	// Now is the clock the cache is judged by. Default time.Now.
	Now func() time.Time
	// TopTenants is how many tenants get their own series. Default 20.
	TopTenants int
	// NoTenantLabels puts no tenant name in a label (SLUICE_METRICS_TENANT_LABELS=false): every
	// tenant is summed under tenant="other".
	NoTenantLabels bool
	// Log receives read failures, at most one line per minute. Default: discard.
	Log *slog.Logger
	// Omit names metrics this collector leaves out because another component of the process
	// exports them (the gate store's sluice_gated_keys, the relay's outbox gauges). Register
	// fills it in. Default none.
	Omit []string
}

// OtherTenant is the tenant label under which tenants beyond TopTenants are summed.
const OtherTenant = "other"

// Collector is a prometheus.Collector over the status. Safe for concurrent use.
type Collector struct {
	cfg Config

	queueDepth, queueOldest, inFlight, gatedKeys      *prometheus.Desc
	slotsInFlight                                     *prometheus.Desc
	outboxUnpublished, outboxOldest                   *prometheus.Desc
	tenantDepth, tenantOldest, tenantInFlight         *prometheus.Desc
	drainers, brokerUp, memcachedUp, cfgVer, cfgStale *prometheus.Desc
	readOK                                            *prometheus.Desc
	names                                             map[*prometheus.Desc]string
	omit                                              map[string]bool

	mu       sync.Mutex
	lastWarn time.Time

	// readMu guards the cached read and the one in progress.
	readMu  sync.Mutex
	cached  status.Status
	readAt  time.Time // when cached was read; zero: nothing cached
	pending *read     // the read in progress, nil when none
	waiting int       // scrapes waiting for pending (for tests)
}

// read is one status read that concurrent scrapes share: done is closed once st and err are set.
type read struct {
	done chan struct{}
	st   status.Status
	err  error
}

// New returns a Collector, or an "invalid config" error naming the field. Register it on the
// process's registry.
func New(cfg Config) (*Collector, error) {
	if cfg.Status == nil {
		return nil, errors.New("invalid config: Status: required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.TopTenants <= 0 {
		cfg.TopTenants = 20
	}
	if cfg.CacheFor <= 0 {
		cfg.CacheFor = 2 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	names, omit := map[*prometheus.Desc]string{}, map[string]bool{}
	for _, n := range cfg.Omit {
		omit[n] = true
	}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		desc := prometheus.NewDesc(name, help, labels, nil)
		names[desc] = name
		return desc
	}
	c := &Collector{
		cfg:               cfg,
		names:             names,
		omit:              omit,
		queueDepth:        d("sluice_queue_depth", "Jobs queued, all tenants."),
		queueOldest:       d("sluice_queue_oldest_age_seconds", "Age of the oldest queued job (0 when the queue is empty)."),
		inFlight:          d("sluice_in_flight", "Jobs claimed, dispatched or running, all tenants."),
		slotsInFlight:     d("sluice_slots_in_flight", "Live slots that count (SPEC §5a), all tenants: they count against the caps with sluice_in_flight (slots granted past a limit do not)."),
		gatedKeys:         d("sluice_gated_keys", "Gated rate keys among the rate keys of queued jobs."),
		outboxUnpublished: d("sluice_outbox_unpublished", "Outbox rows not yet acknowledged by the broker."),
		outboxOldest:      d("sluice_outbox_oldest_unpublished_age_seconds", "Age of the oldest unpublished outbox row (0 when none)."),
		tenantDepth:       d("sluice_tenant_queue_depth", "Jobs queued per tenant: the deepest tenants, the rest summed as tenant=\"other\".", "tenant"),
		tenantOldest:      d("sluice_tenant_queue_oldest_age_seconds", "Age of a tenant's oldest queued job: the deepest tenants, the oldest of the rest as tenant=\"other\".", "tenant"),
		tenantInFlight:    d("sluice_tenant_in_flight", "Jobs in flight per tenant: the deepest tenants, the rest summed as tenant=\"other\".", "tenant"),
		drainers:          d("sluice_drainers", "Drainers by state derived at read time (active, idle, gated, stalled).", "state"),
		brokerUp:          d("sluice_broker_connected", "1 if this process's NATS connection is up."),
		memcachedUp:       d("sluice_memcached_reachable", "1 if the gate store (memcached) answers."),
		cfgVer:            d("sluice_config_version", "Runtime config version this process runs on."),
		cfgStale:          d("sluice_config_stale", "1 if this process could not re-read the runtime config and runs on its last good one."),
		readOK:            d("sluice_status_read_success", "1 if the last scrape could read the status from the database; 0 means the other sluice_ gauges of this collector are missing."),
	}
	return c, nil
}

// Register registers a collector built from cfg on reg, leaving out (and returning) the metrics
// some other collector on reg already exports: components that own a figure (the gate store
// its gated keys, the relay its outbox backlog) may export it themselves, and a registry refuses
// a name twice. Register it after those components.
func Register(reg prometheus.Registerer, cfg Config) (*Collector, []string, error) {
	probe, err := New(cfg)
	if err != nil {
		return nil, nil, err
	}
	omitted := append([]string(nil), cfg.Omit...)
	for desc, name := range probe.names {
		one := single{desc}
		if err := reg.Register(one); err != nil {
			omitted = append(omitted, name)
			continue
		}
		reg.Unregister(one)
	}
	cfg.Omit = omitted
	c, err := New(cfg)
	if err != nil {
		return nil, nil, err
	}
	if err := reg.Register(c); err != nil {
		return nil, nil, fmt.Errorf("register status metrics: %w", err)
	}
	return c, omitted, nil
}

// single is a collector of one description, used by Register to ask the registry whether a
// name is taken.
type single struct{ desc *prometheus.Desc }

func (s single) Describe(ch chan<- *prometheus.Desc) { ch <- s.desc }
func (s single) Collect(chan<- prometheus.Metric)    {}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for d, name := range c.names {
		if !c.omit[name] {
			ch <- d
		}
	}
}

// status returns the status read within CacheFor, or waits for the read in progress, or reads
// it (within Timeout) for itself and every scrape that arrives meanwhile. A failed read is
// returned to the scrapes that waited for it and forgotten.
func (c *Collector) status() (status.Status, error) {
	c.readMu.Lock()
	if !c.readAt.IsZero() && c.cfg.Now().Sub(c.readAt) < c.cfg.CacheFor {
		st := c.cached
		c.readMu.Unlock()
		return st, nil
	}
	if p := c.pending; p != nil {
		c.waiting++
		c.readMu.Unlock()
		<-p.done // the read is bounded by Timeout
		c.readMu.Lock()
		c.waiting--
		c.readMu.Unlock()
		return p.st, p.err
	}
	p := &read{done: make(chan struct{})}
	c.pending = p
	c.readMu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
	p.st, p.err = c.cfg.Status.Read(ctx)
	cancel()
	c.readMu.Lock()
	c.pending = nil
	if p.err == nil {
		c.cached, c.readAt = p.st, c.cfg.Now()
	}
	c.readMu.Unlock()
	close(p.done)
	return p.st, p.err
}

// Collect implements prometheus.Collector: it reads the status (see status for the cache and
// the shared read). When the read fails it reports sluice_status_read_success 0 and only what
// the process knows without the database (broker, memcached, config), rather than stale figures.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		if !c.omit[c.names[d]] {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
		}
	}
	s, err := c.status()
	if err != nil {
		c.warn(err)
		g(c.readOK, 0)
		lctx, lcancel := context.WithTimeout(context.Background(), 500*time.Millisecond) // ctx may be spent
		local := c.cfg.Status.Local(lctx)
		lcancel()
		g(c.brokerUp, b2f(local.Broker.Connected))
		g(c.memcachedUp, b2f(local.Memcached.Reachable))
		g(c.cfgVer, float64(local.Config.Version))
		g(c.cfgStale, b2f(local.Config.Stale))
		return
	}
	g(c.readOK, 1)
	g(c.queueDepth, float64(s.Queue.Depth))
	g(c.queueOldest, s.Queue.OldestAgeSeconds)
	g(c.inFlight, float64(s.InFlight))
	g(c.slotsInFlight, float64(s.Slots.Total))
	g(c.gatedKeys, float64(len(s.Gates)))
	g(c.outboxUnpublished, float64(s.Outbox.Unpublished))
	g(c.outboxOldest, s.Outbox.OldestUnpublishedAgeSeconds)
	// The status lists only the deepest tenants (and those in flight), so "other" is the total
	// less the top tenants, never a sum over every tenant. Its oldest age is the queue's oldest
	// when no top tenant holds that job, else the oldest among the listed rest (a lower bound:
	// an exact figure would need a read per scrape that grows with the tenants).
	var top, rest status.Tenant
	oldestIsTop := false
	for i, t := range s.Tenants { // sorted deepest first
		if i < c.cfg.TopTenants && !c.cfg.NoTenantLabels && t.Tenant != OtherTenant {
			g(c.tenantDepth, float64(t.Depth), t.Tenant)
			g(c.tenantOldest, t.OldestAgeSeconds, t.Tenant)
			g(c.tenantInFlight, float64(t.InFlight), t.Tenant)
			top.Depth += t.Depth
			top.InFlight += t.InFlight
			oldestIsTop = oldestIsTop || (t.Depth > 0 && t.OldestAgeSeconds >= s.Queue.OldestAgeSeconds)
			continue
		}
		rest.Depth += t.Depth
		rest.InFlight += t.InFlight
		rest.OldestAgeSeconds = max(rest.OldestAgeSeconds, t.OldestAgeSeconds)
	}
	other := status.Tenant{
		Depth:            max(s.Queue.Depth-top.Depth, rest.Depth),
		InFlight:         max(s.InFlight-top.InFlight, rest.InFlight),
		OldestAgeSeconds: rest.OldestAgeSeconds,
	}
	if !oldestIsTop && other.Depth > 0 {
		other.OldestAgeSeconds = max(other.OldestAgeSeconds, s.Queue.OldestAgeSeconds)
	}
	g(c.tenantDepth, float64(other.Depth), OtherTenant)
	g(c.tenantOldest, other.OldestAgeSeconds, OtherTenant)
	g(c.tenantInFlight, float64(other.InFlight), OtherTenant)
	states := map[string]int{status.Active: 0, status.Idle: 0, status.Gated: 0, status.Stalled: 0}
	for _, d := range s.Drainers {
		states[d.State]++
	}
	for st, n := range states {
		g(c.drainers, float64(n), st)
	}
	g(c.brokerUp, b2f(s.Broker.Connected))
	g(c.memcachedUp, b2f(s.Memcached.Reachable))
	g(c.cfgVer, float64(s.Config.Version))
	g(c.cfgStale, b2f(s.Config.Stale))
}

func (c *Collector) warn(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); now.Sub(c.lastWarn) >= time.Minute {
		c.lastWarn = now
		c.cfg.Log.Warn("metrics: could not read the status from the database", "error", err)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
