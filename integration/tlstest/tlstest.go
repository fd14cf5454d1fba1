// Package tlstest makes certificates for tests: a certificate authority of the test's own, the
// certificates it signs for loopback servers and for clients, written as PEM files where a
// setting names them. Nothing is read from or trusted by the system: a client trusts a test's
// CA only through Pool.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Pair is a certificate and its private key, PEM-encoded.
type Pair struct {
	Cert    *x509.Certificate
	CertPEM []byte
	KeyPEM  []byte
	key     *ecdsa.PrivateKey
}

// CA is a self-signed certificate authority. Its own Pair is itself a certificate for the
// loopback addresses, so a test that only needs "a self-signed certificate" serves CA.Pair.
type CA struct {
	Pair
}

// NewCA makes a self-signed CA named name (its common name), valid for an hour either side of
// now, whose certificate also names 127.0.0.1, ::1 and localhost.
func NewCA(tb testing.TB, name string) *CA {
	tb.Helper()
	tmpl := template(tb, name)
	tmpl.IsCA = true
	tmpl.KeyUsage |= x509.KeyUsageCertSign
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	key := newKey(tb)
	return &CA{Pair: sign(tb, tmpl, tmpl, &key.PublicKey, key, key)}
}

// Pool is a pool holding only p's certificate: for a CA, a client's RootCAs or a server's
// ClientCAs; for a self-signed certificate, the RootCAs of a client that trusts just it.
func (p Pair) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(p.Cert)
	return pool
}

// Server issues a server certificate named name for 127.0.0.1, ::1 and localhost.
func (ca *CA) Server(tb testing.TB, name string) Pair {
	tb.Helper()
	tmpl := template(tb, name)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	key := newKey(tb)
	return sign(tb, tmpl, ca.Cert, &key.PublicKey, ca.key, key)
}

// Client issues a client certificate whose common name is name.
func (ca *CA) Client(tb testing.TB, name string) Pair {
	tb.Helper()
	tmpl := template(tb, name)
	tmpl.IPAddresses, tmpl.DNSNames = nil, nil
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	key := newKey(tb)
	return sign(tb, tmpl, ca.Cert, &key.PublicKey, ca.key, key)
}

// Write writes the certificate and the key to certFile and keyFile (mode 0600), each
// replaced whole (written beside it, then renamed over it), so that a reader never sees half a
// file; the pair is not replaced at once, as a renewal that writes two files does not.
func (p Pair) Write(tb testing.TB, certFile, keyFile string) {
	tb.Helper()
	WriteFile(tb, certFile, p.CertPEM)
	WriteFile(tb, keyFile, p.KeyPEM)
}

// Files writes the pair under dir as name.pem and name-key.pem and returns their paths.
func (p Pair) Files(tb testing.TB, dir, name string) (certFile, keyFile string) {
	tb.Helper()
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	p.Write(tb, certFile, keyFile)
	return certFile, keyFile
}

// TLS is the pair as a tls.Certificate.
func (p Pair) TLS(tb testing.TB) tls.Certificate {
	tb.Helper()
	c, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
	if err != nil {
		tb.Fatalf("tlstest: %v", err)
	}
	return c
}

// WriteFile replaces path with data (mode 0600) by a rename.
func WriteFile(tb testing.TB, path string, data []byte) {
	tb.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		tb.Fatalf("tlstest: %v", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		tb.Fatalf("tlstest: %v", err)
	}
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("tlstest: %v", err)
	}
	return key
}

// template is a leaf valid for an hour either side of now, for the loopback addresses, with
// a random serial number (tests tell certificates apart by it).
func template(tb testing.TB, name string) *x509.Certificate {
	tb.Helper()
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		tb.Fatalf("tlstest: %v", err)
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, BasicConstraintsValid: true,
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, DNSNames: []string{"localhost"},
	}
}

func sign(tb testing.TB, tmpl, parent *x509.Certificate, pub *ecdsa.PublicKey, signer, key *ecdsa.PrivateKey) Pair {
	tb.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		tb.Fatalf("tlstest: create certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatalf("tlstest: %v", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatalf("tlstest: %v", err)
	}
	return Pair{Cert: cert, key: key,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})}
}
