package app

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// tlsCheckInterval is how often the certificate files are read for a change: a renewed
// certificate is installed days before the old one expires, so seconds do not matter, and
// reading two small files every 10 s costs nothing an idle process would notice (SPEC §14).
const tlsCheckInterval = 10 * time.Second

// certReloader serves the listeners' certificate from a pair of PEM files (SLUICE_TLS_CERT,
// SLUICE_TLS_KEY) and serves a new pair once the files hold one, so that a renewed certificate
// is picked up without a restart: on SIGHUP (App.ReloadTLS) or when the files change (run).
// A pair that cannot be used leaves the served certificate as it was. Safe for concurrent use.
type certReloader struct {
	certFile, keyFile string
	log               *slog.Logger
	current           atomic.Pointer[tls.Certificate]

	mu sync.Mutex // serialises reloads; guards the file contents below
	// certPEM and keyPEM are what the files held when current was read from them.
	certPEM, keyPEM []byte
	// badCert and badKey are the last contents that could not be used, so that a poll logs a
	// bad pair once, not every tlsCheckInterval until someone fixes it.
	badCert, badKey []byte
}

// newCertReloader reads the pair once: a process whose certificate cannot be loaded does not
// start, the error naming the settings.
func newCertReloader(certFile, keyFile string, log *slog.Logger) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile, log: log}
	if _, _, err := r.reload(); err != nil {
		return nil, fmt.Errorf("invalid config: TLS certificate (SLUICE_TLS_CERT, SLUICE_TLS_KEY): %w", err)
	}
	return r, nil
}

// tlsConfig is the listeners' TLS configuration: the current certificate at every handshake,
// TLS 1.2 at least.
func (r *certReloader) tlsConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.getCertificate}
}

func (r *certReloader) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.current.Load(), nil
}

// reload is one pass: it reads both files and, if they differ from the pair being served,
// parses them and serves the new pair. It reports whether the served certificate changed. A
// pair that cannot be read or used (a key that does not match its certificate, as while a
// renewal has written one file and not yet the other) is returned as the error, and the
// served certificate stays as it was; again reports that the same unusable contents were
// found by the previous pass as well.
func (r *certReloader) reload() (changed, again bool, err error) {
	certPEM, err := os.ReadFile(r.certFile)
	if err != nil {
		return false, false, fmt.Errorf("read the certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(r.keyFile)
	if err != nil {
		return false, false, fmt.Errorf("read the key: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.current.Load() != nil && bytes.Equal(certPEM, r.certPEM) && bytes.Equal(keyPEM, r.keyPEM) {
		return false, false, nil
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		again = r.badCert != nil && bytes.Equal(certPEM, r.badCert) && bytes.Equal(keyPEM, r.badKey)
		r.badCert, r.badKey = certPEM, keyPEM
		return false, again, fmt.Errorf("%s and %s: %w", r.certFile, r.keyFile, err)
	}
	r.current.Store(&cert)
	r.certPEM, r.keyPEM, r.badCert, r.badKey = certPEM, keyPEM, nil, nil
	return true, false, nil
}

// reloadAndLog runs reload and logs what it did, naming what triggered it ("poll", "SIGHUP").
// A poll logs a failure once per unusable pair of contents, not every tlsCheckInterval until
// someone fixes it, and says nothing when nothing changed; a reload asked for always answers.
func (r *certReloader) reloadAndLog(trigger string) error {
	changed, again, err := r.reload()
	poll := trigger == "poll"
	switch {
	case err != nil && !(poll && again):
		r.log.Error("TLS certificate not reloaded: still serving the previous one", "trigger", trigger,
			"cert_file", r.certFile, "key_file", r.keyFile, "error", err)
	case changed:
		leaf := r.current.Load().Leaf
		r.log.Info("TLS certificate reloaded", "trigger", trigger, "cert_file", r.certFile,
			"subject", leaf.Subject.String(), "serial", leaf.SerialNumber.String(), "not_after", leaf.NotAfter)
	case err == nil && !poll:
		r.log.Info("TLS certificate files unchanged: still serving the same certificate", "trigger", trigger, "cert_file", r.certFile)
	}
	return err
}

// run reloads every interval until ctx ends.
func (r *certReloader) run(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			_ = r.reloadAndLog("poll")
		}
	}
}

// useTLS makes s serve HTTPS with the certificates of certs. HTTP/2 stays off: the listener's
// bounds (MaxConns connections, each carrying one request at a time, and the timeouts) were
// set for HTTP/1.1, the only protocol the plain listener speaks, and HTTP/2 would multiplex
// many requests behind each of them. The server's own messages, which over TLS are almost all
// clients' failed handshakes (scanners, a client that does not trust the certificate: the
// client's to report), go to the log at debug instead of plain lines on stderr.
func (s *httpServer) useTLS(certs *certReloader, log *slog.Logger) {
	s.TLSConfig = certs.tlsConfig()
	s.Protocols = new(http.Protocols)
	s.Protocols.SetHTTP1(true)
	s.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelDebug)
}

// serveOn serves on l, over TLS if useTLS was called, until Shutdown or Close.
func (s *httpServer) serveOn(l net.Listener) error {
	if s.TLSConfig != nil {
		// The certificate comes from TLSConfig.GetCertificate, hence no file names.
		return s.ServeTLS(l, "", "")
	}
	return s.Serve(l)
}
