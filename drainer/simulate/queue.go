package simulate

import (
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// tenantQueue is one tenant's jobs in the system. Its due jobs are kept in one FIFO per
// (interactive, priority): within each, store.Head.Before's order is the FIFO's (a job aged to
// the top priority is older than every job of its FIFO that is not), so a merge of the FIFOs'
// fronts by Before reads the queue in the claim's order without sorting it.
type tenantQueue struct {
	fifos       [2][job.MaxPriority + 1]fifo
	eligible    int          // due jobs, in the FIFOs
	depth       int          // queued jobs, scheduled ones included
	interactive int          // queued interactive jobs
	inFlight    int          // jobs and counted slots
	heads       []store.Head // first's answer, reused: valid until the next first
}

func (q *tenantQueue) fifo(j *qjob) *fifo {
	i := 0
	if j.head.Interactive {
		i = 1
	}
	return &q.fifos[i][j.head.Priority]
}

func (q *tenantQueue) add(j *qjob) {
	q.fifo(j).push(j)
	q.eligible++
}

// first returns the tenant's first n due jobs in the claim's order (store.Head.Before, aged
// as the claim ages them), and whether it has more. The slice is valid until the next first.
func (q *tenantQueue) first(n int, aged time.Time) ([]store.Head, bool) {
	n = min(n, q.eligible)
	out := q.heads[:0]
	var at [2][job.MaxPriority + 1]int // how far each FIFO has been read
	for len(out) < n {
		var best *qjob
		bi, bp := 0, 0
		for i := range q.fifos {
			for p := range q.fifos[i] {
				f := &q.fifos[i][p]
				if at[i][p] >= f.len() {
					continue
				}
				if j := f.at(at[i][p]); best == nil || j.head.Before(best.head, aged) {
					best, bi, bp = j, i, p
				}
			}
		}
		at[bi][bp]++
		out = append(out, best.head)
	}
	q.heads = out
	return out, q.eligible > n
}

// each calls f with every due job.
func (q *tenantQueue) each(f func(*qjob)) {
	for i := range q.fifos {
		for p := range q.fifos[i] {
			fi := &q.fifos[i][p]
			for k := range fi.len() {
				f(fi.at(k))
			}
		}
	}
}

// take removes the due job id, one of those first returned, and returns it.
func (q *tenantQueue) take(id int64) *qjob {
	for i := range q.fifos {
		for p := range q.fifos[i] {
			if j := q.fifos[i][p].remove(id); j != nil {
				q.eligible--
				return j
			}
		}
	}
	panic("simulate: a chosen job is not in its tenant's queue")
}

// fifo is a queue of jobs in (queued_at, id) order.
type fifo struct {
	js  []*qjob
	off int // js[:off] are gone
}

func (f *fifo) len() int       { return len(f.js) - f.off }
func (f *fifo) at(i int) *qjob { return f.js[f.off+i] }
func (f *fifo) last() *qjob    { return f.js[len(f.js)-1] }
func (f *fifo) empty() bool    { return f.len() == 0 }
func older(a, b *qjob) bool {
	return a.head.QueuedAt.Before(b.head.QueuedAt) || a.head.QueuedAt.Equal(b.head.QueuedAt) && a.head.ID < b.head.ID
}
func (f *fifo) compactable() bool { return f.off > 32 && f.off > len(f.js)/2 }

// push adds j in its place: at the end but for a scheduled job come due, which goes among the
// jobs queued after it.
func (f *fifo) push(j *qjob) {
	if f.empty() || !older(j, f.last()) {
		f.js = append(f.js, j)
		return
	}
	i := len(f.js)
	for i > f.off && older(j, f.js[i-1]) {
		i--
	}
	f.js = append(f.js, nil)
	copy(f.js[i+1:], f.js[i:])
	f.js[i] = j
}

// remove takes out the job id, which is near the front (the claim reads the fronts).
func (f *fifo) remove(id int64) *qjob {
	for i := f.off; i < len(f.js); i++ {
		j := f.js[i]
		if j.head.ID != id {
			continue
		}
		if i != f.off {
			copy(f.js[f.off+1:i+1], f.js[f.off:i])
			f.js[f.off] = j
		}
		return f.pop()
	}
	return nil
}

// pop takes out the front job, keeping the array bounded by the jobs left, not by those gone.
func (f *fifo) pop() *qjob {
	j := f.js[f.off]
	f.js[f.off] = nil
	f.off++
	if f.empty() {
		f.js, f.off = f.js[:0], 0
	} else if f.compactable() {
		n := copy(f.js, f.js[f.off:])
		clear(f.js[n:])
		f.js, f.off = f.js[:n], 0
	}
	return j
}
