package executor

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestSignVerify(t *testing.T) {
	body := []byte(`{"job_id":1}`)
	sig := Sign([]byte("secret"), body)
	if !strings.HasPrefix(sig, "sha256=") || len(sig) != len("sha256=")+64 {
		t.Fatalf("signature %q: want sha256= and 64 hex digits", sig)
	}
	if !Verify([]byte("secret"), body, sig) {
		t.Error("a body's own signature does not verify")
	}
	if Verify([]byte("other"), body, sig) || Verify([]byte("secret"), []byte(`{"job_id":2}`), sig) {
		t.Error("a signature verifies with another secret or body")
	}
}

// TestClassify is the SPEC §8 table.
func TestClassify(t *testing.T) {
	cases := []struct {
		status     int
		retryAfter string
		body       string
		want       Kind
		retry      int
	}{
		{200, "", `{"status":"succeeded","result":{"x":1}}`, Done, 0},
		{201, "", `{"status":"failed","error_code":"boom"}`, Done, 0},
		{200, "", `{"status":"weird"}`, Unknown, 0},
		{200, "", `not json`, Unknown, 0},
		{202, "", ``, Accepted, 0},
		{202, "", `{"gate":{"retry_after":30}}`, Accepted, 0},
		{429, "3600", ``, RateLimited, 3600},
		{503, "7", ``, Refused, 7},
		{503, "", ``, Refused, 0},
		{500, "", `{"status":"succeeded"}`, Unknown, 0},
		{409, "", ``, Unknown, 0},
		{307, "", ``, Unknown, 0},
		{308, "", `{"status":"succeeded"}`, Unknown, 0},
	}
	for _, c := range cases {
		a := Classify(c.status, c.retryAfter, []byte(c.body))
		if a.Kind != c.want || a.RetryAfter != c.retry {
			t.Errorf("HTTP %d %q %s: kind %d retry %d, want %d %d", c.status, c.retryAfter, c.body, a.Kind, a.RetryAfter, c.want, c.retry)
		}
	}
	if a := Classify(202, "", []byte(`{"gate":{"retry_after":30}}`)); a.Gate == nil || a.Gate.RetryAfter != 30 {
		t.Errorf("the gate of a 202 answer was lost: %+v", a.Gate)
	}
}

func TestParseRetryAfter(t *testing.T) {
	if got := parseRetryAfter("120"); got != 120 {
		t.Errorf("seconds: got %d", got)
	}
	if got := parseRetryAfter("-5"); got != 0 {
		t.Errorf("negative: got %d", got)
	}
	future := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	if got := parseRetryAfter(future); got < 85 || got > 91 {
		t.Errorf("HTTP date 90 s ahead: got %d", got)
	}
}

// TestSendDoesNotFollowRedirects: a 307 or 308 would re-send the signed body, its payload and
// nonce to whatever host the answer names. Send must stop at the redirect and call it Unknown,
// whichever client it was given.
func TestSendDoesNotFollowRedirects(t *testing.T) {
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"succeeded"}`))
	}))
	t.Cleanup(other.Close)
	for _, code := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect, http.StatusFound} {
		exec := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+"/steal", code)
		}))
		t.Cleanup(exec.Close)
		for name, c := range map[string]*Client{
			"NewClient":      NewClient(exec.URL, []byte("secret")),
			"a plain client": {URL: exec.URL, Secret: []byte("secret"), HTTP: &http.Client{}},
		} {
			a := c.Send(context.Background(), Dispatch{JobID: 7, Tenant: "acme", Nonce: "n"})
			if a.Kind != Unknown || a.HTTPStatus != code || a.Err == nil {
				t.Errorf("%s, HTTP %d: kind %d status %d err %v, want Unknown with status %d", name, code, a.Kind, a.HTTPStatus, a.Err, code)
			}
		}
	}
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the redirect target received %d dispatches, want 0", n)
	}
}

func TestPlainHTTPToRemote(t *testing.T) {
	cases := map[string]bool{
		"http://executor.example.com/dispatch": true,
		"http://10.0.0.5:8080/dispatch":        true,
		"HTTP://[2001:db8::1]/d":               true,
		"https://executor.example.com/d":       false,
		"http://127.0.0.1:9000/dispatch":       false,
		"http://127.8.0.1/dispatch":            false,
		"http://[::1]:9000/dispatch":           false,
		"http://localhost:9000/dispatch":       false,
		"http://exec.localhost/dispatch":       false,
		"::not a url":                          false,
	}
	for u, want := range cases {
		if got := PlainHTTPToRemote(u); got != want {
			t.Errorf("PlainHTTPToRemote(%q) = %v, want %v", u, got, want)
		}
	}
}

// TestSendNamesItsAudience: the client's Audience is inside the signed body of every dispatch
// that names none; without one the field is absent.
func TestSendNamesItsAudience(t *testing.T) {
	got := make(chan Dispatch, 2)
	exec := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !Verify([]byte("secret"), body, r.Header.Get(HeaderSignature)) {
			t.Errorf("the body's signature does not verify")
		}
		var d Dispatch
		_ = json.Unmarshal(body, &d)
		if d.Audience == "" && strings.Contains(string(body), "audience") {
			t.Errorf("an empty audience was sent: %s", body)
		}
		got <- d
		_, _ = w.Write([]byte(`{"status":"succeeded"}`))
	}))
	t.Cleanup(exec.Close)
	c := NewClient(exec.URL, []byte("secret"))
	c.Audience = "pool-a"
	c.Send(context.Background(), Dispatch{JobID: 7, Nonce: "n"})
	if d := <-got; d.Audience != "pool-a" {
		t.Errorf("audience %q, want pool-a", d.Audience)
	}
	c.Audience = ""
	c.Send(context.Background(), Dispatch{JobID: 8, Nonce: "n"})
	if d := <-got; d.Audience != "" {
		t.Errorf("audience %q, want none", d.Audience)
	}
}
