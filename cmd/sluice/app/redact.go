package app

import (
	"net/url"
	"strings"
)

// RedactURL returns s, a URL or a comma-separated list of them (as SLUICE_NATS_URL takes), with
// the credentials of each userinfo replaced, for logs, banners and error messages: user:pass@
// becomes user:***@, and a bare user@ becomes ***@, since NATS takes a token in that place. A
// URL that does not parse loses everything between its scheme and its last '@'. Safe for
// concurrent use.
func RedactURL(s string) string {
	if !strings.Contains(s, "@") {
		return s
	}
	parts := strings.Split(s, ",")
	for i, p := range parts {
		parts[i] = redactOne(p)
	}
	return strings.Join(parts, ",")
}

func redactOne(p string) string {
	// Where the userinfo starts: after the scheme's "://", or at the start when there is no
	// scheme (nats.go adds nats:// to "user:pass@host:4222").
	start, parse := 0, p
	if i := strings.Index(p, "://"); i >= 0 {
		start = i + len("://")
	} else {
		parse = "nats://" + strings.TrimSpace(p)
	}
	u, err := url.Parse(strings.TrimSpace(parse))
	if err == nil && u.User == nil {
		return p
	}
	// The userinfo ends at the authority's last '@'. As url.Parse reads it, the authority ends
	// at the first '/', '?' or '#'; a URL it cannot read (a password with an unescaped '/')
	// loses everything up to its last '@'.
	rest := p[start:]
	if err == nil {
		if end := strings.IndexAny(rest, "/?#"); end >= 0 {
			rest = rest[:end]
		}
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return p
	}
	masked := "***"
	if err == nil {
		if _, ok := u.User.Password(); ok {
			name, _, _ := strings.Cut(rest[:at], ":")
			masked = name + ":***"
		}
	}
	return p[:start] + masked + p[start+at:]
}

// redactedError is an error whose message has its URLs' credentials replaced (RedactURL) while
// errors.Is and errors.As still see the error it wraps.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// RedactError returns err with the credentials of the URLs in list (RedactURL's input) replaced
// in its message: a client may quote the URL it was given, as url.Parse's errors do. Nil stays
// nil.
func RedactError(err error, list string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	for _, p := range strings.Split(list, ",") {
		p = strings.TrimSpace(p)
		if r := redactOne(p); r != p {
			msg = strings.ReplaceAll(msg, p, r)
		}
	}
	if msg == err.Error() {
		return err
	}
	return &redactedError{msg: msg, err: err}
}
