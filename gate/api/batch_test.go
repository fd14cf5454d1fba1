package api

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/integration/wait"
)

// TestBatchesBounded: at most MaxBatches batches are in progress at once; past them a batch
// answers 503 busy with Retry-After before its body is read, while single admissions go on.
func TestBatchesBounded(t *testing.T) {
	spec, err := ParseSpec(OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	s := testServer(t)
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)

	// DefaultMaxBatches slow batches: each sends a body that never ends.
	var writers []*io.PipeWriter
	done := make(chan struct{}, DefaultMaxBatches)
	for range DefaultMaxBatches {
		pr, pw := io.Pipe()
		writers = append(writers, pw)
		req, _ := http.NewRequest("POST", hs.URL+"/v1/jobs:batch", pr)
		req.Header.Set("Authorization", "Bearer "+testAdminToken)
		go func() {
			defer func() { done <- struct{}{} }()
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		// More than the transport buffers, so that the request reaches the server now.
		_, _ = pw.Write([]byte(`{"jobs":[{"tenant":"acme","payload":"` + strings.Repeat("x", 64<<10)))
	}
	// Every slot is held before the probe: a request still on its way would free none later.
	wait.Until(t, 10*time.Second, "the batches to hold every slot", func() bool { return len(s.batches) == DefaultMaxBatches })
	t.Cleanup(func() {
		for _, pw := range writers {
			pw.CloseWithError(io.ErrUnexpectedEOF)
		}
		for range writers {
			<-done
		}
	})
	call := func(path, body string) (*http.Response, map[string]any, []byte) {
		t.Helper()
		req, _ := http.NewRequest("POST", hs.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testAdminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var m map[string]any
		_ = json.Unmarshal(raw, &m)
		return resp, m, raw
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, body, raw := call("/v1/jobs:batch", `{"jobs":[{"tenant":"acme"}]}`)
		if resp.StatusCode == http.StatusServiceUnavailable && body["error_code"] == "busy" {
			if resp.Header.Get("Retry-After") != "1" {
				t.Errorf("busy without Retry-After 1: %q", resp.Header.Get("Retry-After"))
			}
			if err := spec.CheckAnswer("POST", "/v1/jobs:batch", resp.StatusCode, raw); err != nil {
				t.Error(err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with %d batches held open, another batch answered %d %s; want 503 busy", DefaultMaxBatches, resp.StatusCode, raw)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A single admission is not a batch: it reaches the (unreachable) database.
	if resp, body, raw := call("/v1/jobs", `{"tenant":"acme"}`); body["error_code"] != "unavailable" {
		t.Errorf("POST /v1/jobs while the batches are held: HTTP %d %s; want it admitted or unavailable", resp.StatusCode, raw)
	}
}

// TestReadRawSizedOnce: a body with a Content-Length is read into one buffer of that size.
func TestReadRawSizedOnce(t *testing.T) {
	body := strings.Repeat("x", 3<<20)
	r := httptest.NewRequest("POST", "/v1/jobs:batch", strings.NewReader(body))
	data, err := readRaw(r, maxBatchBody)
	if err != nil || string(data) != body {
		t.Fatalf("readRaw: %d bytes, %v", len(data), err)
	}
	if c := cap(data); c > len(body)+64<<10 {
		t.Errorf("a %d-byte body read into a buffer of %d bytes: it was grown, not sized", len(body), c)
	}
	allocs := testing.AllocsPerRun(5, func() {
		r := httptest.NewRequest("POST", "/v1/jobs:batch", strings.NewReader(body))
		_, _ = readRaw(r, maxBatchBody)
	})
	if allocs > 20 {
		t.Errorf("%.0f allocations to read a 3 MiB body, want a few", allocs)
	}
}

// TestReadRawRefusesDeclaredTooLarge: a body whose Content-Length is over the limit is refused
// as payload_too_large without reading a byte of it; one that only turns out too large (no
// length given) is read to the limit and no further.
func TestReadRawRefusesDeclaredTooLarge(t *testing.T) {
	const limit = 1 << 20
	body := &countingBody{r: strings.NewReader(strings.Repeat("x", 2*limit))}
	r := httptest.NewRequest("POST", "/v1/jobs:batch", body)
	r.ContentLength = 2 * limit
	_, err := readRaw(r, limit)
	if je := (*job.Error)(nil); !errors.As(err, &je) || je.Code != job.CodePayloadTooLarge {
		t.Fatalf("declared %d bytes over a limit of %d: %v, want payload_too_large", r.ContentLength, limit, err)
	}
	if body.n != 0 {
		t.Errorf("read %d bytes of a body declared too large, want none", body.n)
	}
	body = &countingBody{r: strings.NewReader(strings.Repeat("x", 2*limit))}
	r = httptest.NewRequest("POST", "/v1/jobs:batch", body)
	r.ContentLength = -1
	if _, err := readRaw(r, limit); !errors.As(err, new(*job.Error)) {
		t.Fatalf("undeclared body over the limit: %v, want payload_too_large", err)
	}
	if body.n > limit+64<<10 {
		t.Errorf("read %d bytes of an undeclared body over a limit of %d", body.n, limit)
	}
}

type countingBody struct {
	r io.Reader
	n int
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
