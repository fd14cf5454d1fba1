package gate

import (
	"errors"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/sqldb"
)

// AsUnavailable returns err as the API's 503 unavailable (retryable) when it means the database
// could not be reached or the connection broke, and err unchanged otherwise. Handlers outside
// admission use it so that a database outage reads as an outage, not as an internal error.
func AsUnavailable(err error) error {
	var je *job.Error
	if err == nil || errors.As(err, &je) {
		return err
	}
	if sqldb.ConnectionLost(err) {
		return unavailable(err)
	}
	return err
}
