// Package console serves sluice's operator console at /ui/: plain HTML, CSS and JavaScript
// modules embedded in the binary (no build step), which call the JSON API of the same listener
// with the bearer token the operator signs in with. The token lives in the tab's
// sessionStorage only: never in a URL, a cookie or the server's files, so nothing here is
// secret and every file is the same for every caller. The console decides nothing: it shows
// what the API answers, and the API enforces every role and tenant scope itself.
//
// Every answer carries a strict Content-Security-Policy (scripts, styles and fetches from this
// origin only, no inline script or style, no framing), so a tenant name or an error message
// that reaches the page can never run as code, and the console cannot be framed by another
// site to trick an operator into a click.
package console

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed static
var static embed.FS

// Prefix is the path the console is served under.
const Prefix = "/ui/"

// ContentSecurityPolicy is the policy every console answer carries. style-src allows no inline
// style: the scripts set sizes through the CSSOM (element.style), which CSP does not govern.
const ContentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// Files returns the console's files, rooted at its index.html.
func Files() fs.FS {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree always has static/
	}
	return sub
}

// Handler serves the console's files under Prefix: index.html for Prefix itself, a file by its
// path below it, 404 for anything else (directories are not listed). Safe for concurrent use.
func Handler() http.Handler {
	files := Files()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", ContentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		// The files change only with the binary and carry no modification time: revalidate,
		// so that an upgraded process's console is never mixed with an old cached module.
		h.Set("Cache-Control", "no-cache")
		name, ok := strings.CutPrefix(r.URL.Path, Prefix)
		if !ok {
			http.NotFound(w, r)
			return
		}
		if name == "" {
			name = "index.html"
		}
		if name != path.Clean(name) || strings.HasSuffix(name, "/") {
			http.NotFound(w, r)
			return
		}
		if st, err := fs.Stat(files, name); err != nil || st.IsDir() {
			http.NotFound(w, r)
			return
		}
		// ServeFileFS redirects a path ending in /index.html to the directory: give it the
		// directory's path, and the file by name.
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/" + strings.TrimSuffix(name, "index.html")
		http.ServeFileFS(w, r2, files, name)
	})
}
