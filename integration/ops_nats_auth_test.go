package integration_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/publisher"
)

// The placeholders of deploy/nats/nats-server.auth.conf.example that authExample replaces with
// generated public nkeys.
const (
	sluiceNKeyPlaceholder   = "UREPLACEWITHSLUICEPUBLICNKEYXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"
	consumerNKeyPlaceholder = "UREPLACEWITHCONSUMERPUBLICNKEYXXXXXXXXXXXXXXXXXXXXXXXXXXX"
)

// authBroker is a nats-server running deploy/nats/nats-server.auth.conf.example.
type authBroker struct {
	url string
	// seeds maps each placeholder, and "admin", to the file holding its user's nkey seed.
	seeds map[string]string
}

// startAuthExample loads deploy/nats/nats-server.auth.conf.example into a current nats-server,
// with generated nkeys for its two placeholders and without its TLS block (it names certificate
// files), on a free loopback port. It adds one user of its own, "admin", with every right in
// the SLUICE account, which the example does not have: a test needs someone to set up what the
// example's users may not (another client's consumer) and to look at the result.
func startAuthExample(t *testing.T) *authBroker {
	t.Helper()
	raw, err := os.ReadFile("../deploy/nats/nats-server.auth.conf.example")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	conf := regexp.MustCompile(`(?s)\ntls \{.*?\n\}\n`).ReplaceAllString(string(raw), "\n")
	conf = regexp.MustCompile(`(?m)^listen: .*$`).ReplaceAllString(conf, "listen: 127.0.0.1:-1")
	conf = strings.Replace(conf, "store_dir: /var/lib/nats/jetstream", "store_dir: "+filepath.Join(dir, "js"), 1)
	if strings.Contains(conf, "tls {") {
		t.Fatal("the TLS block was not removed")
	}
	b := &authBroker{seeds: map[string]string{}}
	newUser := func(name string) string {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		seed, _ := kp.Seed()
		file := filepath.Join(dir, strings.ToLower(name[:min(len(name), 20)])+".nk")
		if err := os.WriteFile(file, seed, 0o600); err != nil {
			t.Fatal(err)
		}
		b.seeds[name] = file
		return pub
	}
	pubs := map[string]string{}
	for _, placeholder := range []string{sluiceNKeyPlaceholder, consumerNKeyPlaceholder} {
		if !strings.Contains(conf, placeholder) {
			t.Fatalf("the example no longer has the placeholder %s", placeholder)
		}
		pubs[placeholder] = newUser(placeholder)
		conf = strings.Replace(conf, placeholder, pubs[placeholder], 1)
	}
	path := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("the example does not load: %v", err)
	}
	i := slices.IndexFunc(opts.Nkeys, func(u *server.NkeyUser) bool { return u.Nkey == pubs[sluiceNKeyPlaceholder] })
	if i < 0 {
		t.Fatal("sluice's user is not among the server's nkey users")
	}
	opts.Nkeys = append(opts.Nkeys, &server.NkeyUser{Nkey: newUser("admin"), Account: opts.Nkeys[i].Account})
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
	b.url = srv.ClientURL()
	return b
}

// violations collects the errors the server reports to a connection (permission violations
// among them), for a test to wait on.
type violations struct {
	mu   sync.Mutex
	errs []error
}

func (v *violations) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.errs = append(v.errs, err)
}

// has reports whether a permissions violation naming text has been reported.
func (v *violations) has(text string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.ContainsFunc(v.errs, func(err error) bool {
		return errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), text)
	})
}

// connect connects as the user of seed file user, reporting the server's errors to v.
func (b *authBroker) connect(t *testing.T, user string, v *violations, opts ...nats.Option) *nats.Conn {
	t.Helper()
	auth, err := publisher.NATSAuth{NKeyFile: b.seeds[user]}.Options()
	if err != nil {
		t.Fatal(err)
	}
	opts = append(append(opts, auth...), nats.ErrorHandler(v.handler))
	nc, err := nats.Connect(b.url, opts...)
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestNATSAuthExampleConfig: in deploy/nats/nats-server.auth.conf.example, sluice's user,
// connecting with its seed file as SLUICE_NATS_NKEY names it, creates the SLUICE stream and
// publishes a poke into it; a subject outside sluice.> is refused; and a client without
// credentials is refused.
func TestNATSAuthExampleConfig(t *testing.T) {
	b := startAuthExample(t)
	v := &violations{}
	nc := b.connect(t, sluiceNKeyPlaceholder, v)
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
	harness.WaitFor(t, 10*time.Second, "publishing outside sluice.> to be refused", func() (bool, error) {
		return v.has(`Publish to "elsewhere.x"`), nil
	})
	if other, err := nats.Connect(b.url); err == nil {
		other.Close()
		t.Fatal("a client without credentials was let in")
	}
}

// TestNATSAuthExampleConsumerScope: the example's consumer of release events reaches its own
// durable consumer and nothing else (issue 30, finding 16). Each way it could read enqueue pokes
// (a consumer filtered on sluice.enqueue.> under its own durable name or another, through every
// form of the create request, or a core subscription) and each way it could touch another
// client's consumer (delete it, read from it, look at it) or another client's replies (_INBOX.>)
// is refused by the server, and afterwards the account holds exactly the consumers that were
// allowed. Then, on its own inbox prefix, it creates its durable, fetches a release event
// (and not the poke published beside it) and acknowledges it.
func TestNATSAuthExampleConsumerScope(t *testing.T) {
	b := startAuthExample(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sluiceJS, err := jetstream.New(b.connect(t, sluiceNKeyPlaceholder, &violations{}))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := publisher.PrepareStream(ctx, sluiceJS, publisher.StreamConfig{Prefix: "sluice"}); err != nil {
		t.Fatalf("sluice's user creates the stream: %v", err)
	}
	adminJS, err := jetstream.New(b.connect(t, "admin", &violations{}))
	if err != nil {
		t.Fatal(err)
	}
	// Another client's durable, which the consumer must not touch.
	if _, err := adminJS.CreateOrUpdateConsumer(ctx, "SLUICE", jetstream.ConsumerConfig{Durable: "others",
		FilterSubject: "sluice.release.>", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatalf("the admin creates another durable: %v", err)
	}

	v := &violations{}
	nc := b.connect(t, consumerNKeyPlaceholder, v, nats.CustomInboxPrefix("_INBOX_releases"))
	replies, err := nc.SubscribeSync(nc.NewInbox())
	if err != nil {
		t.Fatal(err)
	}
	createBody := func(durable, filter string) []byte {
		raw, err := json.Marshal(map[string]any{"stream_name": "SLUICE", "config": map[string]any{
			"durable_name": durable, "filter_subject": filter, "ack_policy": "explicit"}})
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	refused := []struct {
		what, subject string
		body          []byte
	}{
		{"its durable on enqueue pokes", "$JS.API.CONSUMER.CREATE.SLUICE.releases.sluice.enqueue.>", createBody("releases", "sluice.enqueue.>")},
		{"its durable, no filter in the subject", "$JS.API.CONSUMER.CREATE.SLUICE.releases", createBody("releases", "sluice.enqueue.>")},
		{"its durable, the legacy create", "$JS.API.CONSUMER.DURABLE.CREATE.SLUICE.releases", createBody("releases", "sluice.enqueue.>")},
		{"another durable on enqueue pokes", "$JS.API.CONSUMER.CREATE.SLUICE.peek.sluice.enqueue.>", createBody("peek", "sluice.enqueue.>")},
		{"an ephemeral consumer", "$JS.API.CONSUMER.CREATE.SLUICE", createBody("", "sluice.enqueue.>")},
		{"deleting another durable", "$JS.API.CONSUMER.DELETE.SLUICE.others", nil},
		{"reading from another durable", "$JS.API.CONSUMER.MSG.NEXT.SLUICE.others", []byte(`{"batch":1}`)},
		{"looking at another durable", "$JS.API.CONSUMER.INFO.SLUICE.others", nil},
		{"listing the consumers", "$JS.API.CONSUMER.LIST.SLUICE", nil},
	}
	for _, r := range refused {
		if err := nc.PublishRequest(r.subject, replies.Subject, r.body); err != nil {
			t.Fatal(err)
		}
	}
	for _, sub := range []string{"_INBOX.>", "sluice.enqueue.>"} {
		if _, err := nc.SubscribeSync(sub); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range refused {
		harness.WaitFor(t, 10*time.Second, "the consumer user's request ("+r.what+") to be refused", func() (bool, error) {
			if msg, err := replies.NextMsg(time.Millisecond); err == nil {
				t.Fatalf("the server answered a request the consumer user should not be allowed to send (waiting on %s): %s", r.what, msg.Data)
			}
			return v.has(`Publish to "` + r.subject + `"`), nil
		})
	}
	for _, sub := range []string{"_INBOX.>", "sluice.enqueue.>"} {
		harness.WaitFor(t, 10*time.Second, "the consumer user's subscription to "+sub+" to be refused", func() (bool, error) {
			return v.has(`Subscription to "` + sub + `"`), nil
		})
	}

	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "SLUICE", jetstream.ConsumerConfig{Durable: "releases",
		FilterSubject: "sluice.release.>", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatalf("the consumer user creates its durable: %v", err)
	}
	if _, err := sluiceJS.Publish(ctx, "sluice.enqueue.dGVzdA", []byte(`{"poke":1}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := sluiceJS.Publish(ctx, "sluice.release.dGVzdA", []byte(`{"release":1}`)); err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatalf("the consumer user fetches: %v", err)
	}
	var got []jetstream.Msg
	for m := range batch.Messages() {
		got = append(got, m)
	}
	if batch.Error() != nil || len(got) != 1 || got[0].Subject() != "sluice.release.dGVzdA" {
		t.Fatalf("the consumer user fetched %d message(s) (error %v), want the release event", len(got), batch.Error())
	}
	if err := got[0].DoubleAck(ctx); err != nil {
		t.Fatalf("the consumer user acknowledges: %v", err)
	}
	if _, err := js.Consumer(ctx, "SLUICE", "releases"); err != nil {
		t.Fatalf("the consumer user looks at its durable: %v", err)
	}

	// What the server holds: the two allowed durables, the other one untouched.
	stream, err := adminJS.Stream(ctx, "SLUICE")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	lister := stream.ConsumerNames(ctx)
	for name := range lister.Name() {
		names = append(names, name)
	}
	if err := lister.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"others", "releases"}) {
		t.Fatalf("the SLUICE stream's consumers are %v, want [others releases]", names)
	}
	info, err := adminJS.Consumer(ctx, "SLUICE", "releases")
	if err != nil {
		t.Fatal(err)
	}
	if f := info.CachedInfo().Config.FilterSubject; f != "sluice.release.>" {
		t.Fatalf("the consumer user's durable filters %q, want sluice.release.>", f)
	}
}
