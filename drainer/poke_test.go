package drainer

import (
	"slices"
	"testing"
)

// TestPokeWaiters: a callback waits for a pass only while Run schedules passes, and not past
// maxPokeWaiters; a pass takes every callback waiting; when Run stops, those still waiting run.
func TestPokeWaiters(t *testing.T) {
	var w pokeWaiters
	var ran []int
	f := func(i int) func() { return func() { ran = append(ran, i) } }
	if w.add(f(0)) {
		t.Fatal("a callback was kept while no pass is coming")
	}
	w.setRunning(true)
	for i := 1; i <= 2; i++ {
		if !w.add(f(i)) {
			t.Fatalf("callback %d was not kept while Run schedules passes", i)
		}
	}
	runAll(w.take())
	if !slices.Equal(ran, []int{1, 2}) {
		t.Fatalf("a pass ran %v, want [1 2]", ran)
	}
	if fs := w.take(); len(fs) != 0 {
		t.Fatalf("the next pass took %d callbacks already taken", len(fs))
	}
	for range maxPokeWaiters {
		w.add(f(3))
	}
	if w.add(f(4)) {
		t.Fatalf("a callback past maxPokeWaiters (%d) was kept", maxPokeWaiters)
	}
	ran = nil
	w.setRunning(false)
	if len(ran) != maxPokeWaiters {
		t.Fatalf("stopping ran %d callbacks, want the %d waiting", len(ran), maxPokeWaiters)
	}
	if w.add(f(5)) {
		t.Fatal("a callback was kept after Run stopped")
	}
}
