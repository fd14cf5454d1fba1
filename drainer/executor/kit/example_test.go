package kit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/drainer/executor"
	"github.com/sluicehq/sluice/drainer/executor/kit"
)

// An executor is a function and a listener. Point sluice at it with
// SLUICE_EXECUTOR_URL=http://127.0.0.1:7482/ and the same SLUICE_EXECUTOR_SECRET.
func Example() {
	run := func(ctx context.Context, j kit.Job) kit.Outcome {
		log.Printf("job %d of %s: %s", j.ID, j.Tenant, j.Payload)
		return kit.Succeeded(map[string]string{"greeting": "hello, " + j.Tenant})
	}
	h, err := kit.New(os.Getenv("SLUICE_EXECUTOR_SECRET"), os.Getenv("SLUICE_API_URL"), os.Getenv("SLUICE_EXECUTOR_TOKEN"), run)
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close()
	log.Fatal(http.ListenAndServe("127.0.0.1:7482", h))
}

// stubAPI stands for sluice's API in the examples: it answers /start and /complete with 200 and
// prints each call, the random start id as <random>.
func stubAPI() *httptest.Server {
	startID := regexp.MustCompile(`"start_id":"[0-9a-f]{32}"`)
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		body = startID.ReplaceAll(bytes.TrimSpace(body), []byte(`"start_id":"<random>"`))
		fmt.Printf("API: %s %s\n", r.URL.Path, body)
		_, _ = w.Write([]byte(`{}`))
	}))
}

// dispatch sends h a dispatch of job 42 signed with secret, as sluice's drainer does, and
// returns the answer.
func dispatch(h http.Handler, secret string, payload string) *httptest.ResponseRecorder {
	key := "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	body, _ := json.Marshal(executor.Dispatch{JobID: 42, Tenant: "acme", RateKeySHA256: &key,
		Payload: json.RawMessage(payload), Nonce: "nonce-of-this-dispatch", Deadline: time.Now().Add(time.Minute), Attempt: 1})
	req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	req.Header.Set(executor.HeaderJobID, "42")
	req.Header.Set(executor.HeaderSignature, executor.Sign([]byte(secret), body))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// New's handler confirms the start before running the function, and answers with its outcome.
func ExampleNew() {
	api := stubAPI()
	defer api.Close()
	h, err := kit.New("the-secret", api.URL, "executor-token", func(ctx context.Context, j kit.Job) kit.Outcome {
		var p struct {
			Pages int `json:"pages"`
		}
		if err := json.Unmarshal(j.Payload, &p); err != nil {
			return kit.Failed("bad_payload", err.Error())
		}
		return kit.Succeeded(map[string]int{"printed": p.Pages})
	})
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close()

	rec := dispatch(h, "the-secret", `{"pages": 3}`)
	fmt.Print(rec.Code, " ", rec.Body.String())
	rec = dispatch(h, "a-guess", `{"pages": 3}`)
	fmt.Print(rec.Code, " ", rec.Body.String())
	// Output:
	// API: /v1/jobs/42/start {"nonce":"nonce-of-this-dispatch","start_id":"<random>"}
	// 200 {"result":{"printed":3},"status":"succeeded"}
	// 401 {"error_code":"bad_signature","message":"Sluice-Signature does not match the body"}
}

// An upstream's 429 becomes RateLimited: sluice gates the job's rate key for its Retry-After.
// Checked in BeforeStart, when the executor already knows the quota is spent, the job is not
// started and goes back to the queue behind the gate.
func ExampleRateLimited() {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "3600")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer upstream.Close()
	api := stubAPI()
	defer api.Close()
	h, err := kit.New("the-secret", api.URL, "executor-token", func(ctx context.Context, j kit.Job) kit.Outcome {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, upstream.URL, bytes.NewReader(j.Payload))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return kit.Failed("upstream_unreachable", err.Error())
		}
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			return kit.RateLimited(time.Duration(secs) * time.Second)
		}
		return kit.Succeeded(nil)
	})
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close()

	rec := dispatch(h, "the-secret", `{}`)
	fmt.Println(rec.Code, "Retry-After:", rec.Header().Get("Retry-After"))
	// Output:
	// API: /v1/jobs/42/start {"nonce":"nonce-of-this-dispatch","start_id":"<random>"}
	// 429 Retry-After: 3600
}

// Long work is answered 202 at once and reported through /complete when done; Shutdown waits for
// it.
func ExampleAsync() {
	api := stubAPI()
	defer api.Close()
	h, err := kit.New("the-secret", api.URL, "executor-token", func(ctx context.Context, j kit.Job) kit.Outcome {
		return kit.Failed("render_failed", "font missing")
	}, kit.Async(func(kit.Job) bool { return true }), kit.MaxConcurrent(8, 5*time.Second))
	if err != nil {
		log.Fatal(err)
	}

	rec := dispatch(h, "the-secret", `{}`)
	// Shutdown returns once the job has run and its outcome is reported.
	if err := h.Shutdown(context.Background()); err != nil {
		log.Fatal(err)
	}
	fmt.Println(rec.Code)
	// Output:
	// API: /v1/jobs/42/start {"nonce":"nonce-of-this-dispatch","start_id":"<random>"}
	// API: /v1/jobs/42/complete {"nonce":"nonce-of-this-dispatch","status":"failed","error_code":"render_failed","error_message":"font missing"}
	// 202
}
