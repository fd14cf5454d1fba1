package drainer

import (
	"database/sql"
	"testing"
	"time"
)

func ids(cs []candidate) []int64 {
	out := make([]int64, len(cs))
	for i, c := range cs {
		out[i] = c.id
	}
	return out
}

func TestHeadCache(t *testing.T) {
	var h headCache
	if got := h.take("a"); got != nil {
		t.Fatalf("empty cache gave %v", got)
	}
	h.keep("a", []candidate{{id: 1, tenant: "a"}, {id: 2, tenant: "a", rateKey: sql.NullString{String: "k", Valid: true}}, {id: 3, tenant: "a"}})
	h.keep("b", []candidate{{id: 10, tenant: "b"}, {id: 11, tenant: "b"}})

	// take hands out the cache's own heads, which nothing writes into: an append copies, a pass
	// that drops gated heads replaces its slice, and claims leave what a pass took as it was.
	got := h.take("a")
	_ = append(got, candidate{id: 98})
	dropped := map[string][]candidate{"a": got}
	dropGated(dropped, map[string]time.Time{"k": time.Now().Add(time.Hour)}, time.Now())
	if g := ids(h.take("a")); len(g) != 3 || g[0] != 1 || g[1] != 2 || g[2] != 3 || len(dropped["a"]) != 2 {
		t.Fatalf("cache %v after an append and a gate dropped %v; want it intact", g, ids(dropped["a"]))
	}
	h.keep("e", []candidate{{id: 40, tenant: "e"}, {id: 41, tenant: "e"}, {id: 42, tenant: "e"}})
	held := h.take("e")
	h.claimed([]candidate{{id: 41, tenant: "e"}}, map[int64]bool{41: true})
	if g, kept := ids(held), ids(h.take("e")); len(g) != 3 || g[1] != 41 || g[2] != 42 || len(kept) != 2 || kept[1] != 42 {
		t.Fatalf("a claim from the middle: the pass holds %v, the cache %v; want [40 41 42] and [40 42]", g, kept)
	}

	// Claimed heads leave; a tenant with a head that was not claimed (taken or canceled
	// elsewhere) loses its whole entry.
	h.claimed([]candidate{{id: 1, tenant: "a"}, {id: 10, tenant: "b"}}, map[int64]bool{1: true})
	if g := ids(h.take("a")); len(g) != 2 || g[0] != 2 || g[1] != 3 {
		t.Fatalf("a after claim: %v, want [2 3]", g)
	}
	if g := h.take("b"); g != nil {
		t.Fatalf("b kept %v after a fenced claim", ids(g))
	}

	h.claimed([]candidate{{id: 2, tenant: "a"}, {id: 3, tenant: "a"}}, map[int64]bool{2: true, 3: true})
	if g := h.take("a"); g != nil {
		t.Fatalf("a kept %v after all its heads were claimed", ids(g))
	}

	h.keep("c", []candidate{{id: 20, tenant: "c"}})
	h.invalidate("c")
	if g := h.take("c"); g != nil {
		t.Fatalf("c kept %v after invalidate", ids(g))
	}
	h.keep("d", []candidate{{id: 30, tenant: "d"}})
	h.reset()
	if g := h.take("d"); g != nil {
		t.Fatalf("d kept %v after reset", ids(g))
	}
}
