package apitest

import (
	"bytes"
	"context"
	"database/sql"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/testdb"
)

// CommitWithFault ends tx as the named fault says, for a gate.Faults Commit hook:
// "commit-lost" (the server committed, the answer was lost), "commit-rolled-back" (the connection
// broke before the server committed), "commit-refused" (the server answered an error: nothing
// committed), anything else a plain commit.
func CommitWithFault(tx gate.Tx, fault string) error {
	switch fault {
	case "commit-lost":
		if err := tx.Commit(); err != nil {
			return err
		}
		return mysql.ErrInvalidConn
	case "commit-rolled-back":
		_ = tx.Rollback()
		return mysql.ErrInvalidConn
	case "commit-refused":
		_ = tx.Rollback()
		return &mysql.MySQLError{Number: 1180, Message: "Got error during COMMIT"}
	}
	return tx.Commit()
}

// CommitCutter is a TCP proxy in front of MariaDB that, when Armed, forwards the next COMMIT to
// the server and then cuts the connection before the server's answer reaches the client: the
// client cannot know whether its transaction committed. Withheld, it cuts the connection at the
// next COMMIT without forwarding it: the transaction rolls back, and the client cannot know that
// either. While down (SetDown) it plays an unreachable database: it cuts every open connection and
// closes new ones at once.
type CommitCutter struct {
	// Armed cuts the next COMMIT after forwarding it; the cut disarms it.
	Armed atomic.Bool
	// Withheld cuts the next COMMIT before forwarding it; the cut disarms it.
	Withheld atomic.Bool
	// Cuts counts the connections cut at a COMMIT.
	Cuts atomic.Int32
	// Match, if set, narrows Armed and Withheld to the COMMITs of the round trips it accepts (it
	// is given the bytes the client sent). Set it before arming.
	Match func(roundTrip []byte) bool
	// OnWithheld, if set, runs at a withheld COMMIT's cut, after the server's side of the
	// connection is closed and before the client's is: a test's moment to act while the client
	// still waits for its answer. Set it before withholding.
	OnWithheld func()

	l  net.Listener
	wg sync.WaitGroup

	mu   sync.Mutex
	down bool
	open map[net.Conn]bool // client connections being served
}

// SetDown takes the database away (down) or gives it back.
func (p *CommitCutter) SetDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for c := range p.open {
			c.Close()
		}
	}
}

// track registers a client connection, or reports false (and closes it) while down.
func (p *CommitCutter) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		c.Close()
		return false
	}
	p.open[c] = true
	return true
}

func (p *CommitCutter) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.open, c)
}

// carriesCommit says whether a chunk the client sent holds a COMMIT: a MySQL COM_QUERY packet
// whose body is one (the driver's tx.Commit), or one whose statements end with store.ConnTx's
// (its Commit, and a transaction that commits in its last round trip: ExecCommit, QueryCommit).
func carriesCommit(chunk []byte) bool {
	return bytes.Contains(chunk, []byte("\x03COMMIT")) || store.EndsWithCommit(string(chunk))
}

// DBThroughCutter starts a CommitCutter in front of database base and returns it with a pool
// that connects through it, closed when the test ends.
func DBThroughCutter(tb testing.TB, base *testdb.DB) (*CommitCutter, *sql.DB) {
	tb.Helper()
	cfg, err := mysql.ParseDSN(base.DSN)
	if err != nil {
		tb.Fatal(err)
	}
	proxy := startCommitCutter(tb, cfg.Addr)
	cfg.Addr = proxy.l.Addr().String()
	db, err := store.OpenMulti(context.Background(), cfg.FormatDSN())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	return proxy, db
}

func startCommitCutter(tb testing.TB, server string) *CommitCutter {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &CommitCutter{l: l, open: map[net.Conn]bool{}}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.serve(c, server)
			}()
		}
	}()
	tb.Cleanup(func() { l.Close(); p.wg.Wait() })
	return p
}

func (p *CommitCutter) serve(client net.Conn, server string) {
	if !p.track(client) {
		return
	}
	defer p.untrack(client)
	defer client.Close()
	up, err := net.Dial("tcp", server)
	if err != nil {
		return
	}
	defer up.Close()
	var cut atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := up.Read(buf)
			if n > 0 && !cut.Load() {
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			cuttable := carriesCommit(buf[:n]) && (p.Match == nil || p.Match(buf[:n]))
			if cuttable && p.Armed.CompareAndSwap(true, false) {
				cut.Store(true)
				_, _ = up.Write(buf[:n])
				p.Cuts.Add(1)
				client.Close()
				up.Close()
				<-done
				return
			}
			if cuttable && p.Withheld.CompareAndSwap(true, false) {
				cut.Store(true)
				p.Cuts.Add(1)
				up.Close()
				<-done
				if p.OnWithheld != nil {
					p.OnWithheld()
				}
				client.Close()
				return
			}
			if _, werr := up.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	up.Close()
	<-done
	_, _ = io.Copy(io.Discard, client)
}
