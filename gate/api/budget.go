package api

import (
	"context"
	"io"
	"sync/atomic"
)

// DefaultMemoryBudget is Config.MemoryBudget's default: a quarter of the 1 GiB MemoryMax of the
// units that run the API (deploy/systemd/sluice.service, sluice-api.service). The garbage
// collector lets the heap grow to about twice what is live, and the rest of the process (pools,
// stacks, the drainer's and relay's work in sluice.service) needs the other half.
const DefaultMemoryBudget = 256 << 20

// What a request is charged: bodyCost for a body, pageCost for a page of jobs. The
// factor 2 is the bytes read plus what decoding makes of them, or a page's rows plus the JSON
// encoding of the answer, which json.Encoder builds whole before writing it.
const (
	// listRowBytes is a listed job's JSON without its result and error message: ids, tenant,
	// rate key, state, five times and lanes.
	listRowBytes = 1 << 10
	// heldStep is how much of a body of unknown length (chunked) is charged at a time, as it
	// arrives: a slow sender holds only what it has sent.
	heldStep = 64 << 10
)

func bodyCost(n int64) int64 { return 2 * n }

// pageCost is the charge for a page of rows jobs whose results and error messages take
// variable bytes.
func pageCost(rows, variable int) int64 { return 2 * (int64(rows)*listRowBytes + int64(variable)) }

// memBudget counts the bytes that request bodies and response pages in progress hold, across
// the process (Config.MemoryBudget): MaxRequests bounds how many requests run, not what each
// holds, and 512 admissions of a 4 MiB payload, or of pages of 1,000 jobs, would hold several
// times a unit's MemoryMax. Safe for concurrent use.
type memBudget struct {
	limit int64
	used  atomic.Int64
}

// take charges n bytes and reports whether it could. A charge past the limit is refused unless
// force (the executor's callbacks, which must get through: in-flight jobs bound them) or nothing
// else is charged (a request larger than the whole budget then passes alone, rather than being
// refused forever).
func (b *memBudget) take(n int64, force bool) bool {
	for {
		u := b.used.Load()
		if !force && u > 0 && u+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// memHold is one request's charges against the budget, given back when the request ends. A nil
// hold, or one without a budget, charges nothing. Used by the request's goroutine only.
type memHold struct {
	b     *memBudget
	force bool
	held  int64
}

type holdKey struct{}

// holdOf returns the hold of the request whose context is ctx (nil outside auth).
func holdOf(ctx context.Context) *memHold {
	h, _ := ctx.Value(holdKey{}).(*memHold)
	return h
}

// take charges n more bytes to the request, or returns 503 busy with Retry-After when the
// budget is spent; the request must then give up before reading or building what it would
// have charged, so that nothing is written.
func (h *memHold) take(n int64) error {
	if h == nil || h.b == nil || n <= 0 {
		return nil
	}
	if !h.b.take(n, h.force) {
		return busy("too much request data in progress; retry shortly")
	}
	h.held += n
	return nil
}

// release gives back everything the request took.
func (h *memHold) release() {
	if h == nil || h.b == nil {
		return
	}
	h.b.used.Add(-h.held)
	h.held = 0
}

// heldReader charges a body of unknown length heldStep at a time before reading it; a read
// past a spent budget fails with take's busy error.
type heldReader struct {
	r    io.Reader
	h    *memHold
	room int64 // bytes charged but not read yet
}

func (b *heldReader) Read(p []byte) (int, error) {
	if b.room <= 0 {
		if err := b.h.take(bodyCost(heldStep)); err != nil {
			return 0, err
		}
		b.room = heldStep
	}
	if int64(len(p)) > b.room {
		p = p[:b.room]
	}
	n, err := b.r.Read(p)
	b.room -= int64(n)
	return n, err
}

// MemoryInUse returns the bytes charged to the budget by the requests in progress (for the
// metrics). Safe for concurrent use.
func (s *Server) MemoryInUse() int64 {
	if s.budget == nil {
		return 0
	}
	return s.budget.used.Load()
}
