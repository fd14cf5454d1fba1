package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/integration/testdb"
	"github.com/sluicehq/sluice/integration/tlstest"
)

// httpsGet GETs url with a client that trusts only pool and returns the status and the
// certificate the server presented.
func httpsGet(url string, pool *x509.CertPool) (int, *x509.Certificate, error) {
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(url)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.TLS.PeerCertificates[0], nil
}

// TestServeHTTPS: `sluice serve` with SLUICE_TLS_CERT and SLUICE_TLS_KEY serves the API and the
// separate metrics listener over HTTPS only: a client that trusts the self-signed certificate
// gets 200 from /healthz and /metrics, plain HTTP gets no answer of the API's. After the files
// are replaced and the process gets SIGHUP, the new certificate is served and the reload is
// logged (issue 30, finding 9). Settings left in the developer's environment are cleared
// first, and the process's SIGHUP is caught by serve, so the test cannot run in parallel.
func TestServeHTTPS(t *testing.T) {
	unsetSettings(t, true)
	dir := t.TempDir()
	first := tlstest.NewCA(t, "sluice-first").Pair
	certFile, keyFile := first.Files(t, dir, "api")
	apiAddr := fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))
	for k, v := range map[string]string{
		"SLUICE_MYSQL_DSN": testdb.New(t).DSN, "SLUICE_NATS_URL": natstest.Start(t).URL(),
		"SLUICE_LISTEN": apiAddr, "SLUICE_METRICS_LISTEN": metricsAddr, "SLUICE_SHUTDOWN_GRACE": "5s",
		"SLUICE_TOKENS":   `[{"name":"ops","token":"` + strings.Repeat("a", 40) + `","role":"admin"}]`,
		"SLUICE_TLS_CERT": certFile, "SLUICE_TLS_KEY": keyFile,
	} {
		t.Setenv(k, v)
	}
	stdout, stderr := &harness.SyncBuffer{}, &harness.SyncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, []string{"--api"}, stdout, stderr, false) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("sluice serve did not stop within 30 s")
		}
	})
	exited := func() {
		select {
		case err := <-done:
			t.Fatalf("sluice serve exited: %v\nstderr:\n%s", err, stderr)
		default:
		}
	}
	harness.WaitFor(t, 60*time.Second, "/healthz to answer 200 over HTTPS", func() (bool, error) {
		exited()
		code, cert, err := httpsGet("https://"+apiAddr+"/healthz", first.Pool())
		if err != nil {
			return false, err
		}
		if cert.SerialNumber.Cmp(first.Cert.SerialNumber) != 0 {
			return false, fmt.Errorf("served serial %v, want %v", cert.SerialNumber, first.Cert.SerialNumber)
		}
		if code != http.StatusOK {
			return false, fmt.Errorf("HTTP %d", code)
		}
		return true, nil
	})
	if code, _, err := httpsGet("https://"+metricsAddr+"/metrics", first.Pool()); err != nil || code != http.StatusOK {
		t.Errorf("/metrics on the metrics listener over HTTPS: %d, %v; want 200", code, err)
	}
	for _, addr := range []string{apiAddr, metricsAddr} {
		if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Errorf("plain HTTP to %s answered 200", addr)
			}
		}
	}

	second := tlstest.NewCA(t, "sluice-second").Pair
	second.Write(t, certFile, keyFile)
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 30*time.Second, "the new certificate to be served after SIGHUP", func() (bool, error) {
		exited()
		code, cert, err := httpsGet("https://"+apiAddr+"/healthz", second.Pool())
		if err != nil {
			return false, err
		}
		return code == http.StatusOK && cert.SerialNumber.Cmp(second.Cert.SerialNumber) == 0, nil
	})
	// The poll (every 10 s) may find the files first; the SIGHUP is answered either way.
	harness.WaitFor(t, 10*time.Second, "the SIGHUP to be logged", func() (bool, error) {
		return strings.Contains(stderr.String(), `"trigger":"SIGHUP"`), nil
	})
	if code, cert, err := httpsGet("https://"+metricsAddr+"/metrics", second.Pool()); err != nil || code != http.StatusOK ||
		cert.SerialNumber.Cmp(second.Cert.SerialNumber) != 0 {
		t.Errorf("/metrics after the reload: %d, %v; want 200 with the new certificate", code, err)
	}
}

// TestTLSSettingsRefused: a certificate without its key (or the reverse), for the listeners or
// for MySQL, stops the command before it connects to anything, naming the missing setting; and
// `sluice dev` refuses the listeners' TLS settings.
func TestTLSSettingsRefused(t *testing.T) {
	unsetSettings(t, true)
	dir := t.TempDir()
	certFile, keyFile := tlstest.NewCA(t, "sluice").Files(t, dir, "api")
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--relay", "--tls-cert", certFile}, "SLUICE_TLS_KEY"},
		{[]string{"serve", "--relay", "--tls-key", keyFile}, "SLUICE_TLS_CERT"},
		{[]string{"serve", "--relay", "--tls-cert", missing, "--tls-key", keyFile}, "SLUICE_TLS_CERT"},
		{[]string{"dev", "--tls-cert", certFile, "--tls-key", keyFile}, "`sluice dev` serves plain HTTP"},
		{[]string{"serve", "--relay", "--mysql-cert", certFile}, "SLUICE_MYSQL_KEY"},
		{[]string{"migrate", "--mysql-key", keyFile}, "SLUICE_MYSQL_CERT"},
		{[]string{"outbox", "status", "--mysql-ca", missing}, "SLUICE_MYSQL_CA"},
	} {
		stderr := &strings.Builder{}
		code := run(tc.args, io.Discard, stderr)
		if lines := strings.Split(strings.TrimSpace(stderr.String()), "\n"); code != 1 || !strings.Contains(lines[len(lines)-1], tc.want) {
			t.Errorf("sluice %s: exit %d, last line of stderr %q; want 1 and %s named", strings.Join(tc.args, " "), code, lines[len(lines)-1], tc.want)
		}
	}
}
