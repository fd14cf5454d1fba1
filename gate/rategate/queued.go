package rategate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Gated is a gated rate key with queued work: an entry of GET /v1/gates and of /v1/status.
type Gated struct {
	RateKeySHA256 string    `json:"rate_key_sha256"`
	NotBefore     time.Time `json:"not_before"`
	Queued        int64     `json:"queued"`
}

// lookupChunk bounds the keys of one GetMulti, so that a queue with very many distinct rate
// keys does not build one huge request.
const lookupChunk = 500

// Queued returns the gated keys among queued, the rate keys of queued jobs with each key's
// queued count (store.QueuedRateKeys: memcached cannot be enumerated, so the database says which
// keys exist), longest gate first. A gate that has passed is not listed. If memcached is
// unavailable it returns an error wrapping ErrUnavailable (and whatever it could read): the
// caller decides whether that is fatal. Safe for concurrent use; it is the building block of
// GET /v1/gates, /v1/status and the sluice_gated_keys gauge.
func Queued(ctx context.Context, queued map[string]int64, s *Store) ([]Gated, error) {
	keys := make([]string, 0, len(queued))
	for k := range queued {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the order the index gives them, for the lookups' chunks
	out := []Gated{}
	if len(keys) == 0 {
		return out, nil
	}
	now, err := s.Now(ctx)
	if err != nil {
		return nil, err
	}
	var lookupErr error
	for i := 0; i < len(keys); i += lookupChunk {
		gates, err := s.NotBefore(ctx, keys[i:min(i+lookupChunk, len(keys))])
		for k, nb := range gates {
			if nb.After(now) {
				out = append(out, Gated{RateKeySHA256: k, NotBefore: nb, Queued: queued[k]})
			}
		}
		if err != nil {
			lookupErr = err
			break
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].NotBefore.Equal(out[j].NotBefore) {
			return out[i].NotBefore.After(out[j].NotBefore)
		}
		return out[i].RateKeySHA256 < out[j].RateKeySHA256
	})
	return out, lookupErr
}

// GaugeConfig configures the sluice_gated_keys gauge. Field docs give the defaults.
type GaugeConfig struct {
	// Queued reads the rate keys of queued jobs with their counts (store.QueuedRateKeys).
	// Required.
	Queued func(ctx context.Context) (map[string]int64, error)
	// Store is the gate store. Required.
	Store *Store
	// Timeout bounds one scrape's database read and gate lookups. Default 2 s.
	Timeout time.Duration
	// Log receives scrape failures. Default: discard.
	Log *slog.Logger
}

// RegisterGatedKeys registers sluice_gated_keys on reg: the number of gated rate keys that have
// queued jobs, computed at scrape time by Queued. A scrape that cannot read the database or
// memcached reports the last good value (memcached down means gates fail open, and the count is
// logged by the store itself).
func RegisterGatedKeys(reg prometheus.Registerer, cfg GaugeConfig) error {
	if cfg.Queued == nil {
		return errors.New("invalid config: Queued: required")
	}
	if cfg.Store == nil {
		return errors.New("invalid config: Store: required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	var mu sync.Mutex
	last := 0.0
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_gated_keys",
		Help: "Rate keys with queued jobs whose gate has not passed."}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
		defer cancel()
		queued, err := cfg.Queued(ctx)
		var gated []Gated
		if err == nil {
			gated, err = Queued(ctx, queued, cfg.Store)
		}
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			cfg.Log.Debug("sluice_gated_keys: keeping the last value", "error", err)
			return last
		}
		last = float64(len(gated))
		return last
	})
	if err := reg.Register(g); err != nil {
		return fmt.Errorf("register sluice_gated_keys: %w", err)
	}
	return nil
}
