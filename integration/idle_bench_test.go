package integration_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/integration/harness"
)

// idleWindow is how long BenchmarkIdleDrainer measures, after idleWarmup.
const (
	idleWindow = 60 * time.Second
	idleWarmup = 5 * time.Second
)

// BenchmarkIdleDrainer measures an idle `sluice serve --drainer` (the built binary, 1 Hz poll,
// an empty queue, its broker connected) over idleWindow: CPU as a share of one core, summed
// over the process's threads from /proc/PID/task/*/schedstat, its threads' context switches a
// second, and resident memory (SPEC §14: under 0.1 % and 40 MB). Beside it, over the same window, runs the floor: a Go program that
// only wakes once a second (floorProgram), which is what any 1 Hz poller costs on this machine
// before it does any work.
// Run: go test -run '^$' -bench IdleDrainer -benchtime 1x ./integration/
func BenchmarkIdleDrainer(b *testing.B) {
	bin := harness.BuildSluice(b)
	env := harness.Start(b, harness.Options{API: true}) // no drainer in this process
	for range b.N {
		d := env.StartDrainer(b, bin, "idle")
		floor := startFloor(b)
		harness.WaitFor(b, 30*time.Second, "the drainer's first heartbeat", func() (bool, error) {
			var n int
			err := env.DB.QueryRow("SELECT COUNT(*) FROM drainers WHERE id = 'idle'").Scan(&n)
			return n == 1, err
		})
		// The warm-up and the window are measurement intervals, not waits for a condition.
		<-time.After(idleWarmup)
		d0, f0 := cpuTime(b, d.Pid()), cpuTime(b, floor.Process.Pid)
		dcs0, fcs0 := contextSwitches(b, d.Pid()), contextSwitches(b, floor.Process.Pid)
		<-time.After(idleWindow)
		d1, f1 := cpuTime(b, d.Pid()), cpuTime(b, floor.Process.Pid)
		dcs1, fcs1 := contextSwitches(b, d.Pid()), contextSwitches(b, floor.Process.Pid)
		if d.Exited() {
			b.Fatalf("the drainer exited during the window:\n%s", d.Output())
		}
		share := func(a, z time.Duration) float64 {
			return float64(int64(float64(z-a)/float64(idleWindow)*100*10000+0.5)) / 10000
		}
		harness.Emit("idle_drainer", map[string]any{"seconds": idleWindow.Seconds(), "poll_interval_s": 1,
			"cpu_pct_of_core": share(d0, d1), "rss_mb": round2(float64(rssKB(b, d.Pid())) / 1024),
			"floor_1hz_go_process_cpu_pct": share(f0, f1), "target_cpu_pct": 0.1, "target_rss_mb": 40,
			"context_switches_per_s":       round2(float64(dcs1-dcs0) / idleWindow.Seconds()),
			"floor_context_switches_per_s": round2(float64(fcs1-fcs0) / idleWindow.Seconds())})
		d.Kill()
	}
}

// floorProgram is the idle benchmark's floor: a Go program that only wakes once a second.
const floorProgram = `package main

import "time"

func main() {
	for range time.Tick(time.Second) {
	}
}
`

// startFloor builds and runs floorProgram (standard library only: no module to fetch).
func startFloor(b *testing.B) *exec.Cmd {
	b.Helper()
	dir := b.TempDir()
	for name, text := range map[string]string{"main.go": floorProgram, "go.mod": "module floor\n\ngo 1.22\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	build := exec.Command("go", "build", "-o", "floor", ".")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build the floor program: %v\n%s", err, out)
	}
	cmd := exec.Command(filepath.Join(dir, "floor"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // gone with the benchmark
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// cpuTime returns the CPU time pid's threads have used, from their schedstat (nanoseconds, where
// /proc/PID/stat counts whole clock ticks).
func cpuTime(b *testing.B, pid int) time.Duration {
	b.Helper()
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(stats) == 0 {
		b.Fatalf("schedstat of %d: %v (%d threads)", pid, err, len(stats))
	}
	var sum time.Duration
	for _, f := range stats {
		raw, err := os.ReadFile(f)
		if err != nil {
			continue // a thread that exited meanwhile
		}
		ns, err := strconv.ParseInt(strings.Fields(string(raw))[0], 10, 64)
		if err != nil {
			b.Fatalf("%s: %v", f, err)
		}
		sum += time.Duration(ns)
	}
	return sum
}

// contextSwitches returns how often pid's threads have been switched out, voluntarily or not: the
// wake-ups an idle process's CPU time mostly pays for, and a steadier count than the CPU time on a
// shared machine.
func contextSwitches(b *testing.B, pid int) int64 {
	b.Helper()
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(stats) == 0 {
		b.Fatalf("status of %d's threads: %v (%d threads)", pid, err, len(stats))
	}
	var sum int64
	for _, f := range stats {
		raw, err := os.ReadFile(f)
		if err != nil {
			continue // a thread that exited meanwhile
		}
		for _, line := range strings.Split(string(raw), "\n") {
			name, value, ok := strings.Cut(line, ":")
			if !ok || (name != "voluntary_ctxt_switches" && name != "nonvoluntary_ctxt_switches") {
				continue
			}
			n, err := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
			if err != nil {
				b.Fatalf("%s: %s: %v", f, line, err)
			}
			sum += n
		}
	}
	return sum
}

// rssKB returns pid's resident set size in KiB.
func rssKB(b *testing.B, pid int) int {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			if err != nil {
				b.Fatalf("VmRSS %q: %v", rest, err)
			}
			return kb
		}
	}
	b.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}
