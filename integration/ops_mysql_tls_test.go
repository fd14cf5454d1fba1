package integration_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/tlstest"
)

// TestOpsMySQLTLS: against a test-owned MariaDB that requires TLS (require_secure_transport)
// with a certificate from the test's own CA, the sluice binary connects with SLUICE_MYSQL_CA
// and applies the migrations; without it, or with another CA, it is refused. A user created
// REQUIRE X509 connects only when SLUICE_MYSQL_CERT and SLUICE_MYSQL_KEY give it a client
// certificate from that CA (issue 30, finding 9).
func TestOpsMySQLTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "sluice-test-mysql-ca")
	caFile := filepath.Join(dir, "ca.pem")
	tlstest.WriteFile(t, caFile, ca.CertPEM)
	otherCA := filepath.Join(dir, "other-ca.pem")
	tlstest.WriteFile(t, otherCA, tlstest.NewCA(t, "another-ca").CertPEM)
	serverCert, serverKey := ca.Server(t, "mariadb").Files(t, dir, "server")
	clientCert, clientKey := ca.Client(t, "x509").Files(t, dir, "client")

	// The test's own way in, apart from the code under test.
	name := "ops-mysql-tls-" + t.Name()
	if err := mysql.RegisterTLSConfig(name, &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mysql.DeregisterTLSConfig(name) })
	m := startMariaDBWith(t, mariadbOptions{TLS: name, Args: []string{"--ssl-ca=" + caFile,
		"--ssl-cert=" + serverCert, "--ssl-key=" + serverKey, "--require-secure-transport=ON"}})
	cfg, err := mysql.ParseDSN(m.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	cfg.TLSConfig = name
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	root, err := store.Open(ctx, cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for _, q := range []string{"CREATE DATABASE sluice", "CREATE USER 'x509'@'%' REQUIRE X509",
		"GRANT ALL ON sluice.* TO 'x509'@'%'"} {
		if _, err := root.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	bin := harness.BuildSluice(t)
	x509DSN := strings.Replace(m.DSN("sluice"), "root@", "x509@", 1)
	for _, tc := range []struct {
		what string
		args []string
		env  map[string]string
		ok   bool
		want string // in the output
	}{
		{"no TLS settings", []string{"migrate", "up"}, map[string]string{"SLUICE_MYSQL_DSN": m.DSN("sluice")}, false, "Access denied"}, // MariaDB refuses a plain connection so,
		{"another CA", []string{"migrate", "up"}, map[string]string{"SLUICE_MYSQL_DSN": m.DSN("sluice"), "SLUICE_MYSQL_CA": otherCA}, false, "x509"},
		{"the server's CA", []string{"migrate", "up"}, map[string]string{"SLUICE_MYSQL_DSN": m.DSN("sluice"), "SLUICE_MYSQL_CA": caFile}, true, "applied"},
		{"an X509 user without a client certificate", []string{"migrate", "status"},
			map[string]string{"SLUICE_MYSQL_DSN": x509DSN, "SLUICE_MYSQL_CA": caFile}, false, "Access denied"},
		{"an X509 user with its client certificate", []string{"migrate", "status"}, map[string]string{"SLUICE_MYSQL_DSN": x509DSN,
			"SLUICE_MYSQL_CA": caFile, "SLUICE_MYSQL_CERT": clientCert, "SLUICE_MYSQL_KEY": clientKey}, true, "applied"},
	} {
		out, err := runSluice(ctx, bin, tc.env, tc.args...)
		if (err == nil) != tc.ok || !strings.Contains(out, tc.want) {
			t.Errorf("%s: sluice %s: %v, want success %v and %q in:\n%s", tc.what, strings.Join(tc.args, " "), err, tc.ok, tc.want, out)
		}
	}
}

// runSluice runs the sluice binary with args, with env as its only SLUICE_* settings, and
// returns its combined output.
func runSluice(ctx context.Context, bin string, env map[string]string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLUICE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, fmt.Sprintf("%s=%s", k, v))
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}
