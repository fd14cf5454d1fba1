package app

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

// TestRedactURL: every form of credentials in a URL is masked, the rest kept for diagnosis.
func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                       "nats://127.0.0.1:4222",
		"nats://user:pa55@127.0.0.1:4222":             "nats://user:***@127.0.0.1:4222",
		"nats://s3cr3t-token@127.0.0.1:4222":          "nats://***@127.0.0.1:4222",
		"tls://user:p%40ss@nats.example:4222":         "tls://user:***@nats.example:4222",
		"nats://user:p@ss@127.0.0.1:4222":             "nats://user:***@127.0.0.1:4222",
		"nats://user:pa/55@127.0.0.1:4222":            "nats://***@127.0.0.1:4222",
		"nats://user:pa55@127.0.0.1:bad":              "nats://***@127.0.0.1:bad",
		"nats://user:pa%zz55@127.0.0.1:4222":          "nats://***@127.0.0.1:4222",
		"user:pa55@127.0.0.1:4222":                    "user:***@127.0.0.1:4222",
		"nats://a:pa55@h1:4222,nats://b:pa56@h2:4222": "nats://a:***@h1:4222,nats://b:***@h2:4222",
		"nats://h1:4222, nats://tok@h2:4222":          "nats://h1:4222, nats://***@h2:4222",
		"https://exec.example/run@v2":                 "https://exec.example/run@v2",
		"https://u:pa55@exec.example/run@v2?x=@":      "https://u:***@exec.example/run@v2?x=@",
		"":                                            "",
	} {
		got := RedactURL(in)
		if got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
		for _, secret := range []string{"pa55", "pa56", "s3cr3t-token", "p%40ss", "p@ss", "pa/55", "pa%zz55"} {
			if strings.Contains(in, secret) && strings.Contains(got, secret) {
				t.Errorf("RedactURL(%q) = %q shows %q", in, got, secret)
			}
		}
	}
}

// TestRedactError: a URL quoted in an error loses its credentials; errors.As still finds the
// cause.
func TestRedactError(t *testing.T) {
	raw := "nats://user:pa55@127.0.0.1:bad"
	cause := &url.Error{Op: "parse", URL: raw, Err: errors.New(`invalid port ":bad" after host`)} // as url.Parse says it
	err := RedactError(cause, raw)
	if strings.Contains(err.Error(), "pa55") || !strings.Contains(err.Error(), "nats://***@127.0.0.1:bad") {
		t.Errorf("RedactError = %q, want the URL without its password", err)
	}
	var ue *url.Error
	if !errors.As(err, &ue) {
		t.Errorf("RedactError(%T) hides the cause from errors.As", cause)
	}
	if plain := errors.New("no servers"); RedactError(plain, raw) != plain || RedactError(nil, raw) != nil {
		t.Error("RedactError changes an error that shows no URL")
	}
}
