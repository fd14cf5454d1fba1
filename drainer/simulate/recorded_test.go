package simulate

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/testdb"
)

// The audit trail has no index on at: firstAuditID finds a window's first id by the primary key,
// and the page read walks the primary key from it (EXPLAIN), whatever the table's size.
func TestRecordedWalksThePrimaryKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	if id, err := firstAuditID(ctx, db, t0); err != nil || id != 0 {
		t.Fatalf("an empty trail: %d, %v; want 0", id, err)
	}
	var events []store.AuditEvent
	for i := range 100 {
		events = append(events, store.AuditEvent{At: t0.Add(time.Duration(i) * time.Second), Event: store.EventRefused, Tenant: "a",
			ErrorCode: "rate_limited"})
	}
	if err := store.InsertAudit(ctx, db, events); err != nil {
		t.Fatal(err)
	}
	var first int64
	if err := db.QueryRowContext(ctx, "SELECT MIN(id) FROM audit_events").Scan(&first); err != nil {
		t.Fatal(err)
	}
	// The answer splits the trail at at: the events before at have ids up to it, the others
	// above it. The ids of one multi-row INSERT step by auto_increment_increment (3 on a Galera
	// cluster of three), so the split is checked on the rows rather than on first + n.
	for _, tc := range []struct {
		at     time.Time
		before int // events dated before at
	}{
		{t0.Add(-time.Hour), 0},
		{t0, 0},
		{t0.Add(500 * time.Millisecond), 1},
		{t0.Add(37 * time.Second), 37},
		{t0.Add(99 * time.Second), 99},
		{t0.Add(time.Hour), 100},
	} {
		id, err := firstAuditID(ctx, db, tc.at)
		if err != nil {
			t.Fatalf("at %s: %v", tc.at.Sub(t0), err)
		}
		var upTo, early, late int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(id <= ? OR NULL), COUNT(id <= ? AND at < ? OR NULL),
			COUNT(id > ? AND at < ? OR NULL) FROM audit_events`, id, id, tc.at, id, tc.at).Scan(&upTo, &early, &late); err != nil {
			t.Fatal(err)
		}
		if upTo != tc.before || early != tc.before || late != 0 || id < first-1 {
			t.Errorf("at %s: %d (first id %d), with %d events up to it, %d of them before at, %d events before at above it; want %d events up to it, all before at",
				tc.at.Sub(t0), id, first, upTo, early, late, tc.before)
		}
	}
	for _, row := range db.Explain(t, recordedSQL, first, recordedPage) {
		if row["table"] == "a" && (row["key"] != "PRIMARY" || row["type"] != "range") {
			t.Errorf("the page read reads audit_events by %q (%s), want a range of PRIMARY: %v", row["key"], row["type"], row)
		}
	}
}
