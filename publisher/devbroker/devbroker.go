// Package devbroker runs the NATS server with JetStream that `sluice dev` embeds when no NATS URL
// is given (SPEC §9, §11), so that a developer needs no broker of their own. It listens on a
// free loopback port and keeps its JetStream store in a temporary directory that Stop removes:
// a dev broker's messages are hints that the database can always regenerate (SPEC §7).
//
// Linking nats-server has a cost in every sluice process, serving or not: its pse package
// samples /proc once a second from init, which shows in an idle drainer's CPU use and context
// switches.
package devbroker

import (
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Broker is a running embedded server.
type Broker struct {
	srv   *server.Server
	store string
}

// Start runs the server and waits until it accepts connections.
func Start() (*Broker, error) {
	store, err := os.MkdirTemp("", "sluice-dev-nats-")
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	srv, err := server.NewServer(&server.Options{
		ServerName: "sluice-dev", Host: "127.0.0.1", Port: server.RANDOM_PORT,
		JetStream: true, StoreDir: store, NoSigs: true, NoLog: true,
	})
	if err != nil {
		os.RemoveAll(store)
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		os.RemoveAll(store)
		return nil, fmt.Errorf("embedded NATS: not ready for connections within 10 s")
	}
	return &Broker{srv: srv, store: store}, nil
}

// URL is the client URL.
func (b *Broker) URL() string { return b.srv.ClientURL() }

// Stop shuts the server down and removes its store.
func (b *Broker) Stop() {
	b.srv.Shutdown()
	b.srv.WaitForShutdown()
	os.RemoveAll(b.store)
}
