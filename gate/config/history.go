package config

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/gate/sqldb"
)

// FieldError is an invalid runtime configuration value: Key names the offending key and Reason
// says why, in words an operator can act on.
type FieldError struct {
	Key    string
	Reason string
}

func (e *FieldError) Error() string { return e.Key + ": " + e.Reason }

func invalidf(key, format string, args ...any) *FieldError {
	return &FieldError{Key: key, Reason: fmt.Sprintf(format, args...)}
}

// Keys returns every runtime configuration key, in the order of SPEC §9's table.
func Keys() []string {
	raw, _ := json.Marshal(Default()) // cannot fail
	var m map[string]json.RawMessage
	_ = json.Unmarshal(raw, &m)
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	order := map[string]int{}
	for i, k := range specOrder {
		order[k] = i
	}
	sort.Slice(out, func(i, j int) bool {
		oi, iok := order[out[i]]
		oj, jok := order[out[j]]
		if iok && jok {
			return oi < oj
		}
		if iok != jok {
			return iok
		}
		return out[i] < out[j]
	})
	return out
}

var specOrder = []string{"global_in_flight", "tenant_in_flight", "tenant_in_flight_overrides",
	"tenant_queue_depth", "global_queue_depth", "admission_mode", "admission_rate_per_minute",
	"ordering", "execution_wall_seconds", "max_queue_age_seconds", "lease_seconds",
	"nonce_ttl_seconds", "dispatch_attempts", "max_payload_bytes", "retention_days",
	"outbox_retention_days", "lanes", "tenant_tiers", "tier_in_flight", "tier_tenant_in_flight",
	"interactive_reserve", "enforce_for", "audit_retention_days", "tenant_weights", "tier_weights", "priority_aging_seconds"}

// Apply returns base with changes applied, validated as a whole. Every key must be known and
// every value of its documented JSON type; the first problem is returned as a *FieldError.
// Keys are applied in sorted order so that the error named is deterministic.
func Apply(base Config, changes map[string]json.RawMessage) (Config, error) {
	if len(changes) == 0 {
		return base, &FieldError{Key: "changes", Reason: "no changes given"}
	}
	raw, err := json.Marshal(base)
	if err != nil {
		return base, fmt.Errorf("encode runtime config: %w", err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return base, fmt.Errorf("encode runtime config: %w", err)
	}
	keys := make([]string, 0, len(changes))
	for k := range changes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := bytes.TrimSpace(changes[k])
		if _, ok := m[k]; !ok {
			return base, invalidf(k, "unknown key (known: %s)", strings.Join(Keys(), ", "))
		}
		if len(v) == 0 || bytes.Equal(v, []byte("null")) {
			return base, invalidf(k, "a value is required")
		}
		// Decode each key alone first, so a type error names its key.
		one := Default()
		if err := strictUnmarshal([]byte(`{"`+k+`":`+string(v)+`}`), &one); err != nil {
			return base, invalidf(k, "%s", typeReason(err))
		}
		m[k] = v
	}
	merged, err := json.Marshal(m)
	if err != nil {
		return base, fmt.Errorf("encode runtime config: %w", err)
	}
	out := Default()
	// Maps are replaced as a whole, never merged with the defaults.
	out.TenantInFlightOverrides, out.Lanes, out.TenantTiers, out.TierInFlight, out.TierTenantInFlight = nil, nil, nil, nil, nil
	out.TenantWeights, out.TierWeights = nil, nil
	if err := strictUnmarshal(merged, &out); err != nil {
		return base, fmt.Errorf("decode runtime config: %w", err)
	}
	out.fillDefaults()
	if err := out.Validate(); err != nil {
		return base, err
	}
	return out, nil
}

func strictUnmarshal(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func typeReason(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		switch te.Type.Kind().String() {
		case "int":
			return fmt.Sprintf("must be a whole number, got %s", te.Value)
		case "string":
			return fmt.Sprintf("must be a string, got %s", te.Value)
		case "map":
			return fmt.Sprintf("must be a JSON object, got %s", te.Value)
		}
		return fmt.Sprintf("wrong type: got %s", te.Value)
	}
	return "not valid JSON: " + err.Error()
}

// Change is one entry of the runtime configuration's history (SPEC §9): the version it created,
// who made it, when, the changed keys' old and new values, and the note.
type Change struct {
	Version int64                      `json:"version"`
	Who     string                     `json:"who"`
	When    time.Time                  `json:"when"`
	Old     map[string]json.RawMessage `json:"old"`
	New     map[string]json.RawMessage `json:"new"`
	Note    string                     `json:"note"`
}

// ErrCommit marks Patch's error when its COMMIT failed: if the connection broke there, the new
// version may or may not have been written.
var ErrCommit = errors.New("commit")

// Patch applies changes on top of the version in force, as caller who with note, and returns
// the new version and its history entry. All changes apply or none: an invalid one is returned
// as a *FieldError and nothing is written. Changes are serialised by a lock on the single
// config_lock row, so two concurrent patches build one on the other and never on the same
// version. A patch that changes nothing writes nothing and returns the version in force with a
// zero Change. log, if not nil, receives one line per new version. A COMMIT that fails returns
// an error wrapping ErrCommit.
func Patch(ctx context.Context, db *sql.DB, log *slog.Logger, who string, changes map[string]json.RawMessage, note string) (Versioned, Change, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return Versioned{}, Change{}, fmt.Errorf("change runtime config: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var one int
	if err := tx.QueryRowContext(ctx, "SELECT id FROM config_lock WHERE id = 1 FOR UPDATE").Scan(&one); err != nil {
		return Versioned{}, Change{}, fmt.Errorf("change runtime config: lock: %w", err)
	}
	cur, err := Load(ctx, tx)
	if err != nil {
		return Versioned{}, Change{}, err
	}
	next, err := Apply(cur.Config, changes)
	if err != nil {
		return cur, Change{}, err
	}
	oldVals, newVals := diff(cur.Config, next)
	if len(newVals) == 0 {
		return cur, Change{}, nil
	}
	now, err := clock.Read(ctx, tx)
	if err != nil {
		return cur, Change{}, fmt.Errorf("change runtime config: %w", err)
	}
	raw, err := json.Marshal(next)
	if err != nil {
		return cur, Change{}, fmt.Errorf("change runtime config: encode: %w", err)
	}
	v := Versioned{Version: cur.Version + 1, Config: next}
	var noteArg any
	if note != "" {
		noteArg = note
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO config_versions (version, config, changed_by, changed_at, note)
		VALUES (?, ?, ?, ?, ?)`, v.Version, string(raw), who, now, noteArg); err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1062 {
			return cur, Change{}, fmt.Errorf("change runtime config: version %d was written concurrently: %w", v.Version, err)
		}
		return cur, Change{}, fmt.Errorf("change runtime config: write version %d: %w", v.Version, err)
	}
	if err := tx.Commit(); err != nil {
		return cur, Change{}, fmt.Errorf("change runtime config: %w: %w", ErrCommit, err)
	}
	ch := Change{Version: v.Version, Who: who, When: now.UTC(), Old: oldVals, New: newVals, Note: note}
	if log != nil {
		log.Info("runtime config changed", "version", v.Version, "who", who, "old", rawMap(oldVals),
			"new", rawMap(newVals), "note", note)
	}
	return v, ch, nil
}

// rawMap renders values as JSON text for a log line.
func rawMap(m map[string]json.RawMessage) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = string(v)
	}
	return out
}

// diff returns the keys whose JSON values differ between a and b, with their values in each.
func diff(a, b Config) (map[string]json.RawMessage, map[string]json.RawMessage) {
	am, bm := asMap(a), asMap(b)
	oldVals, newVals := map[string]json.RawMessage{}, map[string]json.RawMessage{}
	for k, bv := range bm {
		if av := am[k]; !bytes.Equal(av, bv) {
			oldVals[k], newVals[k] = av, bv
		}
	}
	return oldVals, newVals
}

func asMap(c Config) map[string]json.RawMessage {
	raw, _ := json.Marshal(c) // a Config always encodes
	var m map[string]json.RawMessage
	_ = json.Unmarshal(raw, &m)
	return m
}

// HistoryPage is one page of History: at most the limit asked for, newest first, and Next, when
// not 0, the version the following page starts below (0: none follows).
type HistoryPage struct {
	Changes []Change
	Next    int64
}

// History returns a page of changes, newest first, each with the keys it changed: at most limit
// (at least 1) of the versions below before (0: from the newest). Version 1's old values are the
// defaults. Its one statement reads at most limit+1 rows by the primary key, whatever the length
// of the history: the row past the page is the predecessor its oldest change is diffed against,
// and tells that another page follows.
func History(ctx context.Context, db sqldb.DB, before int64, limit int) (HistoryPage, error) {
	if limit < 1 {
		return HistoryPage{}, fmt.Errorf("read runtime config history: limit %d: want at least 1", limit)
	}
	if before <= 0 {
		before = math.MaxInt64
	}
	rows, err := db.QueryContext(ctx, `SELECT version, config, changed_by, changed_at, COALESCE(note, '')
		FROM config_versions WHERE version < ? ORDER BY version DESC LIMIT ?`, before, limit+1)
	if err != nil {
		return HistoryPage{}, fmt.Errorf("read runtime config history: %w", err)
	}
	defer rows.Close()
	type row struct {
		c   Change
		cfg Config
	}
	var list []row
	for rows.Next() {
		var r row
		var raw string
		if err := rows.Scan(&r.c.Version, &raw, &r.c.Who, &r.c.When, &r.c.Note); err != nil {
			return HistoryPage{}, fmt.Errorf("read runtime config history: %w", err)
		}
		r.c.When = r.c.When.UTC()
		if r.cfg, err = Decode([]byte(raw)); err != nil {
			return HistoryPage{}, fmt.Errorf("read runtime config history: version %d: %w", r.c.Version, err)
		}
		list = append(list, r)
	}
	if err := rows.Err(); err != nil {
		return HistoryPage{}, fmt.Errorf("read runtime config history: %w", err)
	}
	var page HistoryPage
	n := len(list)
	if n > limit {
		n = limit
		page.Next = list[n-1].c.Version
	}
	page.Changes = make([]Change, 0, n)
	for i := range n {
		prev := Default() // nothing older: the defaults were in force before it
		if i+1 < len(list) {
			prev = list[i+1].cfg
		}
		c := list[i].c
		c.Old, c.New = diff(prev, list[i].cfg)
		page.Changes = append(page.Changes, c)
	}
	return page, nil
}
