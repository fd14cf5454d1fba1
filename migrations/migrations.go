// Package migrations holds sluice's versioned schema and applies it. The SQL files are embedded
// in the binary; `sluice migrate up` applies the pending ones in order, recording each in
// schema_migrations. A named lock (GET_LOCK) makes concurrent runs from several processes safe:
// the second waits, then finds nothing to do.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

//go:embed *.sql
var files embed.FS

// lockName is the MySQL named lock every migration run holds.
const lockName = "sluice.migrate"

// Migration is one embedded SQL file.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Status is a migration and whether (and when) it was applied.
type Status struct {
	Migration
	AppliedAt *time.Time
}

// All returns the embedded migrations in version order.
func All() ([]Migration, error) {
	entries, err := fs.ReadDir(files, ".")
	if err != nil {
		return nil, fmt.Errorf("read embedded migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		if !ok {
			return nil, fmt.Errorf("migration %q: name must be NNNN_description.sql", name)
		}
		v, err := strconv.Atoi(num)
		if err != nil {
			return nil, fmt.Errorf("migration %q: version: %w", name, err)
		}
		body, err := files.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("migration %q: %w", name, err)
		}
		out = append(out, Migration{Version: v, Name: strings.TrimSuffix(name, ".sql"), SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("migrations %q and %q share version %d", out[i-1].Name, out[i].Name, out[i].Version)
		}
	}
	return out, nil
}

// StatementTimeout is the read timeout DSN gives a migration's connection: above any statement a
// migration runs. A table rebuild or an index build takes tens of seconds per million jobs on a
// small server (deploy/RUNBOOK.md, "Upgrades: what each migration locks"), and the 30 s read
// timeout sluice's pools use by default would cut such a statement: the client gives up while
// the server goes on, the version is not recorded, and the next run fails on the half-applied
// migration.
const StatementTimeout = 6 * time.Hour

// DSN returns dsn for a connection that applies migrations: with a read timeout of
// StatementTimeout, unless dsn sets one of its own (an operator's choice wins). Errors are the
// driver's, for a DSN it cannot parse.
func DSN(dsn string) (string, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", fmt.Errorf("invalid MySQL DSN: %w", err)
	}
	if cfg.ReadTimeout == 0 {
		cfg.ReadTimeout = StatementTimeout
	}
	return cfg.FormatDSN(), nil
}

// Latest returns the highest embedded migration version.
func Latest() int {
	all, err := All()
	if err != nil || len(all) == 0 {
		return 0
	}
	return all[len(all)-1].Version
}

// Up applies every pending migration in order and returns the ones it applied. progress, if not
// nil, is called before each one. Safe to run concurrently from several processes.
func Up(ctx context.Context, db *sql.DB, progress func(Migration)) ([]Migration, error) {
	all, err := All()
	if err != nil {
		return nil, err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: connect: %w", err)
	}
	defer conn.Close()
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 60)", lockName).Scan(&got); err != nil {
		return nil, fmt.Errorf("migrate: take lock %s: %w", lockName, err)
	}
	if !got.Valid || got.Int64 != 1 {
		return nil, fmt.Errorf("migrate: lock %s is held by another process (waited 60 s)", lockName)
	}
	defer func() {
		// A fresh context: release the lock even if ctx was canceled.
		_, _ = conn.ExecContext(context.Background(), "SELECT RELEASE_LOCK(?)", lockName)
	}()
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version INT NOT NULL PRIMARY KEY,
		name VARCHAR(255) NOT NULL,
		applied_at DATETIME(6) NOT NULL) ENGINE=InnoDB`); err != nil {
		return nil, fmt.Errorf("migrate: create schema_migrations: %w", err)
	}
	applied, err := appliedVersions(ctx, conn)
	if err != nil {
		return nil, err
	}
	var done []Migration
	for _, m := range all {
		if _, ok := applied[m.Version]; ok {
			continue
		}
		if progress != nil {
			progress(m)
		}
		// DDL commits implicitly in MySQL, so a migration cannot be one transaction; each
		// statement is applied in order and the version is recorded last. Migrations are written
		// so that a half-applied one fails loudly on re-run rather than silently diverging.
		for i, stmt := range Statements(m.SQL) {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				return done, fmt.Errorf("migrate: %s statement %d: %w", m.Name, i+1, err)
			}
		}
		if _, err := conn.ExecContext(ctx,
			"INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, UTC_TIMESTAMP(6))",
			m.Version, m.Name); err != nil {
			return done, fmt.Errorf("migrate: record %s: %w", m.Name, err)
		}
		done = append(done, m)
	}
	return done, nil
}

// List returns every embedded migration with its applied time, if any.
func List(ctx context.Context, db *sql.DB) ([]Status, error) {
	all, err := All()
	if err != nil {
		return nil, err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate status: connect: %w", err)
	}
	defer conn.Close()
	applied, err := appliedVersions(ctx, conn)
	if err != nil {
		return nil, err
	}
	out := make([]Status, len(all))
	for i, m := range all {
		out[i].Migration = m
		if at, ok := applied[m.Version]; ok {
			at := at
			out[i].AppliedAt = &at
		}
	}
	return out, nil
}

// Current reports whether every embedded migration has been applied. Every version is checked,
// not only the highest: branches merged out of order add migrations below versions a database
// may already have.
func Current(ctx context.Context, db *sql.DB) (bool, error) {
	list, err := List(ctx, db)
	if err != nil {
		return false, err
	}
	for _, m := range list {
		if m.AppliedAt == nil {
			return false, nil
		}
	}
	return true, nil
}

func appliedVersions(ctx context.Context, conn *sql.Conn) (map[int]time.Time, error) {
	rows, err := conn.QueryContext(ctx, "SELECT version, applied_at FROM schema_migrations")
	if err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1146 { // no such table: nothing applied yet
			return map[int]time.Time{}, nil
		}
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	defer rows.Close()
	out := map[int]time.Time{}
	for rows.Next() {
		var v int
		var at time.Time
		if err := rows.Scan(&v, &at); err != nil {
			return nil, fmt.Errorf("read schema_migrations: %w", err)
		}
		out[v] = at
	}
	return out, rows.Err()
}

// Statements splits a migration into statements: comment lines are dropped and a statement ends
// with a semicolon at the end of a line.
func Statements(src string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(src, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(trimmed, ";") {
			stmt := strings.TrimSuffix(strings.TrimSpace(cur.String()), ";")
			out = append(out, stmt)
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}
