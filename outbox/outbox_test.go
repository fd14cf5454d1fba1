package outbox

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

// TestSubjectRoundTrip covers tenants that no raw subject token could carry (SPEC §7).
func TestSubjectRoundTrip(t *testing.T) {
	for _, tenant := range []string{"acme", "a.b", "*", ">", "with space", "ünï ☃", strings.Repeat("x", 191)} {
		s := Subject("sluice", Release, tenant)
		if strings.ContainsAny(strings.TrimPrefix(s, "sluice.release."), ".*> ") {
			t.Errorf("subject %q for tenant %q has a character subjects cannot carry", s, tenant)
		}
		kind, got, err := ParseSubject("sluice", s)
		if err != nil || kind != Release || got != tenant {
			t.Errorf("ParseSubject(%q) = %q, %q, %v; want release, %q", s, kind, got, err, tenant)
		}
	}
	for _, bad := range []string{"other.enqueue.YQ", "sluice.enqueue", "sluice.enqueue.!!"} {
		if _, _, err := ParseSubject("sluice", bad); err == nil {
			t.Errorf("ParseSubject(%q) accepted a malformed subject", bad)
		}
	}
}

func TestPokeMessage(t *testing.T) {
	m := PokeMessage("p", Enqueue, "t.1", 42)
	var p Poke
	if err := json.Unmarshal(m.Payload, &p); err != nil {
		t.Fatal(err)
	}
	if p != (Poke{Kind: Enqueue, Tenant: "t.1", JobID: 42}) || m.Subject != Subject("p", Enqueue, "t.1") {
		t.Errorf("poke %+v on %q", p, m.Subject)
	}
}

// TestPokeBodyAround: the body the server builds around an id is PokeMessage's, byte for byte,
// whatever the tenant holds (JSON escapes, non-ASCII).
func TestPokeBodyAround(t *testing.T) {
	for _, tenant := range []string{"a", "t.1", `q"uo\te`, "<&>", "Zürich ✓", "tab\there"} {
		for _, id := range []int64{1, 42, 1 << 40} {
			head, tail := pokeBodyAround(Enqueue, tenant)
			got := string(head) + strconv.FormatInt(id, 10) + string(tail)
			if want := string(PokeMessage("p", Enqueue, tenant, id).Payload); got != want {
				t.Errorf("tenant %q id %d: %s, want %s", tenant, id, got, want)
			}
		}
	}
}

func TestPokeJobID(t *testing.T) {
	for body, want := range map[string]int64{
		string(PokeMessage("sluice", Release, "acme", 42).Payload): 42,
		string(PokeMessage("sluice", Release, "acme", 0).Payload):  0,
		`not json`:         0,
		`{"job_id":-3}`:    0,
		`{"job_id":"7"}`:   0,
		`{"kind":"x"}`:     0,
		`{"job_id":9e3}`:   0,
		`{"job_id":12345}`: 12345,
	} {
		if got := PokeJobID([]byte(body)); got != want {
			t.Errorf("PokeJobID(%s) = %d; want %d", body, got, want)
		}
	}
}
