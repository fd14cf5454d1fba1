package app

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// EmbeddedNATS runs a nats-server with JetStream inside this process, listening on 127.0.0.1:port
// (0 picks a free port) and storing in dir. `sluice dev` uses it when no NATS URL is configured,
// and tests use it for brokers they stop and start.
type EmbeddedNATS struct {
	srv *server.Server
}

// StartEmbeddedNATS starts the server and waits until it accepts connections.
func StartEmbeddedNATS(dir string, port int) (*EmbeddedNATS, error) {
	if port == 0 {
		port = server.RANDOM_PORT
	}
	srv, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      port,
		JetStream: true,
		StoreDir:  dir,
		NoSigs:    true,
		NoLog:     true,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("embedded NATS: not ready within 10 s")
	}
	return &EmbeddedNATS{srv: srv}, nil
}

// URL returns the client URL.
func (e *EmbeddedNATS) URL() string { return e.srv.ClientURL() }

// Shutdown stops the server and waits for it.
func (e *EmbeddedNATS) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}
