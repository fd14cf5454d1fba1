package integration_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/testdb"
)

// TestOpsLogStalledSink runs `sluice serve` with its stderr on a pipe that nobody reads (SPEC
// §10: a sink that stops reading must not slow admissions or claims). 2,000 jobs are admitted
// over HTTP and all of them run to success although the pipe fills after a few hundred lines;
// reading the pipe then shows a line with log_dropped, and /metrics counts the drops. With the
// pipe left unread again, SIGTERM ends the process within 3 s: it waits at most 2 s for its
// log.
func TestOpsLogStalledSink(t *testing.T) {
	t.Parallel()
	bin := buildSluice(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	p := startServeLogTo(t, bin, w)
	w.Close() // the child has its own copy: the pipe ends when the process does
	testdb.SetLimits(t, p.db.DB, func(c *config.Config) {
		c.GlobalInFlight, c.TenantInFlight, c.GlobalQueueDepth = 64, 16, 5000
	})

	const jobs, tenants, workers = 2000, 20, 16
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	next := make(chan int)
	go func() {
		defer close(next)
		for i := range jobs {
			select {
			case next <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	for range workers {
		wg.Go(func() {
			for i := range next {
				code, body, err := apiDo(ctx, http.DefaultClient, http.MethodPost, p.url+"/v1/jobs", harness.ProducerToken,
					map[string]any{"tenant": fmt.Sprintf("t%02d", i%tenants), "payload": map[string]any{"i": i}})
				if err != nil || code != http.StatusAccepted {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("job %d: HTTP %d %v %v", i, code, body, err))
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d of %d admissions failed with the log pipe unread, first: %s", len(failures), jobs, failures[0])
	}
	harness.WaitFor(t, 45*time.Second, "all 2,000 jobs to succeed with the log pipe unread", func() (bool, error) {
		return p.counts()["succeeded"] == jobs, nil
	})
	dropped, ok := metricValue(scrape(t, p.url), "sluice_log_dropped_total")
	if !ok || dropped <= 0 {
		t.Errorf("sluice_log_dropped_total = %v (found %v) after 2,000 jobs logged into an unread pipe, want > 0", dropped, ok)
	}

	// Read until the first line carrying log_dropped: the writer, blocked on the full pipe
	// until now, writes the line it was writing, then the next with the count.
	if err := r.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	var marked map[string]any
	lines := 0
	for marked == nil && sc.Scan() {
		lines++
		if !bytes.Contains(sc.Bytes(), []byte(`"log_dropped"`)) {
			continue
		}
		if err := json.Unmarshal(sc.Bytes(), &marked); err != nil {
			t.Fatalf("line %d is not JSON: %v: %s", lines, err, sc.Text())
		}
	}
	if marked == nil {
		t.Fatalf("no line with log_dropped in the first %d lines read from the pipe (scanner: %v)", lines, sc.Err())
	}
	// The counter is read again now: the jobs' transitions are logged after their commits, so a
	// few lines may still have been dropped after the read above, and the line counts them.
	if dropped, ok = metricValue(scrape(t, p.url), "sluice_log_dropped_total"); !ok {
		t.Fatal("sluice_log_dropped_total is gone from /metrics")
	}
	if n, _ := marked["log_dropped"].(float64); n <= 0 || n > dropped {
		t.Errorf("log_dropped = %v on line %d, want 1..%v (sluice_log_dropped_total): %v", marked["log_dropped"], lines, dropped, marked)
	}
	t.Logf("read %d lines before the one with log_dropped %v; sluice_log_dropped_total %v", lines, marked["log_dropped"], dropped)

	// Reading stops here: the thousands of lines still queued fill the pipe again.
	start := time.Now()
	p.signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(3 * time.Second):
		t.Fatalf("sluice serve did not exit within 3 s of SIGTERM with its log pipe unread\nstdout:\n%s", p.log.String())
	}
	elapsed := time.Since(start)
	if p.exitErr != nil {
		t.Errorf("sluice serve exited with %v after SIGTERM, want 0", p.exitErr)
	}
	// What the pipe still holds ends before the shutdown's lines: the process gave up on them.
	if err := r.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("read the rest of the pipe: %v", err)
	}
	if bytes.Contains(rest, []byte(`"msg":"sluice stopped"`)) {
		t.Errorf("the pipe holds the shutdown's last line: the sink was not stalled at exit, so the exit bound was not tested")
	}
	t.Logf("exited %s after SIGTERM; %d bytes left unread in the pipe", elapsed.Round(time.Millisecond), len(rest))
}
