package integration_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/publisher"
)

// TestNATSAuthExampleConfig loads deploy/nats/nats-server.auth.conf.example into a current
// nats-server, with generated nkeys for its two placeholders and without its TLS block (it names
// certificate files): sluice's user, connecting with its seed file as SLUICE_NATS_NKEY names it,
// creates the SLUICE stream and publishes a poke into it; a subject outside sluice.> is refused;
// and a client without credentials is refused.
func TestNATSAuthExampleConfig(t *testing.T) {
	raw, err := os.ReadFile("../deploy/nats/nats-server.auth.conf.example")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	conf := regexp.MustCompile(`(?s)\ntls \{.*?\n\}\n`).ReplaceAllString(string(raw), "\n")
	conf = regexp.MustCompile(`(?m)^listen: .*$`).ReplaceAllString(conf, "listen: 127.0.0.1:-1")
	conf = strings.Replace(conf, "store_dir: /var/lib/nats/jetstream", "store_dir: "+filepath.Join(dir, "js"), 1)
	seeds := map[string]string{}
	for _, placeholder := range []string{"UREPLACEWITHSLUICEPUBLICNKEYXXXXXXXXXXXXXXXXXXXXXXXXXXXXX", "UREPLACEWITHCONSUMERPUBLICNKEYXXXXXXXXXXXXXXXXXXXXXXXXXXX"} {
		if !strings.Contains(conf, placeholder) {
			t.Fatalf("the example no longer has the placeholder %s", placeholder)
		}
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		seed, _ := kp.Seed()
		conf = strings.Replace(conf, placeholder, pub, 1)
		seeds[placeholder] = string(seed)
	}
	if strings.Contains(conf, "tls {") {
		t.Fatal("the TLS block was not removed")
	}
	path := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("the example does not load: %v", err)
	}
	opts.Port, opts.NoSigs, opts.NoLog = natstest.FreePort(t), true, true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("the server did not start")
	}
	url := srv.ClientURL()

	seedFile := filepath.Join(dir, "sluice.nk")
	if err := os.WriteFile(seedFile, []byte(seeds["UREPLACEWITHSLUICEPUBLICNKEYXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"]), 0o600); err != nil {
		t.Fatal(err)
	}
	auth, err := publisher.NATSAuth{NKeyFile: seedFile}.Options()
	if err != nil {
		t.Fatal(err)
	}
	violations := make(chan error, 4)
	nc, err := nats.Connect(url, append(auth, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		violations <- err
	}))...)
	if err != nil {
		t.Fatalf("sluice's user: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := publisher.PrepareStream(ctx, js, publisher.StreamConfig{Prefix: "sluice"}); err != nil {
		t.Fatalf("sluice's user creates the stream: %v", err)
	}
	if _, err := js.Publish(ctx, "sluice.enqueue.dGVzdA", []byte("{}")); err != nil {
		t.Fatalf("sluice's user publishes a poke: %v", err)
	}
	if err := nc.Publish("elsewhere.x", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	select {
	case err := <-violations:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Fatalf("publish outside sluice.>: %v, want a permissions violation", err)
		}
	case <-ctx.Done():
		t.Fatal("publishing outside sluice.> was not refused")
	}
	if other, err := nats.Connect(url); err == nil {
		other.Close()
		t.Fatal("a client without credentials was let in")
	}
}
