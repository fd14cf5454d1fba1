package integration_test

import (
	"database/sql"
	"os"
	"testing"
)

// serverWork sums, over the calls of measure, what the database server and this process did
// (work: the server's status counters and CPU, this process's CPU), for a benchmark that reports
// it per job when SLUICE_BENCH_SERVER_WORK=1. The counters are global: only meaningful on a
// server nothing else uses (SLUICE_TEST_MYSQL_DSN pointing at a private mariadbd; see
// integration/BENCHMARKS.md). A nil *serverWork (the counters not asked for) measures nothing.
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

// measure runs fn and adds what db's server and this process did meanwhile.
func (w *serverWork) measure(tb testing.TB, db *sql.DB, fn func()) {
	tb.Helper()
	if w == nil {
		fn()
		return
	}
	before := snapshotWork(tb, db)
	fn()
	for k, v := range snapshotWork(tb, db).perJob(before, 1) {
		w.sum[k] += v.(float64)
	}
}

// addTo sets fields[key] to the work per job of jobs, if measured.
func (w *serverWork) addTo(fields map[string]any, key string, jobs int) {
	if w == nil {
		return
	}
	out := map[string]float64{}
	for k, v := range w.sum {
		out[k] = round2(v / float64(jobs))
	}
	fields[key] = out
}
