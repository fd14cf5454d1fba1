package harness

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/testdb"
)

// BuildSluice builds cmd/sluice into a temporary directory of tb and returns the binary's path.
// Tests that kill or freeze a process run the real binary, not an in-process stand-in.
func BuildSluice(tb testing.TB) string {
	tb.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		tb.Fatalf("go env GOMOD: %v", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	bin := filepath.Join(tb.TempDir(), "sluice")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/sluice")
	cmd.Dir = root
	if msg, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("build sluice: %v\n%s", err, msg)
	}
	return bin
}

// Proc is a sluice process started by a test. Its output is kept for the failure message.
type Proc struct {
	Name string
	cmd  *exec.Cmd
	out  *SyncBuffer
	done chan struct{}
}

// SyncBuffer is a bytes.Buffer safe for one writer and concurrent readers: a process's output
// that a test reads while the process runs.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// StartDrainer runs `sluice serve --drainer` as drainer id against e's database, broker and
// executor. It is killed (if still running) when tb ends.
func (e *Env) StartDrainer(tb testing.TB, bin, id string) *Proc {
	tb.Helper()
	return StartProc(tb, "drainer "+id, bin, []string{
		"SLUICE_MYSQL_DSN=" + e.DB.DSN,
		"SLUICE_NATS_URL=" + e.NATS.URL(),
		"SLUICE_EXECUTOR_URL=" + e.ExecURL,
		"SLUICE_EXECUTOR_SECRET=" + Secret,
		"SLUICE_DRAINER_ID=" + id,
		"SLUICE_LISTEN=127.0.0.1:0", // a drainer process serves /metrics and health checks too
		"SLUICE_LOG_LEVEL=warn",
		"SLUICE_SHUTDOWN_GRACE=5s",
	}, "serve", "--drainer")
}

// StartProc runs bin with args, env added to the test's environment. It is killed (if still
// running) when tb ends, and its output logged if tb failed.
func StartProc(tb testing.TB, name, bin string, env []string, args ...string) *Proc {
	tb.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	p := &Proc{Name: name, cmd: cmd, out: &SyncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", name, err)
	}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	tb.Cleanup(func() {
		p.Signal(syscall.SIGKILL)
		<-p.done
		if tb.Failed() {
			tb.Logf("%s output:\n%s", name, p.out.String())
		}
	})
	return p
}

// Signal sends sig to the process (ignoring a process that already exited).
func (p *Proc) Signal(sig syscall.Signal) {
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(sig)
	}
}

// Kill SIGKILLs the process and waits for it to be gone.
func (p *Proc) Kill() {
	p.Signal(syscall.SIGKILL)
	<-p.done
}

// Pid returns the process's id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Output returns what the process printed so far.
func (p *Proc) Output() string { return p.out.String() }

// SetConfig writes a new runtime configuration version (as an operator's PATCH would), changed by
// edit from the one in force. Processes pick it up at their next claim (caps) or re-read.
func (e *Env) SetConfig(tb testing.TB, edit func(*config.Config)) {
	tb.Helper()
	testdb.SetLimits(tb, e.DB.DB, edit)
}
