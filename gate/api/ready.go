package api

import (
	"errors"

	"github.com/sluicehq/sluice/gate/job"
)

// Reasons /readyz gives for being unready. /readyz needs no token, so it answers one of these
// fixed words and a fixed message; the error behind it (which may name addresses and database
// user names) goes to the log only.
const (
	// ReadyReasonDatabase: the database cannot be reached or queried.
	ReadyReasonDatabase = "database"
	// ReadyReasonMigrations: the database schema is behind the binary (`sluice migrate up`).
	ReadyReasonMigrations = "migrations"
	// ReadyReasonStopping: the process is shutting down and takes no new work.
	ReadyReasonStopping = "stopping"
	// ReadyReasonUnknown: a readiness error that names no reason.
	ReadyReasonUnknown = "unknown"
)

// readyMessages are the fixed messages of the reasons, safe to show to anyone.
var readyMessages = map[string]string{
	ReadyReasonDatabase:   "the database cannot be reached",
	ReadyReasonMigrations: "the database schema is not current",
	ReadyReasonStopping:   "the process is shutting down",
	ReadyReasonUnknown:    "not ready",
}

// NotReadyError is what a Config.Ready check returns to say why the process is not ready:
// Reason (one of the ReadyReason constants) is shown by /readyz, Err only logged.
type NotReadyError struct {
	Reason string
	Err    error
}

// NotReady returns a *NotReadyError for reason wrapping err.
func NotReady(reason string, err error) error { return &NotReadyError{Reason: reason, Err: err} }

func (e *NotReadyError) Error() string {
	if e.Err == nil {
		return e.Reason
	}
	return e.Reason + ": " + e.Err.Error()
}

func (e *NotReadyError) Unwrap() error { return e.Err }

// ReadyReason returns the reason word for a readiness error and the fixed message that goes with
// it: the Reason of a *NotReadyError in err's chain, else ReadyReasonUnknown. Neither ever
// contains err's text.
func ReadyReason(err error) (reason, message string) {
	reason = ReadyReasonUnknown
	var nr *NotReadyError
	if errors.As(err, &nr) {
		if _, known := readyMessages[nr.Reason]; known {
			reason = nr.Reason
		}
	}
	return reason, readyMessages[reason]
}

// NotReadyBody fills body, the answer of /readyz, for the readiness error err: ready false, the
// reason word, and the status, error_code and message of an unavailable answer, the message
// fixed by the reason.
func NotReadyBody(body map[string]any, err error) {
	reason, message := ReadyReason(err)
	body["ready"], body["reason"] = false, reason
	body["status"], body["error_code"], body["message"] = "unavailable", job.CodeUnavailable, message
}
