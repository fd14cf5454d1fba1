package store

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// The bounds of the error columns: error_code is VARCHAR(64) in ASCII, error_message TEXT.
const (
	MaxErrorCode    = 64
	MaxErrorMessage = 65535
)

// ValidErrorCode reports whether code fits the error_code column: at most MaxErrorCode bytes
// of printable ASCII.
func ValidErrorCode(code string) bool {
	if len(code) > MaxErrorCode {
		return false
	}
	for i := 0; i < len(code); i++ {
		if code[i] < 0x20 || code[i] > 0x7e {
			return false
		}
	}
	return true
}

// CleanError makes an executor's error fields storable. The database runs in strict mode, so
// an error_code or error_message that does not fit would fail the whole outcome write, and the
// job would end lost once its lease ran out. A code that does not fit becomes executor_error,
// kept at the head of the message; the message is made valid UTF-8 and cut to the column at a
// character boundary.
func CleanError(code, msg string) (string, string) {
	if !ValidErrorCode(code) {
		msg = "error_code " + strconv.Quote(strings.ToValidUTF8(code, "\ufffd")) + ": " + msg
		code = "executor_error"
	}
	msg = strings.ToValidUTF8(msg, "\ufffd")
	if len(msg) > MaxErrorMessage {
		cut := MaxErrorMessage
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut]
	}
	return code, msg
}
