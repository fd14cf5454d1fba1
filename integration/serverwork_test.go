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

// serverWorkSQL reads the counters of what MariaDB did that a benchmark reports per job when
// SLUICE_BENCH_SERVER_WORK=1: page reads and writes, bytes written to the redo log and to data
// files (the latter by background flushing, so it lags and is noisy per phase), rows and index
// entries written, bytes received. Unlike timings they repeat from run to run on a loaded
// machine, but they are global: only meaningful on a server nothing else uses
// (SLUICE_TEST_MYSQL_DSN pointing at a private mariadbd; see integration/BENCHMARKS.md).
// Beside them: the CPU time of this process (the API and its clients) and, when
// SLUICE_BENCH_SERVER_PID names the server's process, of the server, in microseconds: less
// noisy than wall time on a shared machine, though still inflated by its load.
const serverWorkSQL = `SHOW GLOBAL STATUS WHERE Variable_name IN ('Innodb_buffer_pool_read_requests',
	'Innodb_buffer_pool_write_requests', 'Innodb_data_written', 'Innodb_os_log_written',
	'Handler_write', 'Bytes_received')`

// serverWork sums the server's counters over the calls of measure. A nil *serverWork (the
// counters not asked for) measures nothing.
type serverWork struct {
	sum map[string]float64
}

// newServerWork returns a serverWork if SLUICE_BENCH_SERVER_WORK=1, else nil.
func newServerWork() *serverWork {
	if os.Getenv("SLUICE_BENCH_SERVER_WORK") != "1" {
		return nil
	}
	return &serverWork{sum: map[string]float64{}}
}

// measure runs fn and adds what db's server counted meanwhile.
func (w *serverWork) measure(tb testing.TB, db *sql.DB, fn func()) {
	tb.Helper()
	if w == nil {
		fn()
		return
	}
	before := readServerWork(tb, db)
	fn()
	after := readServerWork(tb, db)
	for k, v := range after {
		w.sum[k] += v - before[k]
	}
}

// perJob is what was measured divided by jobs, or nil if nothing was.
func (w *serverWork) perJob(jobs int) map[string]float64 {
	if w == nil {
		return nil
	}
	out := map[string]float64{}
	for k, v := range w.sum {
		out[k] = benchRound1(v / float64(jobs))
	}
	return out
}

// addTo sets fields[key] to the work per job, if measured.
func (w *serverWork) addTo(fields map[string]any, key string, jobs int) {
	if w != nil {
		fields[key] = w.perJob(jobs)
	}
}

func readServerWork(tb testing.TB, db *sql.DB) map[string]float64 {
	tb.Helper()
	rows, err := db.QueryContext(context.Background(), serverWorkSQL)
	if err != nil {
		tb.Fatal(err)
	}
	defer rows.Close()
	out := map[string]float64{}
	for rows.Next() {
		var k string
		var v float64
		if err := rows.Scan(&k, &v); err != nil {
			tb.Fatal(err)
		}
		out[k] = v
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	out["cpu_us_self"] = float64(time.Duration(ru.Utime.Nano()+ru.Stime.Nano()) / time.Microsecond)
	if pid := os.Getenv("SLUICE_BENCH_SERVER_PID"); pid != "" {
		out["cpu_us_server"] = processCPU(tb, pid)
	}
	return out
}

// processCPU returns the user and system CPU time of process pid so far, in microseconds, from
// /proc/<pid>/stat (fields 14 and 15, in clock ticks of 1/100 s on Linux).
func processCPU(tb testing.TB, pid string) float64 {
	tb.Helper()
	raw, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		tb.Fatal(err)
	}
	// The command name (field 2) is in parentheses and may hold spaces: count from after it.
	fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	var ticks float64
	for _, f := range fields[11:13] { // utime, stime: fields 14 and 15 of the whole line
		n, err := strconv.ParseFloat(f, 64)
		if err != nil {
			tb.Fatal(err)
		}
		ticks += n
	}
	return ticks * 1e4
}
