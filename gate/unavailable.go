package gate

import (
	"errors"

	"github.com/sluicehq/sluice/gate/job"
)

// AsUnavailable returns err as the API's 503 unavailable (retryable) when it means the database
// could not be reached or the connection broke, and err unchanged otherwise. Handlers outside
// admission use it so that a database outage reads as an outage, not as an internal error.
func AsUnavailable(err error) error {
	var je *job.Error
	if err == nil || errors.As(err, &je) {
		return err
	}
	if connectionLost(err) {
		return unavailable(err)
	}
	return err
}

// ConnectionLost reports whether err means the database could not be reached or the connection
// broke, as opposed to the server refusing a statement. After a failed COMMIT it means the
// transaction's outcome is unknown.
func ConnectionLost(err error) bool { return connectionLost(err) }
