package publisher_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/gate/clock"
	"github.com/sluicehq/sluice/integration/natstest"
	"github.com/sluicehq/sluice/integration/publishertest"
	"github.com/sluicehq/sluice/integration/testdb"
	"github.com/sluicehq/sluice/outbox"
	"github.com/sluicehq/sluice/publisher"
)

// TestRelayOutOfOrderCommits: the row with the lower id commits last. A relay that remembered
// the highest id it had published would skip it forever; selecting by state publishes both.
func TestRelayOutOfOrderCommits(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	e := publishertest.NewEnv(t, ns.URL(), 1)
	r := e.Relay(t, publisher.RelayConfig{})
	ctx := context.Background()
	now := clock.Trunc(time.Now())

	slow, err := e.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = slow.Rollback() }()
	low, err := outbox.Write(ctx, slow, now, outbox.PokeMessage("sluice", outbox.Enqueue, "slow", 1))
	if err != nil {
		t.Fatal(err)
	}
	fast, err := e.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	high, err := outbox.Write(ctx, fast, now, outbox.PokeMessage("sluice", outbox.Enqueue, "fast", 2))
	if err != nil {
		t.Fatal(err)
	}
	if high[0] <= low[0] {
		t.Fatalf("ids %d, %d: want the second transaction's id higher", low[0], high[0])
	}
	if err := fast.Commit(); err != nil {
		t.Fatal(err)
	}

	if n, err := r.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("first pass published %d (err %v), want the committed row only", n, err)
	}
	if err := slow.Commit(); err != nil {
		t.Fatal(err)
	}
	if n, err := r.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("second pass published %d (err %v), want the late-committing lower id", n, err)
	}
	if n := publishertest.CountOutbox(t, e.DB, "published_at = "+outbox.Unpublished); n != 0 {
		t.Fatalf("%d rows unpublished", n)
	}
	publishertest.AssertExactlyOnce(t, e.InstallID, []int64{low[0], high[0]}, publishertest.ConsumeAll(t, e.JS))
}

// TestRelaySetsAsidePoisonRows: a row larger than the stream accepts is moved to outbox_failed
// with the broker's error and counted; the rows before and behind it are published.
func TestRelaySetsAsidePoisonRows(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	e := publishertest.NewEnv(t, ns.URL(), 1)
	ctx := context.Background()
	// A stream limit below the poison row's size: the broker refuses it with a permanent error.
	if _, err := e.JS.UpdateStream(ctx, jetstream.StreamConfig{Name: "SLUICE", Subjects: []string{"sluice.>"},
		Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute, MaxAge: 24 * time.Hour, MaxMsgSize: 4096}); err != nil {
		t.Fatal(err)
	}
	now := clock.Trunc(time.Now())
	before := publishertest.InsertRows(t, e.DB, 5)
	poison, err := outbox.Write(ctx, e.DB, now, outbox.Message{Subject: "sluice.enqueue.cG9pc29u",
		Payload: []byte(strings.Repeat("x", 10000))})
	if err != nil {
		t.Fatal(err)
	}
	after := publishertest.InsertRows(t, e.DB, 5)
	reg := publishertest.NewRegistryMetrics()
	r := e.Relay(t, publisher.RelayConfig{Metrics: reg.Metrics})

	n, err := r.RunOnce(ctx)
	if err != nil || n != 10 {
		t.Fatalf("pass published %d (err %v), want the 10 good rows", n, err)
	}
	if got := publishertest.CountOutbox(t, e.DB, "published_at = "+outbox.Unpublished); got != 0 {
		t.Fatalf("%d rows still unpublished; the poison row must not stay in the queue", got)
	}
	total, failed, err := outbox.ReadFailed(ctx, e.DB, 10)
	if err != nil {
		t.Fatal(err)
	}
	if total != 1 || failed[0].ID != poison[0] || !strings.Contains(failed[0].Error, "maximum") {
		t.Fatalf("set aside %d rows %+v; want row %d with the broker's size error", total, failed, poison[0])
	}
	if got := reg.Counter(t, "sluice_relay_publish_errors_total", "refused"); got != 1 {
		t.Fatalf("refused counter = %v, want 1", got)
	}
	publishertest.AssertExactlyOnce(t, e.InstallID, append(before, after...), publishertest.ConsumeAll(t, e.JS))

	// An operator who raised the limit moves it back; the relay publishes it.
	if _, err := e.JS.UpdateStream(ctx, jetstream.StreamConfig{Name: "SLUICE", Subjects: []string{"sluice.>"},
		Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute, MaxAge: 24 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	if moved, err := outbox.Restore(ctx, e.DB.DB, poison[0], poison[0]); err != nil || moved != 1 {
		t.Fatalf("restore moved %d (err %v)", moved, err)
	}
	if n, err := r.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("pass after restore published %d (err %v), want 1", n, err)
	}
}

// TestReplayRepublishesExactlyTheRange: a replay selected by id, then by publication time,
// republishes exactly the selected published rows, each with a new message id naming the
// original; rows outside the selection or not yet published are not replayed; a dry run
// publishes nothing.
func TestReplayRepublishesExactlyTheRange(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	e := publishertest.NewEnv(t, ns.URL(), 1)
	ctx := context.Background()
	ids := publishertest.InsertRows(t, e.DB, 100)
	r := e.Relay(t, publisher.RelayConfig{Batch: 30})
	for {
		n, err := r.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	late := publishertest.InsertRows(t, e.DB, 3) // committed, not yet published: the relay's, not the replay's
	cfg := publisher.ReplayConfig{DB: e.DB.DB, NC: e.NC, JS: e.JS, InstallID: e.InstallID, Batch: 7,
		Selection: outbox.Selection{FromID: ids[40]}}

	dry := cfg
	dry.DryRun, dry.NC, dry.JS = true, nil, nil
	p, err := publisher.Replay(ctx, dry)
	if err != nil || p.Published != 60 || p.Replay != 0 || p.FirstID != ids[40] || p.LastID != ids[99] {
		t.Fatalf("dry run = %+v (err %v), want 60 rows %d..%d and no replay number", p, err, ids[40], ids[99])
	}
	var progress []publisher.ReplayProgress
	cfg.Progress = func(p publisher.ReplayProgress) { progress = append(progress, p) }
	p, err = publisher.Replay(ctx, cfg)
	// A replay's number is its outbox_replays row's id: 1 on one server, the node's
	// auto-increment offset on a Galera cluster.
	if err != nil || p.Published != 60 || p.Selected != 60 || p.Replay < 1 {
		t.Fatalf("replay = %+v (err %v), want 60 rows and a replay number", p, err)
	}
	first := p.Replay
	if len(progress) != 9 || progress[len(progress)-1].Published != 60 {
		t.Fatalf("progress reports %+v, want 9 batches ending at 60", progress)
	}

	// By publication time: mark the first 10 rows as published long ago; --since selects the rest.
	if _, err := e.DB.ExecContext(ctx, "UPDATE outbox SET published_at = '2020-01-01' WHERE id <= ?", ids[9]); err != nil {
		t.Fatal(err)
	}
	since := time.Date(2021, 1, 1, 0, 0, 0, 0, time.UTC)
	cfg.Selection, cfg.Progress = outbox.Selection{Since: &since}, nil
	p, err = publisher.Replay(ctx, cfg)
	if err != nil || p.Published != 90 || p.Replay <= first || p.FirstID != ids[10] {
		t.Fatalf("replay since = %+v (err %v), want 90 rows from %d as a replay after %d", p, err, ids[10], first)
	}
	second := p.Replay

	seen := publishertest.ConsumeAll(t, e.JS)
	want := map[string]string{} // replay message id → original
	for _, id := range ids[40:] {
		want[publisher.ReplayMsgID(e.InstallID, id, first)] = publisher.MsgID(e.InstallID, id)
	}
	for _, id := range ids[10:] {
		want[publisher.ReplayMsgID(e.InstallID, id, second)] = publisher.MsgID(e.InstallID, id)
	}
	var originals []publishertest.StreamMsg
	got := map[string]int{}
	for _, m := range seen {
		if m.ReplayOf == "" {
			originals = append(originals, m)
			continue
		}
		got[m.MsgID]++
		if want[m.MsgID] != m.ReplayOf {
			t.Errorf("replayed message %s names %q as its original, want %q", m.MsgID, m.ReplayOf, want[m.MsgID])
		}
		if id, _ := strconv.ParseInt(m.OutboxID, 10, 64); publisher.MsgID(e.InstallID, id) != m.ReplayOf {
			t.Errorf("replayed message %s has Sluice-Outbox-Id %s", m.MsgID, m.OutboxID)
		}
	}
	for id := range want {
		if got[id] != 1 {
			t.Errorf("replay message %s seen %d times, want 1", id, got[id])
		}
	}
	if len(got) != len(want) {
		t.Errorf("saw %d distinct replayed messages, want %d", len(got), len(want))
	}
	publishertest.AssertExactlyOnce(t, e.InstallID, ids, originals) // the late rows were not published by anyone
	if n := publishertest.CountOutbox(t, e.DB, "published_at = "+outbox.Unpublished); n != int64(len(late)) {
		t.Fatalf("%d rows unpublished, want the %d late ones left to the relay", n, len(late))
	}
}

// TestPurgeKeepsUnpublishedAndRecentRows: the purger deletes published rows older than the
// retention in small batches and nothing else.
func TestPurgeKeepsUnpublishedAndRecentRows(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	ids := publishertest.InsertRows(t, db, 30)
	now := clock.NewFake(time.Date(2030, 6, 1, 0, 0, 0, 0, time.UTC))
	// 0-9 published 8 days ago, 10-19 published 6 days ago, 20-29 unpublished.
	if _, err := db.ExecContext(ctx, "UPDATE outbox SET published_at = '2030-05-24' WHERE id <= ?", ids[9]); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "UPDATE outbox SET published_at = '2030-05-26' WHERE id > ? AND id <= ?", ids[9], ids[19]); err != nil {
		t.Fatal(err)
	}
	p, err := publisher.NewPurger(publisher.PurgerConfig{DB: db.DB, Clock: now, Batch: 3,
		Retention: func() time.Duration { return 7 * 24 * time.Hour }})
	if err != nil {
		t.Fatal(err)
	}
	n, err := p.RunOnce(ctx)
	if err != nil || n != 10 {
		t.Fatalf("purged %d (err %v), want the 10 rows published 8 days ago", n, err)
	}
	if got := publishertest.CountOutbox(t, db, "1"); got != 20 {
		t.Fatalf("%d rows left, want 20", got)
	}
	if got := publishertest.CountOutbox(t, db, "id <= "+strconv.FormatInt(ids[9], 10)); got != 0 {
		t.Fatalf("%d old published rows left", got)
	}
	now.Advance(365 * 24 * time.Hour)
	if n, err := p.RunOnce(ctx); err != nil || n != 10 {
		t.Fatalf("purged %d (err %v) a year later, want the other 10 published rows", n, err)
	}
	if got := publishertest.CountOutbox(t, db, "published_at = "+outbox.Unpublished); got != 10 {
		t.Fatalf("%d unpublished rows left, want all 10: unpublished rows are never purged", got)
	}
}
