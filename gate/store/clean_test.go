package store

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCleanError(t *testing.T) {
	for _, c := range []struct {
		name, code, msg string
		wantCode        string
		wantPrefix      string
		wantLen         int
	}{
		{"fits", "upstream_timeout", "took too long", "upstream_timeout", "took too long", 13},
		{"empty", "", "", "", "", 0},
		{"long code", strings.Repeat("z", 65), "m", "executor_error", `error_code "zzz`, 65 + len(`error_code "": m`)},
		{"not ASCII", "délai", "m", "executor_error", `error_code "délai": m`, len(`error_code "délai": m`)},
		{"control", "a\nb", "", "executor_error", `error_code "a\nb": `, len(`error_code "a\nb": `)},
		{"long message", "", strings.Repeat("x", 65534) + "é", "", "xxx", 65534},
		{"invalid UTF-8", "", "a\xffb", "", "a\ufffdb", len("a\ufffdb")},
	} {
		code, msg := CleanError(c.code, c.msg)
		if code != c.wantCode || !strings.HasPrefix(msg, c.wantPrefix) || len(msg) != c.wantLen || !utf8.ValidString(msg) {
			t.Errorf("%s: got %q and a %d-byte message %.40q, want %q, %d bytes starting %.40q",
				c.name, code, len(msg), msg, c.wantCode, c.wantLen, c.wantPrefix)
		}
	}
}
