package console

import (
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func get(t *testing.T, path string) *http.Response {
	t.Helper()
	w := httptest.NewRecorder()
	Handler().ServeHTTP(w, httptest.NewRequest("GET", path, nil))
	return w.Result()
}

// TestServesFiles: the index at /ui/ and /ui/index.html, each file with its type, and 404 for
// what is not a file: a missing name, a directory, a path that escapes or is not clean. Every
// answer, a 404 included, carries the security headers.
func TestServesFiles(t *testing.T) {
	for _, c := range []struct {
		path, typ string
		status    int
	}{
		{"/ui/", "text/html", 200},
		{"/ui/index.html", "text/html", 200},
		{"/ui/js/app.js", "text/javascript", 200},
		{"/ui/style.css", "text/css", 200},
		{"/ui/favicon.svg", "image/svg+xml", 200},
		{"/ui/nope.js", "", 404},
		{"/ui/js", "", 404},
		{"/ui/js/", "", 404},
		{"/ui/js/../index.html", "", 404},
		{"/ui//index.html", "", 404},
		{"/other", "", 404},
	} {
		res := get(t, c.path)
		if res.StatusCode != c.status || !strings.HasPrefix(res.Header.Get("Content-Type"), c.typ) {
			t.Errorf("%s: HTTP %d %q, want %d %q", c.path, res.StatusCode, res.Header.Get("Content-Type"), c.status, c.typ)
		}
		if got := res.Header.Get("Content-Security-Policy"); got != ContentSecurityPolicy {
			t.Errorf("%s: Content-Security-Policy %q", c.path, got)
		}
		for h, want := range map[string]string{"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
			"Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"} {
			if got := res.Header.Get(h); got != want {
				t.Errorf("%s: %s %q, want %q", c.path, h, got, want)
			}
		}
	}
	if body, _ := io.ReadAll(get(t, "/ui/").Body); !strings.Contains(string(body), `<script type="module" src="js/app.js">`) {
		t.Errorf("/ui/ is not the index: %.200s", body)
	}
}

// TestPolicyIsStrict: the policy allows nothing but this origin, no inline script or style,
// and no framing.
func TestPolicyIsStrict(t *testing.T) {
	for _, want := range []string{"default-src 'self'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'", "object-src 'none'"} {
		if !strings.Contains(ContentSecurityPolicy, want) {
			t.Errorf("policy lacks %q", want)
		}
	}
	for _, bad := range []string{"unsafe-inline", "unsafe-eval", "*", "data:", "http:"} {
		if strings.Contains(ContentSecurityPolicy, bad) {
			t.Errorf("policy allows %q", bad)
		}
	}
}

// inline finds what the policy would block, so that the files never depend on it being loose:
// inline scripts and styles, event-handler attributes, javascript: URLs, and the sinks through
// which API data could become markup or code.
var inline = map[string]*regexp.Regexp{
	"inline script":   regexp.MustCompile(`<script(?:\s[^>]*)?>\s*[^<\s]`),
	"style element":   regexp.MustCompile(`<style`),
	"style attribute": regexp.MustCompile(`\sstyle\s*=|setAttribute\(\s*['"]style|['"]style['"]\s*:`),
	"event attribute": regexp.MustCompile(`<[^>]*\son[a-z]+\s*=`),
	"javascript: URL": regexp.MustCompile(`javascript:`),
	"HTML sink":       regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function`),
}

// scriptTag is an opening script tag; each must load its code from a file (src).
var scriptTag = regexp.MustCompile(`<script(?:\s[^>]*)?>`)

// violations returns what of inline data holds, one description each.
func violations(data []byte) []string {
	var out []string
	for what, re := range inline {
		if loc := re.FindIndex(data); loc != nil {
			out = append(out, fmt.Sprintf("%s: %q", what, data[loc[0]:min(loc[1]+20, len(data))]))
		}
	}
	for _, tag := range scriptTag.FindAll(data, -1) {
		if !regexp.MustCompile(`\ssrc=`).Match(tag) {
			out = append(out, fmt.Sprintf("script without src: %q", tag))
		}
	}
	return out
}

// TestViolationsFound: the scan catches each thing it looks for.
func TestViolationsFound(t *testing.T) {
	for _, bad := range []string{`<script>alert(1)</script>`, `<script type="module"></script>`, `<style>p{}</style>`,
		`<p style="color:red">`, `el.setAttribute('style', x)`, `<button onclick="f()">`, `<a href="javascript:f()">`,
		`el.innerHTML = x`, `eval(x)`} {
		if len(violations([]byte(bad))) == 0 {
			t.Errorf("%s: not caught", bad)
		}
	}
	if v := violations([]byte(`<script type="module" src="js/app.js"></script>`)); len(v) != 0 {
		t.Errorf("a script loaded from a file was flagged: %v", v)
	}
}

// TestNoInlineCode scans every embedded file for what the policy forbids or what would let data
// run as code.
func TestNoInlineCode(t *testing.T) {
	n := 0
	err := fs.WalkDir(Files(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		n++
		data, err := fs.ReadFile(Files(), path)
		if err != nil {
			return err
		}
		for _, v := range violations(data) {
			t.Errorf("%s: %s", path, v)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 8 {
		t.Errorf("walked %d files, want the whole console", n)
	}
}
