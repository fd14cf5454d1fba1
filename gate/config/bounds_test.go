package config_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/config"
)

// TestDurationKeysBounded: every day and second key is refused past its bound with the key
// named, and a value at the bound is accepted. 213,504 days is where days*24h first overflows
// a time.Duration: taken as "keep for ever", it wrapped to 25 minutes and purged at once.
func TestDurationKeysBounded(t *testing.T) {
	t.Parallel()
	// 106,752 days and 9,223,372,037 seconds are the first values that overflow a time.Duration.
	days := []string{"36501", "106752", "213504", "9223372036854775807"}
	secs := []string{"31536001", "9223372037", "18446744074"}
	for _, tc := range []struct {
		key  string
		max  int
		over []string
	}{
		{"retention_days", 36500, days},
		{"outbox_retention_days", 36500, days},
		{"audit_retention_days", 36500, days},
		{"execution_wall_seconds", 31536000, secs},
		{"max_queue_age_seconds", 31536000, secs},
		{"lease_seconds", 31536000, secs},
		{"nonce_ttl_seconds", 31536000, secs},
	} {
		if _, err := config.Apply(config.Default(), raw(map[string]string{tc.key: strconv.Itoa(tc.max)})); err != nil {
			t.Errorf("%s=%d (the bound) refused: %v", tc.key, tc.max, err)
		}
		for _, v := range tc.over {
			_, err := config.Apply(config.Default(), raw(map[string]string{tc.key: v}))
			var fe *config.FieldError
			if !errors.As(err, &fe) || fe.Key != tc.key {
				t.Errorf("%s=%s: %v, want a FieldError naming %s", tc.key, v, err, tc.key)
			}
		}
	}
}

// TestDurationsNeverWrap: a configuration stored before the bounds existed (Decode does not
// validate) still converts to durations that are at least the bound, never a wrapped small or
// negative one.
func TestDurationsNeverWrap(t *testing.T) {
	t.Parallel()
	cfg, err := config.Decode([]byte(`{"retention_days": 213504, "outbox_retention_days": 213504,
		"audit_retention_days": 9223372036854775807, "execution_wall_seconds": 9223372037,
		"max_queue_age_seconds": 18446744074, "lease_seconds": 9223372037, "nonce_ttl_seconds": 9223372037}`))
	if err != nil {
		t.Fatal(err)
	}
	const century = 36500 * 24 * time.Hour
	for name, d := range map[string]time.Duration{
		"Retention": cfg.Retention(), "OutboxRetention": cfg.OutboxRetention(), "AuditRetention": cfg.AuditRetention(),
	} {
		if d != century {
			t.Errorf("%s() = %v, want the bound, %v", name, d, century)
		}
	}
	const year = 31536000 * time.Second
	for name, d := range map[string]time.Duration{
		"Wall": cfg.Wall(), "MaxQueueAge": cfg.MaxQueueAge(), "Lease": cfg.Lease(), "NonceTTL": cfg.NonceTTL(),
	} {
		if d != year {
			t.Errorf("%s() = %v, want the bound, %v", name, d, year)
		}
	}
	if d := config.Default(); d.Retention() != 90*24*time.Hour || d.Wall() != 310*time.Second || d.MaxQueueAge() != 0 {
		t.Errorf("defaults convert to %v, %v, %v; want 90 days, 310 s, 0", d.Retention(), d.Wall(), d.MaxQueueAge())
	}
}
