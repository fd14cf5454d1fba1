package config_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/gate/config"
)

func raw(m map[string]string) map[string]json.RawMessage {
	out := map[string]json.RawMessage{}
	for k, v := range m {
		out[k] = json.RawMessage(v)
	}
	return out
}

func TestApply(t *testing.T) {
	t.Parallel()
	ok, err := config.Apply(config.Default(), raw(map[string]string{"global_in_flight": "0", "ordering": `"round_robin"`,
		"tenant_in_flight_overrides": `{"acme": 5}`}))
	if err != nil {
		t.Fatal(err)
	}
	if ok.GlobalInFlight != 0 || ok.Ordering != config.RoundRobin || ok.TenantCap("acme") != 5 || ok.TenantCap("x") != 2 {
		t.Errorf("applied config %+v", ok)
	}
	for _, o := range []string{`"fair"`, `"fifo"`, `"round_robin"`} {
		if _, err := config.Apply(config.Default(), raw(map[string]string{"ordering": o})); err != nil {
			t.Errorf("ordering %s refused: %v", o, err)
		}
	}
	for _, tc := range []struct {
		changes map[string]string
		key     string
	}{
		{map[string]string{"global_in_flight": "-1"}, "global_in_flight"},
		{map[string]string{"global_in_flight": `"4"`}, "global_in_flight"},
		{map[string]string{"global_in_flight": "4.5"}, "global_in_flight"},
		{map[string]string{"lease_seconds": "0"}, "lease_seconds"},
		{map[string]string{"audit_retention_days": "0"}, "audit_retention_days"},
		{map[string]string{"admission_mode": `"loose"`}, "admission_mode"},
		{map[string]string{"ordering": `"lifo"`}, "ordering"},
		{map[string]string{"ordering": "null"}, "ordering"},
		{map[string]string{"bogus": "1"}, "bogus"},
		{map[string]string{"max_payload_bytes": "99999999"}, "max_payload_bytes"},
		{map[string]string{"tenant_in_flight_overrides": `{"a": -1}`}, "tenant_in_flight_overrides"},
		{map[string]string{"tenant_in_flight_overrides": `[1]`}, "tenant_in_flight_overrides"},
		{map[string]string{"lanes": `["search"]`}, "lanes"},
		{map[string]string{"lanes": `{"search": "8"}`}, "lanes"},
		{map[string]string{"tenant_tiers": `{"acme": 1}`}, "tenant_tiers"},
		{map[string]string{"tier_in_flight": `{"gold": -1}`}, "tier_in_flight"},
		{map[string]string{"interactive_reserve": "-2"}, "interactive_reserve"},
		{map[string]string{"enforce_for": `"some"`}, "enforce_for"},
		{map[string]string{"tenant_weights": `{"acme": 0}`}, "tenant_weights"},
		{map[string]string{"tenant_weights": `{"acme": -2}`}, "tenant_weights"},
		{map[string]string{"tenant_weights": `{"acme": 1e7}`}, "tenant_weights"},
		{map[string]string{"tenant_weights": `{"acme": "2"}`}, "tenant_weights"},
		{map[string]string{"tier_weights": `{"a b": 2}`}, "tier_weights"},
		{map[string]string{"tier_weights": `{"gold": 0}`}, "tier_weights"},
		{map[string]string{}, "changes"},
	} {
		_, err := config.Apply(config.Default(), raw(tc.changes))
		var fe *config.FieldError
		if !errors.As(err, &fe) || fe.Key != tc.key || fe.Reason == "" {
			t.Errorf("Apply(%v) = %v, want a FieldError naming %s", tc.changes, err, tc.key)
		}
	}
	// Overrides are replaced as a whole, never merged.
	base := config.Default()
	base.TenantInFlightOverrides = map[string]int{"old": 1}
	got, err := config.Apply(base, raw(map[string]string{"tenant_in_flight_overrides": `{"new": 3}`}))
	if err != nil || len(got.TenantInFlightOverrides) != 1 || got.TenantInFlightOverrides["new"] != 3 {
		t.Errorf("overrides after replace = %v (%v), want only new:3", got.TenantInFlightOverrides, err)
	}
	if len(config.Keys()) != 26 || config.Keys()[0] != "global_in_flight" {
		t.Errorf("Keys() = %v, want the 26 keys of SPEC §9 in its order", config.Keys())
	}
}

// TestCacheKeepsLastGoodConfig: a reload that cannot reach the database keeps the config in
// force and says so (Stale).
func TestCacheKeepsLastGoodConfig(t *testing.T) {
	t.Parallel()
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.User = "tcp", "127.0.0.1:1", "root" // nothing listens on port 1
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dead := sql.OpenDB(conn)
	defer dead.Close()
	c := config.NewCache(dead, nil)
	before := c.Current()
	if err := c.Reload(context.Background()); err == nil {
		t.Fatal("Reload from an unreachable database succeeded")
	}
	if !c.Stale() {
		t.Error("cache not stale after a failed reload")
	}
	if after := c.Current(); after.Version != before.Version || after.Config.GlobalInFlight != before.Config.GlobalInFlight {
		t.Errorf("config changed by a failed reload: %+v -> %+v", before, after)
	}
}
