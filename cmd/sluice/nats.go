package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/publisher"
)

// natsInitWait bounds `sluice nats init`'s stream set-up (publisher.EnsureStream retries).
const natsInitWait = time.Minute

func natsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "init" {
		return errors.New("nats: want `sluice nats init`")
	}
	fs := flag.NewFlagSet("sluice nats init", flag.ContinueOnError)
	fs.SetOutput(stderr)
	replicas := fs.Int("replicas", 1, "stream replicas (3 in a durable cluster)")
	dupes := fs.Duration("duplicate-window", 2*time.Minute, "JetStream duplicate window (at least 2m)")
	c, err := parseSettings(fs, args[1:])
	if err != nil {
		return err
	}
	nc, err := c.connectNATS("sluice nats init")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("JetStream: %w", err)
	}
	// EnsureStream asks again while the cluster cannot place the stream (a node restarting), and
	// more replicas than nodes look the same to it: a minute, then the broker's last answer.
	sctx, cancel := context.WithTimeout(ctx, natsInitWait)
	defer cancel()
	s, err := publisher.EnsureStream(sctx, js, publisher.StreamConfig{Prefix: c.get("subject-prefix"), Replicas: *replicas, Duplicates: *dupes})
	if err != nil {
		return fmt.Errorf("%w (asked for %s; are %d replicas possible on this broker?)", err, natsInitWait, *replicas)
	}
	info := s.CachedInfo()
	fmt.Fprintf(stdout, "stream %s ready: subjects %v, duplicate window %s, replicas %d, storage %s\n",
		info.Config.Name, info.Config.Subjects, info.Config.Duplicates, info.Config.Replicas, info.Config.Storage)
	return nil
}
