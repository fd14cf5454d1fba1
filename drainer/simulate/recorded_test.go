package simulate

import (
	"context"
	"database/sql"
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
	for _, tc := range []struct {
		at   time.Time
		want int64 // the id before the first event at or after at
	}{
		{t0.Add(-time.Hour), first - 1},
		{t0, first - 1},
		{t0.Add(500 * time.Millisecond), first},
		{t0.Add(37 * time.Second), first + 36},
		{t0.Add(99 * time.Second), first + 98},
		{t0.Add(time.Hour), first + 99},
	} {
		if id, err := firstAuditID(ctx, db, tc.at); err != nil || id != tc.want {
			t.Errorf("at %s: %d, %v; want %d", tc.at.Sub(t0), id, err, tc.want)
		}
	}
	rows, err := db.QueryContext(ctx, "EXPLAIN "+recordedSQL, first, recordedPage)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		row := map[string]string{}
		for i, c := range cols {
			row[c] = vals[i].String
		}
		if row["table"] == "a" && (row["key"] != "PRIMARY" || row["type"] != "range") {
			t.Errorf("the page read reads audit_events by %q (%s), want a range of PRIMARY: %v", row["key"], row["type"], row)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}
