package api

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/integration/wait"
)

// TestSlowClientsLeaveExecutorCallbacks: callers that hold requests open (a body that never
// ends) take at most MaxRequests slots; past them other requests answer 503 busy at once, and
// the executor's /start and /complete, and the probes, are still answered.
func TestSlowClientsLeaveExecutorCallbacks(t *testing.T) {
	spec, err := ParseSpec(OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	s := testServer(t)
	const slots = 4
	s.requests = make(chan struct{}, slots)
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)

	// slots+2 slow producers: each sends a body that never ends.
	var writers []*io.PipeWriter
	done := make(chan struct{}, slots+2)
	for range slots + 2 {
		pr, pw := io.Pipe()
		writers = append(writers, pw)
		req, _ := http.NewRequest("POST", hs.URL+"/v1/jobs", pr)
		req.Header.Set("Authorization", "Bearer "+testAdminToken)
		go func() {
			defer func() { done <- struct{}{} }()
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		_, _ = pw.Write([]byte(`{"tenant":"acme","payload":"`))
	}
	t.Cleanup(func() {
		for _, pw := range writers {
			pw.CloseWithError(io.ErrUnexpectedEOF)
		}
		for range writers {
			<-done
		}
	})

	call := func(method, path, body string) (int, map[string]any, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, hs.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testAdminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var m map[string]any
		_ = json.Unmarshal(raw, &m)
		return resp.StatusCode, m, raw
	}
	// Wait until the slow requests hold every slot; then another producer request is busy. The
	// wait reads the slots held instead of probing with requests: a probe takes a slot while it
	// runs, and a slow request that arrived meanwhile was answered busy and let go, so on a
	// loaded machine the slow ones left could stay short of the bound and no probe ever saw it
	// full (seen twice under load).
	wait.Until(t, 10*time.Second, fmt.Sprintf("the %d slow requests to hold all %d slots", slots+2, slots),
		func() bool { return len(s.requests) == slots })
	code, body, raw := call("GET", "/v1/jobs", "")
	if code != http.StatusServiceUnavailable || body["error_code"] != "busy" {
		t.Fatalf("with every slot held, GET /v1/jobs answered %d %s; want 503 busy", code, raw)
	}
	if err := spec.CheckAnswer("GET", "/v1/jobs", code, raw); err != nil {
		t.Error(err)
	}
	for _, c := range []struct{ method, route, path, body string }{
		{"POST", "/v1/jobs/{id}/start", "/v1/jobs/7/start", `{"nonce":"n"}`},
		{"POST", "/v1/jobs/{id}/complete", "/v1/jobs/7/complete", `{"nonce":"n","status":"succeeded"}`},
		{"GET", "/healthz", "/healthz", ""},
		{"GET", "/readyz", "/readyz", ""},
	} {
		code, body, raw := call(c.method, c.path, c.body)
		// testServer's database is down: /start and /complete reach it and answer unavailable.
		if body["error_code"] == "busy" || (code != http.StatusOK && body["error_code"] != "unavailable") {
			t.Errorf("%s %s while the slots are held: HTTP %d %s; want it answered", c.method, c.path, code, raw)
		}
		if err := spec.CheckAnswer(c.method, c.route, code, raw); err != nil {
			t.Error(err)
		}
	}
	// Every bounded route describes the busy answer.
	for _, route := range s.Routes() {
		method, path, _ := strings.Cut(route, " ")
		if unbounded[route] {
			continue
		}
		p := strings.NewReplacer("{id}", "7", "{rate_key_sha256}", strings.Repeat("0", 64)).Replace(path)
		code, body, raw := call(method, p, "{}")
		if code != http.StatusServiceUnavailable || body["error_code"] != "busy" || body["retry_after"] != float64(1) {
			t.Errorf("%s while the slots are held: HTTP %d %s; want 503 busy", route, code, raw)
			continue
		}
		if err := spec.CheckAnswer(method, path, code, raw); err != nil {
			t.Errorf("%s: %v", route, err)
		}
	}
}
