package integration_test

import (
	"context"
	"database/sql"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// work is a snapshot of what the database server and this process have done so far: the
// server's global status counters, the server's CPU time when its process is readable here (a
// server on this machine), and this process's CPU time. On a shared, loaded machine these
// counts repeat from run to run where wall-clock rates do not, so builds are compared by the
// work per drained job (integration/BENCHMARKS.md).
type work struct {
	status    map[string]int64
	serverCPU time.Duration // -1 when the server's process is not readable
	goCPU     time.Duration
}

// workCounters are the status counters a benchmark reports per job: page reads and writes, redo
// bytes, row operations, statements, round trips and bytes received.
var workCounters = []string{"Innodb_buffer_pool_read_requests", "Innodb_buffer_pool_write_requests",
	"Innodb_os_log_written", "Bytes_received", "Handler_read_key", "Handler_read_next", "Handler_update", "Handler_write", "Com_select",
	"Com_update", "Com_insert", "Com_insert_select", "Com_commit", "Questions"}

func snapshotWork(tb testing.TB, db *sql.DB) work {
	tb.Helper()
	ctx := context.Background()
	w := work{status: map[string]int64{}, serverCPU: -1}
	rows, err := db.QueryContext(ctx, "SHOW GLOBAL STATUS")
	if err != nil {
		tb.Fatal(err)
	}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			tb.Fatal(err)
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			w.status[k] = n
		}
	}
	if err := rows.Close(); err != nil {
		tb.Fatal(err)
	}
	var pidFile string
	if err := db.QueryRowContext(ctx, "SELECT @@pid_file").Scan(&pidFile); err == nil {
		w.serverCPU = processCPU(pidFile)
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		w.goCPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return w
}

// processCPU is the user and system time of the process whose pid pidFile holds, or -1.
func processCPU(pidFile string) time.Duration {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return -1
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return pidCPU(pid)
}

// pidCPU is the user and system time of process pid, or -1.
func pidCPU(pid int) time.Duration {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	s := string(stat)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // fields from the third on
	if len(f) < 13 {
		return -1
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	k, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	const ticksPerSecond = 100 // USER_HZ on Linux
	return time.Duration(u+k) * time.Second / ticksPerSecond
}

// perJob is the work done between before and w, per job of jobs, rounded to two decimals.
func (w work) perJob(before work, jobs int) map[string]any {
	out := map[string]any{}
	for _, k := range workCounters {
		out[k] = round2(float64(w.status[k]-before.status[k]) / float64(jobs))
	}
	if w.serverCPU >= 0 && before.serverCPU >= 0 {
		out["server_cpu_us"] = round2(float64((w.serverCPU - before.serverCPU).Microseconds()) / float64(jobs))
	}
	out["go_cpu_us"] = round2(float64((w.goCPU - before.goCPU).Microseconds()) / float64(jobs))
	return out
}
