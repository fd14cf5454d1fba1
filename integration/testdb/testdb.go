// Package testdb gives each test a freshly migrated MySQL/MariaDB database of its own, created on
// the server named by SLUICE_TEST_MYSQL_DSN (default root@tcp(127.0.0.1:3306)/) and dropped when
// the test ends, so tests can run in parallel and leave nothing behind.
package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"strings"
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

// DB is a test's own database.
type DB struct {
	*sql.DB
	// DSN names the database, for processes the test starts.
	DSN string
	// Name is the database's name.
	Name string
}

// New creates, migrates and returns a database for tb, dropped in tb.Cleanup.
func New(tb testing.TB) *DB {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := mysql.ParseDSN(ServerDSN())
	if err != nil {
		tb.Fatalf("testdb: SLUICE_TEST_MYSQL_DSN: %v", err)
	}
	admin, err := store.Open(ctx, cfg.FormatDSN())
	if err != nil {
		tb.Fatalf("testdb: MySQL/MariaDB is not reachable (%v); run deploy/local/setup.sh or set SLUICE_TEST_MYSQL_DSN", err)
	}
	defer admin.Close()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "sluice_t_" + strings.ToLower(hex.EncodeToString(b[:]))
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name+" CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		tb.Fatalf("testdb: create database: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		admin, err := store.Open(ctx, cfg.FormatDSN())
		if err != nil {
			tb.Errorf("testdb: drop %s: %v", name, err)
			return
		}
		defer admin.Close()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
			tb.Errorf("testdb: drop %s: %v", name, err)
		}
	})
	dbCfg := cfg.Clone()
	dbCfg.DBName = name
	dsn := dbCfg.FormatDSN()
	db, err := store.Open(ctx, dsn)
	if err != nil {
		tb.Fatalf("testdb: open %s: %v", name, err)
	}
	tb.Cleanup(func() { db.Close() })
	if _, err := migrations.Up(ctx, db, nil); err != nil {
		tb.Fatalf("testdb: migrate %s: %v", name, err)
	}
	return &DB{DB: db, DSN: dsn, Name: name}
}
