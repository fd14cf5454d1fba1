package gate

import (
	"sync"
	"time"
)

// depthEstimate stands in for counting the global queued depth on every admission. Counting
// is a scan of up to global_queue_depth index entries, and under concurrent inserts InnoDB
// checks each entry's visibility in the clustered index, which makes it most of a single
// admission's database time. The global cap is best effort
// (SPEC §5), so admission counts exactly only when it matters:
//
//   - a count is reused for at most Config.GlobalDepthRefresh, and only while the estimate
//     (the count plus every job this process admitted since) is more than depthMargin below the
//     cap; within the margin, and for queue=false admissions, every admission counts;
//   - jobs leaving the queue only make the estimate high, which brings the exact count sooner.
//
// With one API process the global cap is therefore held as exactly as by counting every time
// (overshoot at most the admissions in flight). With several, each may additionally miss what
// the others admitted within one refresh period, which matters only if they admit more than
// the margin (a tenth of the cap) in that period.
//
// Safe for concurrent use.
type depthEstimate struct {
	mu    sync.Mutex
	at    time.Time // when the last count was taken (before its statement ran)
	count int
	since int // jobs this process admitted since that count started
}

// depthMargin is how far below the cap the estimate must be to skip the count.
func depthMargin(limit int) int { return max(limit/10, 20) }

// estimate returns the estimated depth and whether a count recent enough stands behind it.
func (d *depthEstimate) estimate(now time.Time, refresh time.Duration) (int, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if refresh < 0 || d.at.IsZero() || now.Sub(d.at) > refresh || now.Before(d.at) {
		return 0, false
	}
	return d.count + d.since, true
}

// counted records a count that started at at. An older count than the one held is ignored.
func (d *depthEstimate) counted(at time.Time, n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if at.Before(d.at) {
		return
	}
	d.at, d.count, d.since = at, n, 0
}

// admitted records n jobs this process committed to the queue.
func (d *depthEstimate) admitted(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.since += n
}
