package gate

import (
	"context"
	"fmt"
	"math/rand"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/config"
)

// fakeTxs stands in for the database: it records every transaction the combiner runs and
// checks, while they run, what the combiner promises.
type fakeTxs struct {
	t       *testing.T
	refuse  bool // a shared transaction fails to lock its tenants (another process holds one)
	mu      sync.Mutex
	running map[*item]bool // items of the lane transactions running now
	lanesIn int            // lane transactions running now
	maxIn   int
	reading int // lane transactions running now that have not yet read their state
	maxRead int
	decided map[*item]int // how many committed transactions decided each item
	shared  int
	apart   map[*item]bool // items of groups that fell apart: they run alone, in no lane
}

func (f *fakeTxs) run(_ context.Context, items []*item, _ config.Config, shared bool, read func()) error {
	f.mu.Lock()
	if shared {
		f.shared++
		keys := map[string]bool{}
		for _, it := range items {
			if it.req.IdempotencyKey != nil {
				k := keyOf(it.req.Tenant, *it.req.IdempotencyKey)
				if keys[k] {
					f.t.Errorf("a group holds two admissions with key %q", k)
				}
				keys[k] = true
			}
			for other := range f.running {
				if other.req.Tenant == it.req.Tenant {
					f.t.Errorf("a group took tenant %q while another lane held it", it.req.Tenant)
				}
			}
		}
	}
	if shared && f.refuse {
		for _, it := range items {
			f.apart[it] = true
		}
	}
	lane := shared || !f.apart[items[0]]
	if lane {
		f.lanesIn++
		f.maxIn = max(f.maxIn, f.lanesIn)
		f.reading++
		f.maxRead = max(f.maxRead, f.reading)
		for _, it := range items {
			f.running[it] = true
		}
	}
	f.mu.Unlock()
	unread := lane
	for i := range 20 {
		runtime.Gosched() // let other admissions arrive while this transaction "runs"
		if i == 10 && !(shared && f.refuse) {
			// Its state is read under its tenants' locks: the rest is its inserts and COMMIT.
			f.mu.Lock()
			if unread {
				f.reading--
				unread = false
			}
			f.mu.Unlock()
			if read != nil {
				read()
			}
		}
	}

	var err error
	if shared && f.refuse {
		err = errGroupLocked
	}

	f.mu.Lock()
	defer f.mu.Unlock()
	if lane {
		f.lanesIn--
		if unread {
			f.reading--
		}
		for _, it := range items {
			delete(f.running, it)
		}
	}
	if err == nil {
		for _, it := range items {
			f.decided[it]++
		}
	}
	return err
}

// decidedOnce checks that each of items was decided by exactly one committed transaction.
func (f *fakeTxs) decidedOnce(t *testing.T, items []*item) {
	t.Helper()
	for _, it := range items {
		if n := f.decided[it]; n != 1 {
			t.Fatalf("an admission was decided %d times, want 1", n)
		}
	}
}

func newFakeAdmitter(t *testing.T, lanes int, refuse bool) (*Admitter, *fakeTxs) {
	f := &fakeTxs{t: t, refuse: refuse, running: map[*item]bool{}, decided: map[*item]int{},
		apart: map[*item]bool{}}
	a := &Admitter{combine: combiner{lanes: lanes, run: f.run}}
	return a, f
}

// TestCombinerDecidesEachAdmissionOnce drives many concurrent admissions, over a few tenants
// and keys, through the combiner with the database faked: every admission is decided exactly
// once, no more lane transactions run at once than there are lanes, some share a transaction,
// and no group holds two admissions with one key or a tenant another lane holds.
func TestCombinerDecidesEachAdmissionOnce(t *testing.T) {
	a, f := newFakeAdmitter(t, 2, false)
	f.decidedOnce(t, concurrentAdmissions(t, a, 400))
	if f.maxIn > 2 {
		t.Errorf("%d lane transactions ran at once, want at most 2", f.maxIn)
	}
	if f.shared == 0 {
		t.Errorf("no admissions shared a transaction")
	}
	if a.Waiting() != 0 {
		t.Errorf("%d admissions still waiting", a.Waiting())
	}
}

// TestCombinerGroupFallsApart: when every group fails to lock its tenants, each of its
// admissions runs alone, once, and none is lost.
func TestCombinerGroupFallsApart(t *testing.T) {
	a, f := newFakeAdmitter(t, 1, true)
	f.decidedOnce(t, concurrentAdmissions(t, a, 200))
	if f.shared == 0 {
		t.Errorf("no group was formed, so none fell apart")
	}
}

func concurrentAdmissions(t *testing.T, a *Admitter, n int) []*item {
	t.Helper()
	rng := rand.New(rand.NewSource(1))
	items := make([]*item, n)
	for i := range items {
		it := &item{req: Request{Tenant: fmt.Sprintf("t%d", rng.Intn(5))}}
		if rng.Intn(3) == 0 {
			k := fmt.Sprintf("k%d", rng.Intn(4))
			it.req.IdempotencyKey = &k
		}
		items[i] = it
	}
	var wg sync.WaitGroup
	for _, it := range items {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.admit(context.Background(), it, config.Default()); err != nil {
				t.Errorf("admit: %v", err)
			}
		}()
	}
	wg.Wait()
	return items
}

// TestCombinerOneLaneWhileItKeepsUp: with a stall delay no admission reaches, one lane at a
// time locks and reads, a second overlapping it only once it has read (Admitter.overlap), and
// every admission is still decided once.
func TestCombinerOneLaneWhileItKeepsUp(t *testing.T) {
	a, f := newFakeAdmitter(t, 2, false)
	a.combine.stallAfter = time.Minute
	f.decidedOnce(t, concurrentAdmissions(t, a, 400))
	if f.maxRead != 1 {
		t.Errorf("%d lane transactions were reading at once, want 1", f.maxRead)
	}
	if f.maxIn > 2 {
		t.Errorf("%d lane transactions ran at once, want at most 2", f.maxIn)
	}
	if f.shared == 0 {
		t.Errorf("no admissions shared a transaction")
	}
}

// TestCombinerOverlapsTheNextGroupWithACommit: an admission that queued behind a lane's
// transaction starts its own once that transaction has read its state, while it still writes
// and commits, not after it.
func TestCombinerOverlapsTheNextGroupWithACommit(t *testing.T) {
	started, proceed, read, release := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	a := &Admitter{combine: combiner{lanes: 2, stallAfter: time.Minute}}
	a.combine.run = func(_ context.Context, items []*item, _ config.Config, _ bool, onRead func()) error {
		if items[0].req.Tenant != "first" {
			return nil
		}
		close(started)
		<-proceed
		onRead()
		close(read)
		<-release // its inserts and COMMIT
		return nil
	}
	firstDone := make(chan error, 1)
	go func() {
		firstDone <- a.admit(context.Background(), &item{req: Request{Tenant: "first"}}, config.Default())
	}()
	<-started
	secondDone := make(chan error, 1)
	go func() {
		secondDone <- a.admit(context.Background(), &item{req: Request{Tenant: "second"}}, config.Default())
	}()
	for deadline := time.Now().Add(10 * time.Second); a.Waiting() != 1; runtime.Gosched() {
		if time.Now().After(deadline) {
			close(proceed)
			close(release)
			t.Fatal("the second admission did not queue behind the first lane within 10 s")
		}
	}
	close(proceed)
	<-read
	select {
	case err := <-secondDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second): // a deadline on the condition, not a wait for it
		close(release)
		t.Fatal("the second admission did not run while the first lane committed")
	}
	close(release)
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	if a.Waiting() != 0 {
		t.Errorf("%d admissions still waiting", a.Waiting())
	}
}

// TestCombinerStalledLaneOpensAnother: while the one lane's transaction is stuck (a tenant's
// lock held elsewhere), admissions that waited the stall delay get a second lane and finish;
// the stuck one finishes when released.
func TestCombinerStalledLaneOpensAnother(t *testing.T) {
	stuck, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	in, maxIn := 0, 0
	a := &Admitter{combine: combiner{lanes: 2, stallAfter: time.Millisecond}}
	a.combine.run = func(_ context.Context, items []*item, _ config.Config, _ bool, _ func()) error {
		mu.Lock()
		in++
		maxIn = max(maxIn, in)
		mu.Unlock()
		defer func() {
			mu.Lock()
			in--
			mu.Unlock()
		}()
		if items[0].req.Tenant == "stuck" {
			close(stuck)
			<-release
		}
		return nil
	}
	stuckDone := make(chan error, 1)
	go func() {
		stuckDone <- a.admit(context.Background(), &item{req: Request{Tenant: "stuck"}}, config.Default())
	}()
	<-stuck
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.admit(context.Background(), &item{req: Request{Tenant: fmt.Sprintf("t%d", i)}}, config.Default()); err != nil {
				t.Errorf("admit: %v", err)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second): // a deadline on the condition, not a wait for it
		close(release)
		t.Fatal("the admissions behind the stuck lane did not finish within 10 s: no second lane opened")
	}
	close(release)
	if err := <-stuckDone; err != nil {
		t.Fatal(err)
	}
	if maxIn != 2 {
		t.Errorf("%d lane transactions ran at once, want 2: the stuck one and a second lane beside it", maxIn)
	}
	if a.Waiting() != 0 {
		t.Errorf("%d admissions still waiting", a.Waiting())
	}
}
