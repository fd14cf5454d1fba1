package store_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/tlstest"
)

// TestWithTLS: the DSN keeps everything the operator wrote and gains tls=<a registered name>
// whose configuration verifies the server (against the CA file, under the DSN's host name)
// and presents the client certificate when one is set; no file set leaves the DSN alone.
func TestWithTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "mysql-ca")
	caFile := filepath.Join(dir, "ca.pem")
	tlstest.WriteFile(t, caFile, ca.CertPEM)
	certFile, keyFile := ca.Client(t, "sluice").Files(t, dir, "client")
	const dsn = "sluice:p@ss?w/rd@tcp(db-1.internal:3306)/sluice?timeout=3s&sql_mode=%27ANSI%27"

	if got, err := store.WithTLS(dsn, store.TLSFiles{}); err != nil || got != dsn {
		t.Fatalf("no files: %q, %v; want the DSN unchanged", got, err)
	}
	for _, tc := range []struct {
		name       string
		files      store.TLSFiles
		clientCert bool
	}{
		{"CA", store.TLSFiles{CA: caFile}, false},
		{"client certificate, system roots", store.TLSFiles{Cert: certFile, Key: keyFile}, true},
		{"CA and client certificate", store.TLSFiles{CA: caFile, Cert: certFile, Key: keyFile}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := store.WithTLS(dsn, tc.files)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := mysql.ParseDSN(got)
			if err != nil {
				t.Fatalf("the DSN %q does not parse: %v", got, err)
			}
			if !strings.HasPrefix(cfg.TLSConfig, "sluice-") || cfg.TLS == nil {
				t.Fatalf("tls=%q, configuration %v; want a registered sluice-... configuration", cfg.TLSConfig, cfg.TLS)
			}
			if cfg.User != "sluice" || cfg.Passwd != "p@ss?w/rd" || cfg.Addr != "db-1.internal:3306" || cfg.DBName != "sluice" ||
				cfg.Timeout != 3*time.Second || cfg.Params["sql_mode"] != "'ANSI'" {
				t.Errorf("the DSN lost what the operator wrote: %q", got)
			}
			if cfg.TLS.InsecureSkipVerify || cfg.TLS.ServerName != "db-1.internal" {
				t.Errorf("server check: skip %v, name %q; want the DSN's host verified", cfg.TLS.InsecureSkipVerify, cfg.TLS.ServerName)
			}
			if (tc.files.CA != "") != (cfg.TLS.RootCAs != nil) {
				t.Errorf("RootCAs set: %v, want %v (the CA file, else the system's roots)", cfg.TLS.RootCAs != nil, tc.files.CA != "")
			}
			if got := len(cfg.TLS.Certificates); got != map[bool]int{false: 0, true: 1}[tc.clientCert] {
				t.Errorf("%d client certificates", got)
			}
		})
	}
	a, _ := store.WithTLS(dsn, store.TLSFiles{CA: caFile})
	b, _ := store.WithTLS(dsn, store.TLSFiles{CA: caFile, Cert: certFile, Key: keyFile})
	if a == b {
		t.Error("two sets of files share one registered name")
	}
}

// TestWithTLSErrors: a file that cannot be used, half a client pair, or a DSN that decides TLS
// itself is refused, naming the setting.
func TestWithTLSErrors(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "mysql-ca")
	caFile := filepath.Join(dir, "ca.pem")
	tlstest.WriteFile(t, caFile, ca.CertPEM)
	certFile, keyFile := ca.Client(t, "sluice").Files(t, dir, "client")
	_, otherKey := ca.Client(t, "other").Files(t, dir, "other")
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	const dsn = "root@tcp(127.0.0.1:3306)/sluice"
	for _, tc := range []struct {
		name  string
		dsn   string
		files store.TLSFiles
		want  []string
		is    error
	}{
		{"missing CA", dsn, store.TLSFiles{CA: missing}, []string{"SLUICE_MYSQL_CA"}, fs.ErrNotExist},
		{"CA not PEM", dsn, store.TLSFiles{CA: notPEM}, []string{"SLUICE_MYSQL_CA", notPEM}, nil},
		{"certificate without key", dsn, store.TLSFiles{Cert: certFile}, []string{"SLUICE_MYSQL_KEY"}, nil},
		{"key without certificate", dsn, store.TLSFiles{CA: caFile, Key: keyFile}, []string{"SLUICE_MYSQL_CERT"}, nil},
		{"missing certificate", dsn, store.TLSFiles{Cert: missing, Key: keyFile}, []string{"SLUICE_MYSQL_CERT"}, fs.ErrNotExist},
		{"key of another certificate", dsn, store.TLSFiles{Cert: certFile, Key: otherKey}, []string{"SLUICE_MYSQL_CERT", "SLUICE_MYSQL_KEY"}, nil},
		{"DSN sets tls too", dsn + "?tls=skip-verify", store.TLSFiles{CA: caFile}, []string{"tls=skip-verify", "SLUICE_MYSQL_DSN"}, nil},
		{"DSN does not parse", "not a dsn", store.TLSFiles{CA: caFile}, []string{"invalid MySQL DSN"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := store.WithTLS(tc.dsn, tc.files)
			if err == nil {
				t.Fatalf("got DSN %q, want an error", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %s", err, w)
				}
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %q does not wrap %v", err, tc.is)
			}
		})
	}
}

// TestWithTLSNoPlaintextFallback: a DSN made by WithTLS never falls back to plain TCP: against
// the shared MariaDB, which has no TLS, Open fails instead of connecting in clear.
func TestWithTLSNoPlaintextFallback(t *testing.T) {
	ca := tlstest.NewCA(t, "mysql-ca")
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	tlstest.WriteFile(t, caFile, ca.CertPEM)
	dsn, err := store.WithTLS("root@tcp(127.0.0.1:3306)/", store.TLSFiles{CA: caFile})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := store.Open(ctx, dsn)
	if err == nil {
		var cipher, value string
		_ = db.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Ssl_cipher'").Scan(&cipher, &value)
		db.Close()
		if value == "" {
			t.Fatal("a TLS DSN connected in clear to a server without TLS")
		}
		t.Skipf("the shared MariaDB speaks TLS (%s): nothing to check", value)
	}
	if !errors.Is(err, mysql.ErrNoTLS) {
		t.Errorf("Open: %v, want the driver's %v", err, mysql.ErrNoTLS)
	}
}
