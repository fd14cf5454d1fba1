package store

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"

	"github.com/go-sql-driver/mysql"
)

// TLSFiles are the files of a TLS connection to MySQL/MariaDB. The zero value means none: the
// DSN alone decides (a tls= parameter of its own, or plain TCP).
type TLSFiles struct {
	// CA is a PEM file of the certificate(s) that signed the server's certificate
	// (SLUICE_MYSQL_CA). Default: the system's roots. The server's name is checked against the
	// host of the DSN's address, so the DSN names the server as its certificate does.
	CA string
	// Cert and Key are PEM files of the client's certificate and private key, for a server
	// that requires one (a user created with REQUIRE X509 or REQUIRE SUBJECT)
	// (SLUICE_MYSQL_CERT, SLUICE_MYSQL_KEY). Set both or neither. Default: none.
	Cert, Key string
}

// IsZero reports whether no file is set.
func (f TLSFiles) IsZero() bool { return f == TLSFiles{} }

// WithTLS returns dsn changed to connect over TLS with files, verifying the server's
// certificate: it loads the files into a tls.Config, registers it with the driver and sets
// tls=<its name> on the DSN. With no file set it returns dsn as it is. It returns an error,
// naming the setting, for a file that cannot be read or holds no usable certificate or key,
// for a certificate without its key or the reverse, and for a DSN that sets tls= itself (one
// place decides how sluice connects, not two). The files are read once: a renewed client
// certificate takes effect at the process's next start.
//
// Why a registration: the DSN is the one value that names the database across sluice
// (app.Options.MySQLDSN, Open and every command that opens a pool), and a DSN can carry a TLS
// configuration only as a name in the driver's registry (mysql.RegisterTLSConfig), a
// process-wide map. mysql.Config.TLS would avoid the map, but only for a caller that builds
// connectors from a Config rather than a DSN. The registry is kept out of the way as far as it
// allows: the name is derived from the three paths, so two sets of files in one process (tests)
// never share one, and registering the same name again (a restarted App in one process)
// replaces a configuration built from the same paths. The driver copies the configuration when
// a DSN is parsed, so pools opened already keep theirs.
func WithTLS(dsn string, files TLSFiles) (string, error) {
	if files.IsZero() {
		return dsn, nil
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", fmt.Errorf("invalid MySQL DSN: %w", err)
	}
	if cfg.TLSConfig != "" {
		return "", fmt.Errorf("invalid config: the MySQL DSN (SLUICE_MYSQL_DSN) sets tls=%s and SLUICE_MYSQL_CA, SLUICE_MYSQL_CERT or SLUICE_MYSQL_KEY is set too: use one or the other", cfg.TLSConfig)
	}
	tc, err := files.config()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(files.CA + "\x00" + files.Cert + "\x00" + files.Key))
	name := "sluice-" + hex.EncodeToString(sum[:8])
	if err := mysql.RegisterTLSConfig(name, tc); err != nil {
		return "", fmt.Errorf("register the MySQL TLS configuration: %w", err)
	}
	cfg.TLSConfig = name
	return cfg.FormatDSN(), nil
}

// config loads the files into a client TLS configuration.
func (f TLSFiles) config() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CA != "" {
		raw, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("invalid config: MySQL CA (SLUICE_MYSQL_CA): %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(raw) {
			return nil, fmt.Errorf("invalid config: MySQL CA (SLUICE_MYSQL_CA): no PEM certificate in %s", f.CA)
		}
	}
	switch {
	case f.Cert != "" && f.Key == "":
		return nil, errors.New("invalid config: MySQL client key (SLUICE_MYSQL_KEY): required with a client certificate (SLUICE_MYSQL_CERT)")
	case f.Key != "" && f.Cert == "":
		return nil, errors.New("invalid config: MySQL client certificate (SLUICE_MYSQL_CERT): required with a client key (SLUICE_MYSQL_KEY)")
	case f.Cert != "":
		pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("invalid config: MySQL client certificate (SLUICE_MYSQL_CERT, SLUICE_MYSQL_KEY): %w", err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}
