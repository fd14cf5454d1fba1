// Package publisher moves outbox rows to NATS: the Relay publishes whatever is committed and
// unpublished (setting aside rows the broker refuses for good), the FastPath publishes an
// admission's own rows right after its commit, Replay republishes published rows for consumers
// that lost state, the Purger deletes published rows past their retention, and EnsureStream
// creates the JetStream stream they publish into. Producers that share the database emit
// completions and capacity-release events with a Producer inside their own transaction.
package publisher

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// StreamConfig describes the SLUICE stream. Field docs give the defaults.
type StreamConfig struct {
	// Name of the stream. Default "SLUICE".
	Name string
	// Prefix of the subjects; the stream covers <prefix>.>. Default "sluice".
	Prefix string
	// Duplicates is the duplicate window: a republish within it is recognised by its message id
	// and dropped. It bounds the broker outage after which a republish can no longer be
	// recognised (SPEC §7). Default 2 minutes; at least 2 minutes.
	Duplicates time.Duration
	// Replicas is the number of stream replicas. Default 1; 3 in a durable cluster.
	Replicas int
	// MaxAge bounds how long messages are kept. Pokes are hints and release consumers reconcile
	// with `sluice outbox replay`, so a day is plenty. Default 24 h.
	MaxAge time.Duration
	// MaxBytes bounds the stream's size; the oldest messages are discarded first. Default 1 GiB.
	MaxBytes int64
}

func (c *StreamConfig) fill() error {
	if c.Name == "" {
		c.Name = "SLUICE"
	}
	if c.Prefix == "" {
		c.Prefix = "sluice"
	}
	if c.Duplicates == 0 {
		c.Duplicates = MinDuplicateWindow
	}
	if c.Duplicates < MinDuplicateWindow {
		return fmt.Errorf("invalid config: Duplicates: at least %s, got %s", MinDuplicateWindow, c.Duplicates)
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.MaxAge == 0 {
		c.MaxAge = 24 * time.Hour
	}
	if c.MaxAge < c.Duplicates {
		return fmt.Errorf("invalid config: MaxAge: must not be shorter than the duplicate window %s", c.Duplicates)
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = 1 << 30
	}
	return nil
}

// MinDuplicateWindow is the shortest duplicate window SPEC §7 allows.
const MinDuplicateWindow = 2 * time.Minute

// StreamChange is what PrepareStream did to the stream.
type StreamChange int

// The changes PrepareStream makes.
const (
	StreamKept    StreamChange = iota // it was there, as it should be
	StreamCreated                     // it was missing and is now created with cfg
	WindowRaised                      // its duplicate window was below MinDuplicateWindow
)

// PrepareStream is the stream set-up a process does at start-up (SPEC §7: "created or updated
// ... at start-up when allowed"). It creates the stream with cfg if the broker has none of that
// name. An existing one keeps what an operator set with `sluice nats init` (three replicas, a
// longer duplicate window), which updating it to a process's defaults would reset; only a
// duplicate window below MinDuplicateWindow is raised to it, since a shorter one lets a republish
// after a short outage through twice. A stream of that name that does not take cfg's prefix is
// left as it is, and an error says so.
func PrepareStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, StreamChange, error) {
	if err := cfg.fill(); err != nil {
		return nil, StreamKept, err
	}
	s, err := js.Stream(ctx, cfg.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = EnsureStream(ctx, js, cfg)
		return s, StreamCreated, err
	}
	if err != nil {
		return nil, StreamKept, fmt.Errorf("look up stream %s: %w", cfg.Name, err)
	}
	// A stream of that name made for another prefix would leave every poke unstored: say so at
	// start-up rather than in the relay's first failed publish.
	have := s.CachedInfo().Config
	if want := cfg.Prefix + ".>"; !slices.Contains(have.Subjects, want) && !slices.Contains(have.Subjects, ">") {
		return s, StreamKept, fmt.Errorf("stream %s takes %v, not %s: pokes published under this prefix are not stored; "+
			"run `sluice nats init` with this prefix, or use a broker of its own", cfg.Name, have.Subjects, want)
	}
	if have.Duplicates >= MinDuplicateWindow {
		return s, StreamKept, nil
	}
	have.Duplicates = MinDuplicateWindow
	if have.MaxAge > 0 && have.MaxAge < have.Duplicates {
		have.MaxAge = have.Duplicates // the server refuses a window longer than the messages live
	}
	if s, err = js.UpdateStream(ctx, have); err != nil {
		return nil, StreamKept, fmt.Errorf("raise the duplicate window of stream %s to %s: %w", cfg.Name, MinDuplicateWindow, err)
	}
	return s, WindowRaised, nil
}

// EnsureStream creates the stream, or updates it to cfg, on file storage (`sluice nats init`).
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	sc := jetstream.StreamConfig{
		Name:        cfg.Name,
		Description: "sluice pokes (enqueue, release), published from the outbox",
		Subjects:    []string{cfg.Prefix + ".>"},
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Duplicates:  cfg.Duplicates,
		MaxAge:      cfg.MaxAge,
		MaxBytes:    cfg.MaxBytes,
		Discard:     jetstream.DiscardOld,
	}
	var s jetstream.Stream
	err := AskJetStream(ctx, func(ctx context.Context) (err error) {
		// The request is idempotent (create, or update to the same config), so a retry after a
		// lost answer only finds the stream made.
		s, err = js.CreateOrUpdateStream(ctx, sc)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create or update stream %s: %w", cfg.Name, err)
	}
	return s, nil
}

// AskJetStream sends a JetStream API request until it is answered, giving each attempt its own
// time: on a cluster, a request that reaches the meta leader as it changes may never be answered,
// and one request waiting out ctx would make that ctx's whole time a failure. An answer that may
// change (no JetStream server yet, a cluster not ready or short of peers: retryableStreamErr) is
// asked again after a short wait; any other, or ctx's end, is returned. The request must be
// idempotent.
func AskJetStream(ctx context.Context, request func(context.Context) error) error {
	for {
		actx, cancel := context.WithTimeout(ctx, streamAttempt)
		err := request(actx)
		cancel()
		if err == nil || ctx.Err() != nil || !retryableStreamErr(err) {
			return err
		}
		t := time.NewTimer(streamRetryWait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// streamAttempt bounds one request of AskJetStream, and streamRetryWait is the wait before the
// next.
const streamAttempt, streamRetryWait = 5 * time.Second, 250 * time.Millisecond

// retryableStreamErr reports whether a JetStream request may succeed if sent again: it went
// unanswered, found no JetStream server listening yet, or the cluster said it is not ready (503:
// no meta leader, or a peer still catching up) or has too few peers up to place the replicas
// (10005, "no suitable peers for placement": a node restarting). The last is also the answer to
// more replicas than the cluster has nodes, so a caller bounds its context (`sluice nats init`
// gives a minute).
func retryableStreamErr(err error) bool {
	var api *jetstream.APIError
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.As(err, &api) && (api.Code == 503 || api.ErrorCode == noPeersForPlacement)
}

// noPeersForPlacement is JetStream's error code for a stream whose replicas find too few peers.
const noPeersForPlacement jetstream.ErrorCode = 10005

// InstallationID returns the id of the installation that db belongs to: the first part of every
// message id, so that two databases publishing to one broker never collide.
func InstallationID(ctx context.Context, db *sql.DB) (string, error) {
	var id string
	if err := db.QueryRowContext(ctx, "SELECT install_id FROM installation WHERE id = 1").Scan(&id); err != nil {
		return "", fmt.Errorf("read installation id: %w", err)
	}
	return id, nil
}

// Header names of published messages (SPEC §7).
const (
	HeaderOutboxID = "Sluice-Outbox-Id"
	HeaderReplayOf = "Sluice-Replay-Of"
)

// MsgID returns the Nats-Msg-Id of outbox row id.
func MsgID(installID string, rowID int64) string { return fmt.Sprintf("%s-%d", installID, rowID) }

// ConnectOptions are the nats.go options every sluice connection uses: reconnect forever (a
// broker outage costs latency, never correctness), and no reconnect buffer, so that a publish
// during a disconnect fails at once instead of sitting in a buffer that may never be sent
// (PITFALLS: NATS).
func ConnectOptions(name string) []nats.Option {
	return []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, time.Second),
		nats.ReconnectBufSize(-1),
		nats.RetryOnFailedConnect(true),
		nats.Timeout(2 * time.Second),
	}
}
