package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/migrations"
)

// TestCloneEqualsMigrated: a database from New is the database the migrations make — same
// tables and definitions, foreign keys, triggers, views and seeded rows — except that its
// install_id is its own.
func TestCloneEqualsMigrated(t *testing.T) {
	t.Parallel()
	start := time.Now()
	clone := New(t)
	t.Logf("testdb.New: %s (the first of the process, with the template lookup)", time.Since(start))
	start = time.Now()
	other := New(t)
	t.Logf("testdb.New: %s (a second clone)", time.Since(start))
	start = time.Now()
	fresh := migrated(t)
	t.Logf("create and migrate a database: %s", time.Since(start))

	ctx := context.Background()
	want, got := snap(t, ctx, fresh), snap(t, ctx, clone.DB)
	compare(t, want, got)
	if got.installID == want.installID || got.installID == snap(t, ctx, other.DB).installID {
		t.Errorf("install_id %s shared with another database", got.installID)
	}
	// The foreign key of 0006 must hold in the clone, not only be listed.
	if _, err := clone.ExecContext(ctx, `INSERT INTO jobs (tenant, status, queued_at) VALUES ('nobody', 'queued', UTC_TIMESTAMP(6))`); err == nil {
		t.Error("a job for a tenant with no tenants row was inserted: jobs_tenant_fk is missing")
	}
}

// TestCloneCopiesTriggersAndViews: triggers (a compound body and a one-statement one, on one
// table and event, in their order, besides the migrations' own) and views, which the migrations
// do not have yet, are recreated in a clone.
func TestCloneCopiesTriggersAndViews(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src := migrated(t)
	admin, err := adminDB(ctx)
	if err != nil {
		t.Fatal(err)
	}
	srcName := dbName(t, ctx, src)
	base, err := readPlan(ctx, admin, srcName)
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`CREATE TRIGGER jobs_bi_a BEFORE INSERT ON jobs FOR EACH ROW BEGIN
			IF NEW.attempt > 100 THEN SET NEW.attempt = 100; END IF;
			SET NEW.tenant = LOWER(NEW.tenant);
		END`,
		`CREATE TRIGGER jobs_bi_b BEFORE INSERT ON jobs FOR EACH ROW FOLLOWS jobs_bi_a SET NEW.attempt = NEW.attempt + 1`,
		`CREATE TRIGGER tenants_ad AFTER DELETE ON tenants FOR EACH ROW DELETE FROM claim_lock WHERE id = 255`,
		`CREATE VIEW queued_jobs AS SELECT id, tenant FROM jobs WHERE status = 'queued'`,
		`CREATE VIEW queued_count AS SELECT COUNT(*) AS n FROM queued_jobs`,
	} {
		if _, err := src.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	p, err := readPlan(ctx, admin, srcName)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.triggers) != len(base.triggers)+3 || len(p.views) != 2 {
		t.Fatalf("plan has %d triggers and %d views, want %d and 2", len(p.triggers), len(p.views), len(base.triggers)+3)
	}
	dst := emptyDB(t, ctx)
	if err := p.clone(ctx, admin, dbName(t, ctx, dst)); err != nil {
		t.Fatal(err)
	}
	compare(t, snap(t, ctx, src), snap(t, ctx, dst))
}

// BenchmarkNew measures one test database: go test -run '^$' -bench New ./integration/testdb
func BenchmarkNew(b *testing.B) {
	New(b) // the template, once
	b.ResetTimer()
	for b.Loop() {
		New(b)
	}
}

// BenchmarkMigrate measures what New cost before templates: a database migrated from scratch.
func BenchmarkMigrate(b *testing.B) {
	for b.Loop() {
		migrated(b)
	}
}

// emptyDB creates an empty database named like New's, dropped in tb.Cleanup.
func emptyDB(tb testing.TB, ctx context.Context) *sql.DB {
	tb.Helper()
	admin, err := adminDB(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := Prefix + hex.EncodeToString(b[:])
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name+" CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		tb.Fatal(err)
	}
	created.add(name)
	tb.Cleanup(func() {
		if _, err := admin.ExecContext(context.Background(), "DROP DATABASE "+name); err != nil {
			tb.Error(err)
			return
		}
		created.remove(name)
	})
	cfg, err := mysql.ParseDSN(ServerDSN())
	if err != nil {
		tb.Fatal(err)
	}
	cfg.DBName = name
	db, err := store.Open(ctx, cfg.FormatDSN())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}

// migrated is emptyDB with every migration applied, as New made them before templates.
func migrated(tb testing.TB) *sql.DB {
	tb.Helper()
	ctx := context.Background()
	db := emptyDB(tb, ctx)
	if _, err := migrations.Up(ctx, db, nil); err != nil {
		tb.Fatal(err)
	}
	return db
}

func dbName(tb testing.TB, ctx context.Context, db *sql.DB) string {
	tb.Helper()
	var name string
	if err := db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&name); err != nil {
		tb.Fatal(err)
	}
	return name
}

// schema is what a comparison looks at, with the database's own name replaced by "<db>".
type schema struct {
	tables    []string
	creates   map[string]string // SHOW CREATE TABLE, AUTO_INCREMENT=N removed
	fks       []string
	triggers  []string
	views     map[string]string
	rows      map[string][]string // table: its rows, temporal columns as "<time>", install_id as "<id>"
	installID string
}

var autoIncrement = regexp.MustCompile(` AUTO_INCREMENT=\d+`)

func snap(tb testing.TB, ctx context.Context, db *sql.DB) schema {
	tb.Helper()
	name := dbName(tb, ctx, db)
	anon := func(s string) string { return strings.ReplaceAll(s, name, "<db>") }
	s := schema{creates: map[string]string{}, views: map[string]string{}, rows: map[string][]string{}}
	strs := func(query string, args ...any) []string {
		tb.Helper()
		rows, err := db.QueryContext(ctx, query, args...)
		if err != nil {
			tb.Fatalf("%s: %v", query, err)
		}
		defer rows.Close()
		cols, _ := rows.ColumnTypes()
		var out []string
		for rows.Next() {
			vals := make([]sql.NullString, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				tb.Fatal(err)
			}
			parts := make([]string, len(cols))
			for i, v := range vals {
				switch {
				case !v.Valid:
					parts[i] = "NULL"
				case strings.Contains(cols[i].DatabaseTypeName(), "DATE") || strings.Contains(cols[i].DatabaseTypeName(), "TIME"):
					parts[i] = "<time>"
				case cols[i].Name() == "install_id":
					s.installID, parts[i] = v.String, "<id>"
				default:
					parts[i] = anon(v.String)
				}
			}
			out = append(out, strings.Join(parts, "|"))
		}
		if err := rows.Err(); err != nil {
			tb.Fatal(err)
		}
		return out
	}
	s.tables = strs(`SELECT CONCAT(TABLE_NAME, ' ', TABLE_TYPE) FROM information_schema.TABLES
		WHERE TABLE_SCHEMA = DATABASE() ORDER BY TABLE_NAME`)
	for _, line := range s.tables {
		table, typ, _ := strings.Cut(line, " ")
		if typ != "BASE TABLE" {
			continue
		}
		var n, create string
		if err := db.QueryRowContext(ctx, "SHOW CREATE TABLE "+ident(table)).Scan(&n, &create); err != nil {
			tb.Fatal(err)
		}
		s.creates[table] = anon(autoIncrement.ReplaceAllString(create, ""))
		s.rows[table] = strs("SELECT * FROM " + ident(table))
		sort.Strings(s.rows[table])
	}
	s.fks = strs(`SELECT rc.TABLE_NAME, rc.CONSTRAINT_NAME, rc.REFERENCED_TABLE_NAME, rc.UPDATE_RULE, rc.DELETE_RULE,
			k.ORDINAL_POSITION, k.COLUMN_NAME, k.REFERENCED_TABLE_SCHEMA, k.REFERENCED_COLUMN_NAME
		FROM information_schema.REFERENTIAL_CONSTRAINTS rc
		JOIN information_schema.KEY_COLUMN_USAGE k ON k.CONSTRAINT_SCHEMA = rc.CONSTRAINT_SCHEMA
			AND k.TABLE_NAME = rc.TABLE_NAME AND k.CONSTRAINT_NAME = rc.CONSTRAINT_NAME
		WHERE rc.CONSTRAINT_SCHEMA = DATABASE() ORDER BY 1, 2, 6`)
	s.triggers = strs(`SELECT TRIGGER_NAME, ACTION_TIMING, EVENT_MANIPULATION, EVENT_OBJECT_TABLE, ACTION_ORDER,
			ACTION_ORIENTATION, ACTION_STATEMENT, SQL_MODE
		FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() ORDER BY TRIGGER_NAME`)
	for _, line := range strs(`SELECT TABLE_NAME, VIEW_DEFINITION, CHECK_OPTION FROM information_schema.VIEWS
		WHERE TABLE_SCHEMA = DATABASE()`) {
		v, def, _ := strings.Cut(line, "|")
		s.views[v] = def
	}
	return s
}

func compare(t *testing.T, want, got schema) {
	t.Helper()
	if len(want.tables) == 0 {
		t.Fatal("the reference database has no tables")
	}
	for _, c := range []struct {
		what      string
		want, got any
	}{
		{"tables", want.tables, got.tables},
		{"foreign keys", want.fks, got.fks},
		{"triggers", want.triggers, got.triggers},
		{"views", want.views, got.views},
	} {
		if !reflect.DeepEqual(c.want, c.got) {
			t.Errorf("%s differ:\nmigrated: %q\nclone:    %q", c.what, c.want, c.got)
		}
	}
	for table, w := range want.creates {
		if g := got.creates[table]; g != w {
			t.Errorf("SHOW CREATE TABLE %s differs:\nmigrated: %s\nclone:    %s", table, w, g)
		}
		if w, g := want.rows[table], got.rows[table]; !reflect.DeepEqual(w, g) {
			t.Errorf("rows of %s differ:\nmigrated: %q\nclone:    %q", table, w, g)
		}
	}
	if want.installID == "" || len(got.installID) != 32 {
		t.Errorf("install_id: migrated %q, clone %q; want 32 hex digits in each", want.installID, got.installID)
	}
	t.Logf("compared %d tables, %d foreign key columns, %d triggers, %d views",
		len(want.creates), len(want.fks), len(want.triggers), len(want.views))
}
