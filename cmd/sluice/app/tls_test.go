package app

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/integration/tlstest"
	"github.com/sluicehq/sluice/integration/wait"
)

// lockedBuffer is a log sink safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// tlsSetup serves a /healthz answering 200 over HTTPS with a certReloader on the pair of files
// it writes first with a self-signed certificate, on a real loopback listener, the way the
// App's listeners do (httpServer.useTLS), and returns the reloader, the file paths, the
// address and the log.
func tlsSetup(t *testing.T) (r *certReloader, first tlstest.Pair, certFile, keyFile, addr string, log *lockedBuffer) {
	t.Helper()
	first = tlstest.NewCA(t, "first").Pair
	certFile, keyFile = first.Files(t, t.TempDir(), "api")
	log = &lockedBuffer{}
	r, err := newCertReloader(certFile, keyFile, slog.New(slog.NewJSONHandler(log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, `{"status":"ok"}`) })
	srv := newHTTPServer(mux)
	srv.useTLS(r, slog.New(slog.NewJSONHandler(log, nil)))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.serveOn(l)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return r, first, certFile, keyFile, l.Addr().String(), log
}

// servedCert GETs /healthz over HTTPS with a client that trusts only pool, and returns the
// certificate the server presented; the answer must be 200. A client that does not trust the
// certificate served fails the handshake, and the error is returned.
func servedCert(addr string, pool *x509.CertPool) (*x509.Certificate, error) {
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	resp, err := c.Get("https://" + addr + "/healthz")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, &statusError{resp.StatusCode}
	}
	return resp.TLS.PeerCertificates[0], nil
}

type statusError struct{ code int }

func (e *statusError) Error() string { return http.StatusText(e.code) }

// TestCertReloaderServesAndReloads: an HTTPS client that trusts the self-signed certificate of
// the files gets 200 from /healthz; after the files are replaced and reloaded, the new
// certificate is served (a client that trusts only it gets 200), and the old one no longer is.
func TestCertReloaderServesAndReloads(t *testing.T) {
	r, first, certFile, keyFile, addr, _ := tlsSetup(t)
	cert, err := servedCert(addr, first.Pool())
	if err != nil {
		t.Fatalf("a client trusting the certificate: %v", err)
	}
	if cert.SerialNumber.Cmp(first.Cert.SerialNumber) != 0 {
		t.Fatalf("served serial %v, want %v", cert.SerialNumber, first.Cert.SerialNumber)
	}
	if _, err := servedCert(addr, x509.NewCertPool()); err == nil {
		t.Fatal("a client trusting nothing completed the handshake")
	}

	second := tlstest.NewCA(t, "second").Pair
	second.Write(t, certFile, keyFile)
	if changed, _, err := r.reload(); err != nil || !changed {
		t.Fatalf("reload: changed %v, error %v; want a change", changed, err)
	}
	cert, err = servedCert(addr, second.Pool())
	if err != nil {
		t.Fatalf("a client trusting the new certificate: %v", err)
	}
	if cert.SerialNumber.Cmp(second.Cert.SerialNumber) != 0 {
		t.Fatalf("served serial %v after the reload, want the new %v", cert.SerialNumber, second.Cert.SerialNumber)
	}
	if _, err := servedCert(addr, first.Pool()); err == nil {
		t.Fatal("the old certificate is still served after the reload")
	}
	if changed, _, err := r.reload(); err != nil || changed {
		t.Fatalf("a reload of unchanged files: changed %v, error %v; want neither", changed, err)
	}
}

// TestCertReloaderKeepsOldOnFailure: files that cannot be used (a key that does not match the
// certificate, as while a renewal has written only one file; a missing file) leave the
// previous certificate served, and are logged: once per bad pair when a poll finds them, every
// time a reload is asked for.
func TestCertReloaderKeepsOldOnFailure(t *testing.T) {
	r, first, certFile, keyFile, addr, log := tlsSetup(t)
	pool := first.Pool()
	tlstest.WriteFile(t, certFile, tlstest.NewCA(t, "half-renewed").CertPEM) // the key is still first's
	for range 3 {
		if err := r.reloadAndLog("poll"); err == nil {
			t.Fatal("a certificate that does not match its key was loaded")
		}
	}
	if err := r.reloadAndLog("SIGHUP"); err == nil {
		t.Fatal("a certificate that does not match its key was loaded")
	}
	if n := strings.Count(log.String(), "TLS certificate not reloaded"); n != 2 {
		t.Errorf("%d failure lines for 3 polls and a SIGHUP of the same bad pair, want 2:\n%s", n, log)
	}
	if cert, err := servedCert(addr, pool); err != nil || cert.SerialNumber.Cmp(first.Cert.SerialNumber) != 0 {
		t.Fatalf("after a failed reload: %v, %v; want the first certificate still served", cert, err)
	}
	if _, _, err := r.reload(); err == nil || !strings.Contains(err.Error(), certFile) {
		t.Errorf("reload error %v, want one naming %s", err, certFile)
	}
	if err := newCertReloaderErr(filepath.Join(t.TempDir(), "missing.pem"), keyFile); err == nil ||
		!strings.Contains(err.Error(), "SLUICE_TLS_CERT") {
		t.Errorf("a missing certificate at start: %v, want an error naming SLUICE_TLS_CERT", err)
	}
}

func newCertReloaderErr(certFile, keyFile string) error {
	_, err := newCertReloader(certFile, keyFile, slog.New(slog.DiscardHandler))
	return err
}

// TestCertReloaderPollsFiles: with no signal, run notices files replaced (certificate first,
// then key, as a renewal writes them) and serves the new pair.
func TestCertReloaderPollsFiles(t *testing.T) {
	r, _, certFile, keyFile, addr, log := tlsSetup(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.run(ctx, 5*time.Millisecond)
	}()
	t.Cleanup(func() { cancel(); <-done })
	renewed := tlstest.NewCA(t, "renewed").Pair
	renewed.Write(t, certFile, keyFile)
	pool := renewed.Pool()
	wait.For(t, 10*time.Second, "the renewed certificate to be served", func() (bool, error) {
		cert, err := servedCert(addr, pool)
		return err == nil && cert.SerialNumber.Cmp(renewed.Cert.SerialNumber) == 0, err
	})
	if !strings.Contains(log.String(), `"trigger":"poll"`) {
		t.Errorf("no log line for the reload:\n%s", log)
	}
}

// TestTLSSettingsBothOrNone: a certificate without a key, or a key without a certificate, is
// refused at start, naming the missing setting; nothing is connected to first.
func TestTLSSettingsBothOrNone(t *testing.T) {
	for _, tc := range []struct {
		cert, key, want string
	}{
		{"cert.pem", "", "SLUICE_TLS_KEY"},
		{"", "key.pem", "SLUICE_TLS_CERT"},
	} {
		_, err := Start(context.Background(), Options{MySQLDSN: "unused", NATSURL: "unused", Relay: true, TLSCertFile: tc.cert, TLSKeyFile: tc.key, Log: slog.New(slog.DiscardHandler)})
		if err == nil || !strings.Contains(err.Error(), tc.want+")") || !strings.HasPrefix(err.Error(), "invalid config: TLS") {
			t.Errorf("cert %q, key %q: %v, want an invalid config error naming %s", tc.cert, tc.key, err, tc.want)
		}
	}
}
