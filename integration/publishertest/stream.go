package publishertest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/publisher"
)

// StreamMessages returns how many messages the SLUICE stream holds on the broker at url.
func StreamMessages(t testing.TB, url string) uint64 {
	t.Helper()
	ctx := context.Background()
	s, err := natstest.JetStreamAt(t, url).Stream(ctx, "SLUICE")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// StreamMsg is what a consumer saw of one message: its message id, its Sluice-Outbox-Id header
// and, for a replayed message, the original message id it names.
type StreamMsg struct {
	MsgID, OutboxID, ReplayOf string
}

// ConsumeAll reads the whole stream SLUICE through a new durable consumer and returns what it
// saw, in stream order. It reads until the consumer has nothing pending.
func ConsumeAll(t testing.TB, js jetstream.JetStream) []StreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	name := fmt.Sprintf("check-%d", time.Now().UnixNano())
	var cons jetstream.Consumer
	err := publisher.AskJetStream(ctx, func(ctx context.Context) (err error) {
		cons, err = js.CreateOrUpdateConsumer(ctx, "SLUICE", jetstream.ConsumerConfig{Durable: name,
			AckPolicy: jetstream.AckNonePolicy, DeliverPolicy: jetstream.DeliverAllPolicy})
		return err
	})
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	var info *jetstream.ConsumerInfo
	err = publisher.AskJetStream(ctx, func(ctx context.Context) (err error) {
		info, err = cons.Info(ctx)
		return err
	})
	if err != nil {
		t.Fatalf("consumer info: %v", err)
	}
	want := int(info.NumPending)
	var out []StreamMsg
	for len(out) < want {
		batch, err := cons.Fetch(min(1000, want-len(out)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatalf("fetch: %v", err)
		}
		got := 0
		for m := range batch.Messages() {
			h := m.Headers()
			out = append(out, StreamMsg{MsgID: h.Get(jetstream.MsgIDHeader), OutboxID: h.Get(publisher.HeaderOutboxID),
				ReplayOf: h.Get(publisher.HeaderReplayOf)})
			got++
		}
		if err := batch.Error(); err != nil {
			t.Fatalf("fetch: %v", err)
		}
		if got == 0 {
			t.Fatalf("consumer stalled after %d of %d messages", len(out), want)
		}
	}
	_ = js.DeleteConsumer(ctx, "SLUICE", name)
	return out
}

// AssertExactlyOnce fails t unless the consumer saw each of ids' original message ids exactly
// once and no other message.
func AssertExactlyOnce(t testing.TB, installID string, ids []int64, seen []StreamMsg) {
	t.Helper()
	count := map[string]int{}
	for _, m := range seen {
		count[m.MsgID]++
	}
	var missing, dup []string
	for _, id := range ids {
		mid := publisher.MsgID(installID, id)
		switch count[mid] {
		case 1:
		case 0:
			missing = append(missing, mid)
		default:
			dup = append(dup, fmt.Sprintf("%s×%d", mid, count[mid]))
		}
		delete(count, mid)
	}
	if len(missing) > 0 || len(dup) > 0 || len(count) > 0 {
		var extra []string
		for k := range count {
			extra = append(extra, k)
		}
		t.Fatalf("consumer saw %d messages for %d rows: missing %d %s, duplicated %d %s, unexpected %d %s",
			len(seen), len(ids), len(missing), head(missing), len(dup), head(dup), len(extra), head(extra))
	}
}

func head(s []string) string {
	if len(s) > 5 {
		s = s[:5]
	}
	return "[" + strings.Join(s, " ") + "]"
}
