// Package waiters holds the API requests that wait for a job to change (GET /v1/jobs/{id}?wait=,
// POST /v1/jobs with wait, the events stream with follow=1) and wakes them. A job's outcome
// writes a release poke naming it, which every process hears on NATS and hands to Wake; a poke
// lost, or a change that sends none (a cancel, an expiry, a start), is caught by the backstop
// (Tick): one read a second of the state of every job any waiter of the process waits on,
// whatever the number of waiters. So a waiter holds no database connection and never polls the
// database.
//
// A waiter is bounded twice, per process and per caller (an API token): past either bound Add
// answers ErrBusy, which the API turns into 503 busy.
package waiters

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Config.
const (
	// DefaultMax bounds the waiters of one process: each is a parked goroutine and an open
	// connection, about 10 KiB together.
	DefaultMax = 10000
	// DefaultMaxPerCaller bounds one caller's waiters, so that one token cannot take them all.
	DefaultMaxPerCaller = 1000
	// DefaultInterval is the backstop's period.
	DefaultInterval = time.Second
	// readChunk bounds the ids of one backstop read.
	readChunk = 1000
)

// ErrBusy is Add's answer past a bound.
var ErrBusy = errors.New("waiters: too many waiters")

// State is what a waiter last saw of its job: a change of either field wakes it.
type State struct {
	Status  string
	Version int64
}

// ReadStates reads the current state of each job of ids; a job missing from the answer no
// longer exists (purged), which wakes its waiters too.
type ReadStates func(ctx context.Context, ids []int64) (map[int64]State, error)

// Config configures a Hub.
type Config struct {
	// Read reads the jobs' states for the backstop. Required.
	Read ReadStates
	// Max bounds the waiters of the process. Default DefaultMax.
	Max int
	// MaxPerCaller bounds one caller's waiters. Default DefaultMaxPerCaller.
	MaxPerCaller int
	// Interval is the backstop's period (Run). Default DefaultInterval.
	Interval time.Duration
	// Log receives backstop read errors. Default: discard.
	Log *slog.Logger
	// Listen, if set, starts hearing the jobs' ends (a subscription to the release pokes, which
	// then call Wake) and returns what stops it. The hub listens from its first waiter on and
	// stops once it has had none for IdleAfter (checked each Tick): a process nobody waits on
	// hears none of the pokes every job's end sends. A waiter registered before the subscription
	// took effect may miss its poke; the backstop then answers it. Default: none.
	Listen func() (stop func(), err error)
	// IdleAfter is how long the hub listens without a waiter. Default a minute.
	IdleAfter time.Duration
	// Now is the hub's clock, for IdleAfter. Default time.Now.
	Now func() time.Time
}

// Hub is the process's set of waiters. Safe for concurrent use.
type Hub struct {
	cfg      Config
	stop     chan struct{} // closed by Stop
	stopOnce sync.Once

	pokeWakes, backstopWakes atomic.Int64

	mu       sync.Mutex
	byJob    map[int64]map[*Waiter]struct{}
	byCaller map[string]int
	n        int
	// stopListening ends the subscription Config.Listen started; nil while not listening.
	stopListening func()
	lastWaiter    time.Time // when the last waiter closed
	lastListen    time.Time // when Config.Listen was last called
}

// Waiter waits for one job to change. Its owner reads the job, records what it read (Saw), and
// waits on C; Close when done.
type Waiter struct {
	hub    *Hub
	id     int64
	caller string
	c      chan struct{}
	seen   *State // guarded by hub.mu; nil until the first Saw
	closed bool   // guarded by hub.mu
}

// New returns a Hub.
func New(cfg Config) (*Hub, error) {
	if cfg.Read == nil {
		return nil, errors.New("invalid config: Read: required")
	}
	if cfg.Max <= 0 {
		cfg.Max = DefaultMax
	}
	if cfg.MaxPerCaller <= 0 {
		cfg.MaxPerCaller = DefaultMaxPerCaller
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.IdleAfter <= 0 {
		cfg.IdleAfter = time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Hub{cfg: cfg, stop: make(chan struct{}), byJob: map[int64]map[*Waiter]struct{}{}, byCaller: map[string]int{}}, nil
}

// Stop tells every waiter, now and later, to answer with what it has: the process is shutting
// down, and a wait of up to a minute must not hold its shutdown.
func (h *Hub) Stop() { h.stopOnce.Do(func() { close(h.stop) }) }

// Stopping is closed once Stop is called.
func (h *Hub) Stopping() <-chan struct{} { return h.stop }

// Add registers a waiter of caller on job id, or answers ErrBusy past a bound. Register before
// reading the job: a change between the read and Add would wake nobody until the backstop.
func (h *Hub) Add(caller string, id int64) (*Waiter, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n >= h.cfg.Max || h.byCaller[caller] >= h.cfg.MaxPerCaller {
		return nil, ErrBusy
	}
	if h.cfg.Listen != nil && h.stopListening == nil && h.cfg.Now().Sub(h.lastListen) >= h.cfg.Interval {
		// At most once a backstop period: a broker that refuses is not asked again, and the
		// warning not logged again, by every request meanwhile.
		h.lastListen = h.cfg.Now()
		stop, err := h.cfg.Listen()
		if err != nil {
			// The backstop still answers: a second late rather than a refusal.
			h.cfg.Log.Warn("waiters: could not listen for the jobs' ends; the backstop answers the waiters", "error", err)
		} else {
			h.stopListening = stop
		}
	}
	w := &Waiter{hub: h, id: id, caller: caller, c: make(chan struct{}, 1)}
	set := h.byJob[id]
	if set == nil {
		set = map[*Waiter]struct{}{}
		h.byJob[id] = set
	}
	set[w] = struct{}{}
	h.byCaller[caller]++
	h.n++
	return w, nil
}

// C receives when the job may have changed since the waiter's last Saw: read it again.
func (w *Waiter) C() <-chan struct{} { return w.c }

// Saw records the job's state as its owner last read it: the backstop wakes the waiter only when
// the job's state differs.
func (w *Waiter) Saw(s State) {
	w.hub.mu.Lock()
	w.seen = &s
	w.hub.mu.Unlock()
}

// Close removes the waiter; calling it again does nothing.
func (w *Waiter) Close() {
	h := w.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if w.closed {
		return
	}
	w.closed = true
	set := h.byJob[w.id]
	delete(set, w)
	if len(set) == 0 {
		delete(h.byJob, w.id)
	}
	if h.byCaller[w.caller]--; h.byCaller[w.caller] == 0 {
		delete(h.byCaller, w.caller)
	}
	if h.n--; h.n == 0 {
		h.lastWaiter = h.cfg.Now()
	}
}

// signal wakes w without blocking, and reports whether this call did: one pending wake is as
// good as many.
func (w *Waiter) signal() bool {
	select {
	case w.c <- struct{}{}:
		return true
	default:
		return false
	}
}

// Len reports the waiters registered now.
func (h *Hub) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

// Wake wakes every waiter of the jobs ids, under one lock; a hub without waiters returns at
// once (the drainer of an API process calls it for every job it ends).
func (h *Hub) Wake(ids ...int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == 0 {
		return
	}
	for _, id := range ids {
		for w := range h.byJob[id] {
			if w.signal() {
				h.pokeWakes.Add(1)
			}
		}
	}
}

// Wakes reports how many times a waiter was woken by a job's end (Wake) and by the backstop
// (Tick), since the hub started; a wake that found one pending is not counted.
func (h *Hub) Wakes() (poke, backstop int64) { return h.pokeWakes.Load(), h.backstopWakes.Load() }

// Tick is one backstop pass: it reads the state of every waited job and wakes the waiters of
// each job whose state differs from what they last saw, or that is gone. It also stops
// listening (Config.Listen) once the hub has had no waiter for IdleAfter.
func (h *Hub) Tick(ctx context.Context) error {
	h.mu.Lock()
	if h.n == 0 && h.stopListening != nil && h.cfg.Now().Sub(h.lastWaiter) >= h.cfg.IdleAfter {
		h.stopListening()
		h.stopListening = nil
	}
	ids := make([]int64, 0, len(h.byJob))
	for id := range h.byJob {
		ids = append(ids, id)
	}
	h.mu.Unlock()
	slices.Sort(ids)
	for chunk := range slices.Chunk(ids, readChunk) {
		states, err := h.cfg.Read(ctx, chunk)
		if err != nil {
			return fmt.Errorf("read the waited jobs: %w", err)
		}
		h.mu.Lock()
		for _, id := range chunk {
			now, exists := states[id]
			for w := range h.byJob[id] {
				if w.seen != nil && (!exists || now != *w.seen) && w.signal() {
					h.backstopWakes.Add(1)
				}
			}
		}
		h.mu.Unlock()
	}
	return nil
}

// Run ticks every Interval until ctx ends; a failed read is logged and tried again next tick.
func (h *Hub) Run(ctx context.Context) {
	t := time.NewTicker(h.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := h.Tick(ctx); err != nil && ctx.Err() == nil {
				h.cfg.Log.Warn("the waiters' backstop read failed; retrying next tick", "error", err)
			}
		}
	}
}
