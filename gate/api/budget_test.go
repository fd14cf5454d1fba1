package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/testdb"
	"github.com/sluicehq/sluice/integration/wait"
)

// TestMemoryBudget: while one large admission holds most of the memory budget (its body declared,
// half sent), another large admission, a chunked one and a page of 1,000 jobs answer 503 busy with
// Retry-After and write nothing; a small admission and a small page pass, and the executor's
// /complete is charged but never refused. Once the large body is gone the budget is free again.
// Before the budget, every one of them was taken: MaxRequests bounds requests, not what each
// holds, and 512 of them at a 4 MiB payload cap exceeded the unit's MemoryMax (issue 30).
func TestMemoryBudget(t *testing.T) {
	spec, err := ParseSpec(OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	db := testdb.New(t)
	plain := db.Plain(t)
	lim := config.NewCache(plain, nil)
	if err := lim.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	adm, err := gate.New(gate.Config{DB: plain, TxDB: db.DB, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	const producer, executor = "budget-producer-token-0123456789abcdef", "budget-executor-token-0123456789abcdef"
	toks, err := NewTokens([]Token{{Name: "producer", Token: producer, Role: Producer, Tenants: []string{"*"}},
		{Name: "executor", Token: executor, Role: Executor}})
	if err != nil {
		t.Fatal(err)
	}
	// A large body is 250,000 bytes, charged 500,000: one fits the budget, two do not.
	const large, budget = 250_000, 900_000
	s, err := New(Config{DB: plain, Admitter: adm, Limits: lim, Tokens: toks, MemoryBudget: budget})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)

	admission := func(size int) string {
		head := `{"tenant":"acme","payload":"`
		return head + strings.Repeat("p", size-len(head)-2) + `"}`
	}
	call := func(method, path, token string, body io.Reader, length int64) (int, http.Header, map[string]any, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, hs.URL+path, body)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = length // -1: chunked
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var m map[string]any
		_ = json.Unmarshal(raw, &m)
		return resp.StatusCode, resp.Header, m, raw
	}
	jobs := func() int {
		t.Helper()
		var n int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM jobs").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	wantBusy := func(what, route string, code int, h http.Header, body map[string]any, raw []byte) {
		t.Helper()
		if code != http.StatusServiceUnavailable || body["error_code"] != "busy" || h.Get("Retry-After") != "1" {
			t.Errorf("%s with the budget spent: HTTP %d, Retry-After %q, %s; want 503 busy with Retry-After 1",
				what, code, h.Get("Retry-After"), raw)
		}
		if err := spec.CheckAnswer(strings.Fields(route)[0], strings.Fields(route)[1], code, raw); err != nil {
			t.Error(err)
		}
	}

	// The holder: a large admission whose body is declared and half sent.
	holder, err := net.Dial("tcp", hs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close() })
	body := admission(large)
	fmt.Fprintf(holder, "POST /v1/jobs HTTP/1.1\r\nHost: sluice\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s",
		producer, len(body), body[:len(body)/2])
	wait.Until(t, 10*time.Second, "the large admission to hold its charge", func() bool { return s.MemoryInUse() >= bodyCost(large) })

	code, h, m, raw := call("POST", "/v1/jobs", producer, strings.NewReader(admission(large)), large)
	wantBusy("a second large admission", "POST /v1/jobs", code, h, m, raw)
	code, h, m, raw = call("POST", "/v1/jobs", producer, io.MultiReader(strings.NewReader(admission(large))), -1)
	wantBusy("a chunked large admission", "POST /v1/jobs", code, h, m, raw)
	code, h, m, raw = call("GET", "/v1/jobs?limit=1000", producer, nil, 0)
	wantBusy("a page of 1,000 jobs", "GET /v1/jobs", code, h, m, raw)
	if n := jobs(); n != 0 {
		t.Fatalf("%d jobs written by refused requests, want none", n)
	}

	small := `{"tenant":"acme","payload":{"n":1}}`
	code, _, m, raw = call("POST", "/v1/jobs", producer, strings.NewReader(small), int64(len(small)))
	if code != http.StatusAccepted {
		t.Fatalf("a small admission beside the large one: HTTP %d %s, want 202", code, raw)
	}
	id := int64(m["id"].(float64))
	if code, _, _, raw := call("GET", "/v1/jobs?limit=10", producer, nil, 0); code != http.StatusOK {
		t.Errorf("a page of 10 jobs beside the large admission: HTTP %d %s, want 200", code, raw)
	}
	// The executor's outcome carries a large result; it is answered (the job was never
	// dispatched: 409), never busy.
	outcome := `{"nonce":"n","status":"succeeded","result":"` + strings.Repeat("r", large) + `"}`
	code, _, m, raw = call("POST", fmt.Sprintf("/v1/jobs/%d/complete", id), executor, strings.NewReader(outcome), int64(len(outcome)))
	if code == http.StatusServiceUnavailable || m["error_code"] == "busy" {
		t.Errorf("/complete with the budget spent: HTTP %d %s; the executor's callbacks are never refused", code, raw)
	}

	// The large body ends unsent: its charge goes back, and a large admission passes.
	holder.Close()
	wait.Until(t, 10*time.Second, "the budget to be free", func() bool { return s.MemoryInUse() == 0 })
	if code, _, _, raw := call("POST", "/v1/jobs", producer, strings.NewReader(admission(large)), large); code != http.StatusAccepted {
		t.Errorf("a large admission alone: HTTP %d %s, want 202", code, raw)
	}
	if code, _, _, raw := call("GET", "/v1/jobs?limit=1000", producer, nil, 0); code != http.StatusOK {
		t.Errorf("a page of 1,000 jobs alone (larger than the budget): HTTP %d %s, want 200", code, raw)
	}
	if n := jobs(); n != 2 {
		t.Errorf("%d jobs, want 2: the small admission and the last large one", n)
	}
}
