package publisher_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/publisher"
)

// TestNATSAuthNKey: against a server that requires an nkey user, sluice's connect options from
// an nkey seed file authenticate, and without them the server refuses the connection; files
// that cannot be read, or both kinds of credentials at once, are refused at start.
func TestNATSAuthNKey(t *testing.T) {
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := user.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := user.Seed()
	if err != nil {
		t.Fatal(err)
	}
	seedFile := filepath.Join(t.TempDir(), "sluice.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	srv := natstest.StartWith(t, func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: pub}} })

	opts, err := publisher.NATSAuth{NKeyFile: seedFile}.Options()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(srv.URL(), opts...)
	if err != nil {
		t.Fatalf("connect with the nkey seed: %v", err)
	}
	if err := nc.Publish("sluice.enqueue.x", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	nc.Close()

	if nc, err := nats.Connect(srv.URL()); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		if nc != nil {
			nc.Close()
		}
		t.Fatalf("connect without credentials: %v, want an authorization violation", err)
	}

	for _, c := range []struct {
		name string
		auth publisher.NATSAuth
		want string
	}{
		{"missing seed file", publisher.NATSAuth{NKeyFile: filepath.Join(t.TempDir(), "none.nk")}, "SLUICE_NATS_NKEY"},
		{"missing creds file", publisher.NATSAuth{CredsFile: filepath.Join(t.TempDir(), "none.creds")}, "SLUICE_NATS_CREDS"},
		{"missing CA", publisher.NATSAuth{CAFile: filepath.Join(t.TempDir(), "none.pem")}, "SLUICE_NATS_CA"},
		{"both kinds", publisher.NATSAuth{NKeyFile: seedFile, CredsFile: seedFile}, "not both"},
	} {
		if _, err := c.auth.Options(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %s", c.name, err, c.want)
		}
	}
}
