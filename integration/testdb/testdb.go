// Package testdb gives each test a freshly migrated MySQL/MariaDB database of its own, created on
// the server named by SLUICE_TEST_MYSQL_DSN (default root@tcp(127.0.0.1:3306)/) and dropped when
// the test ends, so tests can run in parallel and leave nothing behind.
//
// Migrations run once per schema, not once per test: the first New of a process finds (or
// creates and migrates) a template database named after a hash of the embedded migrations,
// sluice_tpl_<hash12>, and every test database is a clone of it (see New). Templates are kept
// between runs and shared by concurrent test processes; a change to any migration names a new
// one. Drop old ones by hand (DROP DATABASE sluice_tpl_...) when they pile up.
package testdb

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/migrations"
)

// ServerDSN returns the DSN of the test server without a database.
func ServerDSN() string {
	if v := os.Getenv("SLUICE_TEST_MYSQL_DSN"); v != "" {
		return v
	}
	return "root@tcp(127.0.0.1:3306)/"
}

// Prefix begins the name of every database New creates.
const Prefix = "sluice_t_"

// DB is a test's own database.
type DB struct {
	// DB takes several statements in one round trip (store.OpenMulti), as the admissions' and
	// the drainer's pool must; Plain is the pool everything else in sluice runs on.
	*sql.DB
	// DSN names the database, for processes the test starts.
	DSN string
	// Name is the database's name.
	Name string
}

// New returns a database for tb with every migration applied, dropped in tb.Cleanup. It is a
// clone of the process's template (see the package doc): every base table created LIKE the
// template's, the rows of every table that has rows in the template copied, and the template's
// foreign keys (which CREATE TABLE ... LIKE does not copy), triggers and views recreated. The
// installation's install_id is regenerated, so no two test databases share one. Safe for
// concurrent use; fails tb if the server cannot be reached or the clone fails.
func New(tb testing.TB) *DB {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, err := mysql.ParseDSN(ServerDSN())
	if err != nil {
		tb.Fatalf("testdb: SLUICE_TEST_MYSQL_DSN: %v", err)
	}
	admin, err := adminDB(ctx)
	if err != nil {
		tb.Fatalf("testdb: MySQL/MariaDB is not reachable (%v); run `make services` (deploy/local/setup.sh) or set SLUICE_TEST_MYSQL_DSN", err)
	}
	p, err := templatePlan(ctx, admin)
	if err != nil {
		tb.Fatalf("testdb: template: %v", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := Prefix + strings.ToLower(hex.EncodeToString(b[:]))
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name+" CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		tb.Fatalf("testdb: create database: %v", err)
	}
	created.add(name)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
			tb.Errorf("testdb: drop %s: %v", name, err)
			return
		}
		created.remove(name)
	})
	if err := p.clone(ctx, admin, name); err != nil {
		tb.Fatalf("testdb: clone %s into %s: %v", p.src, name, err)
	}
	dbCfg := cfg.Clone()
	dbCfg.DBName = name
	dsn := dbCfg.FormatDSN()
	db, err := store.OpenMulti(ctx, dsn)
	if err != nil {
		tb.Fatalf("testdb: open %s: %v", name, err)
	}
	tb.Cleanup(func() { db.Close() })
	return &DB{DB: db, DSN: dsn, Name: name}
}

// Plain opens another pool on the database as sluice opens its ordinary one (store.Open: a
// statement cannot stack a second), closed when tb ends.
func (d *DB) Plain(tb testing.TB) *sql.DB {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := store.Open(ctx, d.DSN)
	if err != nil {
		tb.Fatalf("testdb: open %s: %v", d.Name, err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}

// WithIDStep returns d seen through sessions whose auto_increment_increment is step, with an
// offset of 2 when step allows (Galera sets both per node: increment the cluster size, offset the
// node's place), so that one multi-row INSERT's ids are not consecutive. Its DB is a new
// OpenMulti pool, closed when tb ends; its DSN carries the setting to processes a test starts.
func (d *DB) WithIDStep(tb testing.TB, step int) *DB {
	tb.Helper()
	cfg, err := mysql.ParseDSN(d.DSN)
	if err != nil {
		tb.Fatalf("testdb: %v", err)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["auto_increment_increment"] = strconv.Itoa(step)
	cfg.Params["auto_increment_offset"] = strconv.Itoa(min(2, step))
	dsn := cfg.FormatDSN()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := store.OpenMulti(ctx, dsn)
	if err != nil {
		tb.Fatalf("testdb: open %s: %v", d.Name, err)
	}
	tb.Cleanup(func() { db.Close() })
	return &DB{DB: db, DSN: dsn, Name: d.Name}
}

// Undropped returns the databases New created in this process that are not dropped yet, sorted.
// After every test of a package has ended it should be empty: a name here is a leak.
func Undropped() []string { return created.list() }

// created is the set of databases New made and has not dropped yet.
var created = &nameSet{m: map[string]bool{}}

type nameSet struct {
	mu sync.Mutex
	m  map[string]bool
}

func (s *nameSet) add(n string)    { s.mu.Lock(); s.m[n] = true; s.mu.Unlock() }
func (s *nameSet) remove(n string) { s.mu.Lock(); delete(s.m, n); s.mu.Unlock() }
func (s *nameSet) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.m))
	for n := range s.m {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// admin is the process's pool on the server without a database, shared by every New and
// cleanup so that each test costs no extra connection set-up. Closed by Close.
var admin struct {
	mu  sync.Mutex
	db  *sql.DB
	err error
}

func adminDB(ctx context.Context) (*sql.DB, error) {
	admin.mu.Lock()
	defer admin.mu.Unlock()
	if admin.db != nil {
		return admin.db, nil
	}
	cfg, err := mysql.ParseDSN(ServerDSN())
	if err != nil {
		return nil, fmt.Errorf("SLUICE_TEST_MYSQL_DSN: %w", err)
	}
	db, err := store.OpenMulti(ctx, cfg.FormatDSN()) // a clone is one script of many statements
	if err != nil {
		return nil, err
	}
	db.SetMaxIdleConns(4)
	admin.db = db
	return db, nil
}

// Close closes the pool New shares, for a TestMain that checks for leaked goroutines after its
// tests. A later New opens it again.
func Close() {
	admin.mu.Lock()
	defer admin.mu.Unlock()
	if admin.db != nil {
		admin.db.Close()
		admin.db = nil
	}
}

// tpl is the process's template: found or made once.
var tpl struct {
	once sync.Once
	plan *plan
	err  error
}

func templatePlan(ctx context.Context, db *sql.DB) (*plan, error) {
	tpl.once.Do(func() {
		var name string
		if name, tpl.err = TemplateName(); tpl.err != nil {
			return
		}
		if tpl.err = ensureTemplate(ctx, db, name); tpl.err != nil {
			return
		}
		tpl.plan, tpl.err = readPlan(ctx, db, name)
	})
	return tpl.plan, tpl.err
}

// TemplateName returns the name of the template database for the embedded migrations:
// sluice_tpl_ and the first 12 hex digits of a SHA-256 over every migration's version, name and
// text.
func TemplateName() (string, error) {
	all, err := migrations.All()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, m := range all {
		fmt.Fprintf(h, "%d\x00%s\x00%d\x00%s\x00", m.Version, m.Name, len(m.SQL), m.SQL)
	}
	return "sluice_tpl_" + hex.EncodeToString(h.Sum(nil))[:12], nil
}

// ensureTemplate makes name a database with every migration applied, unless it already is one.
// A named lock serialises test processes: the second waits, then finds the template complete. A
// template is complete when schema_migrations lists every embedded version (Up records each
// version after its statements, so a process killed mid-way leaves one that is not); an
// incomplete one is dropped and made again.
func ensureTemplate(ctx context.Context, db *sql.DB, name string) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	lock := "sluice.testdb." + name
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 120)", lock).Scan(&got); err != nil {
		return fmt.Errorf("take lock %s: %w", lock, err)
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("lock %s is held by another process (waited 120 s)", lock)
	}
	defer func() { _, _ = conn.ExecContext(context.Background(), "SELECT RELEASE_LOCK(?)", lock) }()
	cfg, err := mysql.ParseDSN(ServerDSN())
	if err != nil {
		return err
	}
	cfg.DBName = name
	var exists int
	if err := conn.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", name).Scan(&exists); err != nil {
		return err
	}
	if exists == 1 {
		tdb, err := store.Open(ctx, cfg.FormatDSN())
		if err != nil {
			return err
		}
		current, err := migrations.Current(ctx, tdb)
		tdb.Close()
		if err == nil && current {
			return nil
		}
		if _, err := conn.ExecContext(ctx, "DROP DATABASE "+name); err != nil {
			return fmt.Errorf("drop incomplete template: %w", err)
		}
	}
	if _, err := conn.ExecContext(ctx, "CREATE DATABASE "+name+" CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	tdb, err := store.Open(ctx, cfg.FormatDSN())
	if err != nil {
		return err
	}
	defer tdb.Close()
	if _, err := migrations.Up(ctx, tdb, nil); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// Explain returns the plan MariaDB gives q with args, a row a table read, each row by column name
// (id, select_type, table, type, key, rows, Extra, ...), for the tests that hold a statement to
// its plan.
func (d *DB) Explain(tb testing.TB, q string, args ...any) []map[string]string {
	tb.Helper()
	rows, err := d.QueryContext(context.Background(), "EXPLAIN "+q, args...)
	if err != nil {
		tb.Fatal(err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		tb.Fatal(err)
	}
	var plan []map[string]string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			tb.Fatal(err)
		}
		row := map[string]string{}
		for i, c := range cols {
			row[c] = vals[i].String
		}
		plan = append(plan, row)
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	return plan
}
