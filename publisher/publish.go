package publisher

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/outbox"
)

// outMsg is one message to send and the outbox row it stands for.
type outMsg struct {
	id  int64
	msg *nats.Msg
}

// sent is what publishing a batch came to. Every row is in exactly one of acked, refused or
// neither; a row in neither (err says why) stays unpublished for a later pass.
type sent struct {
	acked   []int64
	refused []outbox.Refusal
	err     error // the first transient failure
}

// publish sends msgs in order and waits up to ackTimeout for their acknowledgements (JetStream)
// or for the flush (core NATS). The number of unacknowledged messages is bounded by the
// JetStream context's async max pending: beyond it PublishMsgAsync stalls, then fails, and the
// rest of the batch waits for the next pass. A message the broker refuses permanently is
// reported in refused and does not stop the ones behind it; a transient failure stops sending,
// so that an outage costs one failed publish, not a batch of them.
func publish(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, msgs []outMsg, ackTimeout time.Duration) sent {
	var s sent
	if js == nil {
		var flushed []int64
		for _, m := range msgs {
			if err := nc.PublishMsg(m.msg); err != nil {
				if permanent(err) {
					s.refused = append(s.refused, outbox.Refusal{ID: m.id, Err: err})
					continue
				}
				s.err = fmt.Errorf("publish outbox row %d: %w", m.id, err)
				break
			}
			flushed = append(flushed, m.id)
		}
		if len(flushed) == 0 {
			return s
		}
		fctx, cancel := context.WithTimeout(ctx, ackTimeout)
		defer cancel()
		if err := nc.FlushWithContext(fctx); err != nil {
			if s.err == nil {
				s.err = fmt.Errorf("flush: %w", err)
			}
			return s
		}
		s.acked = flushed
		return s
	}
	type pending struct {
		id  int64
		fut jetstream.PubAckFuture
	}
	futs := make([]pending, 0, len(msgs))
	for _, m := range msgs {
		f, err := js.PublishMsgAsync(m.msg)
		if err != nil {
			if permanent(err) {
				s.refused = append(s.refused, outbox.Refusal{ID: m.id, Err: err})
				continue
			}
			s.err = fmt.Errorf("publish outbox row %d: %w", m.id, err)
			break
		}
		futs = append(futs, pending{m.id, f})
	}
	timeout := time.NewTimer(ackTimeout)
	defer timeout.Stop()
	s.acked = make([]int64, 0, len(futs))
	for _, p := range futs {
		select {
		case <-p.fut.Ok():
			s.acked = append(s.acked, p.id)
		case err := <-p.fut.Err():
			if permanent(err) {
				s.refused = append(s.refused, outbox.Refusal{ID: p.id, Err: err})
			} else if s.err == nil {
				s.err = fmt.Errorf("publish outbox row %d: %w", p.id, err)
			}
		case <-timeout.C:
			if s.err == nil {
				s.err = fmt.Errorf("publish outbox row %d: %w within %s", p.id, errNoAck, ackTimeout)
			}
			return s
		case <-ctx.Done():
			if s.err == nil {
				s.err = ctx.Err()
			}
			return s
		}
	}
	return s
}

var errNoAck = errors.New("no acknowledgement")

// permanent reports whether the broker will refuse this message however often it is sent: it
// is larger than the server's max payload or the stream's max message size, or its subject is
// invalid. Everything else (no connection, no stream yet, a timeout, a leader election) may pass
// on a later attempt.
func permanent(err error) bool {
	if errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadSubject) ||
		errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum
}

// errorKind is the label of sluice_relay_publish_errors_total for err.
func errorKind(err error) string {
	switch {
	case errors.Is(err, errBrokerDown), errors.Is(err, nats.ErrConnectionClosed),
		errors.Is(err, nats.ErrDisconnected), errors.Is(err, nats.ErrConnectionReconnecting):
		return "broker_down"
	case errors.Is(err, errNoAck), errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return "timeout"
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse):
		return "no_stream"
	default:
		return "other"
	}
}

// relayMsg is the message for outbox row: Nats-Msg-Id <installation id>-<row id>, so that a
// republish of the same row inside the duplicate window is dropped by the broker, and
// Sluice-Outbox-Id, so that consumers can deduplicate beyond it.
func relayMsg(installID string, row outbox.Row) outMsg {
	m := nats.NewMsg(row.Subject)
	m.Data = row.Payload
	m.Header.Set(HeaderOutboxID, strconv.FormatInt(row.ID, 10))
	m.Header.Set(jetstream.MsgIDHeader, MsgID(installID, row.ID))
	return outMsg{id: row.ID, msg: m}
}

// replayMsg is the message replaying outbox row in replay n: a new message id
// <installation id>-<row id>-r<n> (the original would be dropped as a duplicate inside the
// window) and Sluice-Replay-Of naming the original.
func replayMsg(installID string, n int64, row outbox.Row) outMsg {
	m := relayMsg(installID, row)
	m.msg.Header.Set(jetstream.MsgIDHeader, ReplayMsgID(installID, row.ID, n))
	m.msg.Header.Set(HeaderReplayOf, MsgID(installID, row.ID))
	return m
}

// ReplayMsgID returns the Nats-Msg-Id of outbox row rowID in replay n.
func ReplayMsgID(installID string, rowID, n int64) string {
	return fmt.Sprintf("%s-%d-r%d", installID, rowID, n)
}
