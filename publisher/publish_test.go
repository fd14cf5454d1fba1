package publisher

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/outbox"
)

func TestPermanentRefusals(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nats.ErrMaxPayload, true},
		{fmt.Errorf("publish outbox row 7: %w", nats.ErrMaxPayload), true},
		{nats.ErrBadSubject, true},
		{jetstream.ErrStreamMessageExceedsMaximum, true},
		{&jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamMessageExceedsMaximum}, true},
		{&jetstream.APIError{Code: 503, ErrorCode: 10008}, false}, // e.g. no leader yet: transient
		{jetstream.ErrStreamNotFound, false},                      // fixed by `sluice nats init`
		{nats.ErrNoResponders, false},
		{nats.ErrTimeout, false},
		{nats.ErrConnectionClosed, false},
		{errors.New("anything else"), false},
	} {
		if got := permanent(c.err); got != c.want {
			t.Errorf("permanent(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestErrorKinds(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{errBrokerDown, "broker_down"},
		{fmt.Errorf("x: %w", nats.ErrConnectionClosed), "broker_down"},
		{fmt.Errorf("row 1: %w within 5s", errNoAck), "timeout"},
		{nats.ErrNoResponders, "no_stream"},
		{errors.New("boom"), "other"},
	} {
		if got := errorKind(c.err); got != c.want {
			t.Errorf("errorKind(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

func TestMessageIDsAndHeaders(t *testing.T) {
	row := outbox.Row{ID: 42, Subject: "sluice.enqueue.YWNtZQ", Payload: []byte(`{}`)}
	m := relayMsg("inst", row)
	if m.id != 42 || m.msg.Header.Get(jetstream.MsgIDHeader) != "inst-42" || m.msg.Header.Get(HeaderOutboxID) != "42" ||
		m.msg.Header.Get(HeaderReplayOf) != "" {
		t.Fatalf("relay message headers %v", m.msg.Header)
	}
	r := replayMsg("inst", 3, row)
	if r.msg.Header.Get(jetstream.MsgIDHeader) != "inst-42-r3" || r.msg.Header.Get(HeaderReplayOf) != "inst-42" ||
		r.msg.Header.Get(HeaderOutboxID) != "42" {
		t.Fatalf("replay message headers %v", r.msg.Header)
	}
}

func TestConfigErrors(t *testing.T) {
	if _, err := NewRelay(RelayConfig{}); err == nil || err.Error() != "invalid config: DB: required" {
		t.Errorf("NewRelay({}) = %v", err)
	}
	if _, err := NewPurger(PurgerConfig{}); err == nil || err.Error() != "invalid config: DB: required" {
		t.Errorf("NewPurger({}) = %v", err)
	}
	for _, prefix := range []string{"a b", "sluice.*", "x.>", ".x", "x."} {
		if _, err := NewProducer(ProducerConfig{Prefix: prefix}); err == nil {
			t.Errorf("NewProducer(prefix %q) accepted an invalid prefix", prefix)
		}
	}
	if _, err := NewProducer(ProducerConfig{Prefix: "acme.sluice"}); err != nil {
		t.Errorf("NewProducer(acme.sluice) = %v", err)
	}
}
