package publisher

import (
	"errors"
	"fmt"
	"os"

	"github.com/nats-io/nats.go"
)

// NATSAuth is how sluice proves who it is to a NATS server that requires it (deploy/nats has an
// example of such a server): a credentials file (a user JWT and its nkey seed, as `nsc`
// writes it) or an nkey seed file, and a CA file to verify the server's TLS certificate. A user
// and password go in the URL (nats://user:pass@host:4222); tls:// in the URL asks for TLS with
// the system's roots when no CA is given. Empty: no credentials.
type NATSAuth struct {
	CredsFile string // SLUICE_NATS_CREDS
	NKeyFile  string // SLUICE_NATS_NKEY: a seed (SU...), the user's public key is derived from it
	CAFile    string // SLUICE_NATS_CA
}

// Options returns the nats.go options for a, or an error naming the setting whose file cannot
// be read, at start rather than at each reconnect.
func (a NATSAuth) Options() ([]nats.Option, error) {
	var opts []nats.Option
	if a.CredsFile != "" && a.NKeyFile != "" {
		return nil, errors.New("invalid config: NATS credentials: give a creds file (SLUICE_NATS_CREDS) or an nkey seed (SLUICE_NATS_NKEY), not both")
	}
	for _, f := range []struct{ setting, path string }{
		{"SLUICE_NATS_CREDS", a.CredsFile}, {"SLUICE_NATS_NKEY", a.NKeyFile}, {"SLUICE_NATS_CA", a.CAFile},
	} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			return nil, fmt.Errorf("invalid config: %s: %w", f.setting, err)
		}
	}
	if a.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(a.CredsFile))
	}
	if a.NKeyFile != "" {
		o, err := nats.NkeyOptionFromSeed(a.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("invalid config: SLUICE_NATS_NKEY: %w", err)
		}
		opts = append(opts, o)
	}
	if a.CAFile != "" {
		opts = append(opts, nats.RootCAs(a.CAFile))
	}
	return opts, nil
}
