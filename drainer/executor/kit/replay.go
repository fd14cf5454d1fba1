package kit

import (
	"sync"
	"time"
)

// nonceMemory remembers the nonces of the dispatches received, so that a replayed dispatch (the
// same signed body again) is refused. A nonce is kept until its dispatch's deadline, past which
// the dispatch is refused for its deadline anyway, and at most max nonces are kept: past that
// the oldest are forgotten first. Safe for concurrent use.
type nonceMemory struct {
	max int

	mu    sync.Mutex
	until map[string]time.Time
	order []string // nonces in arrival order; arrival order is close to deadline order
}

func newNonceMemory(max int) *nonceMemory {
	return &nonceMemory{max: max, until: map[string]time.Time{}}
}

// add records nonce, whose dispatch runs until deadline (zero: none), and reports whether it is
// new.
func (m *nonceMemory) add(nonce string, deadline, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.until[nonce]; ok {
		return false
	}
	for len(m.order) > 0 && (len(m.order) >= m.max || !now.Before(m.until[m.order[0]])) {
		delete(m.until, m.order[0])
		m.order[0] = ""
		m.order = m.order[1:]
	}
	if deadline.IsZero() {
		deadline = now.Add(noDeadline)
	}
	m.until[nonce] = deadline
	m.order = append(m.order, nonce)
	return true
}

// size is how many nonces are remembered.
func (m *nonceMemory) size() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.order)
}
