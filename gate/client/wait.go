package client

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/gate/job"
)

// maxWaitStep is the longest wait one request asks for (SPEC §6: at most 60 s).
const maxWaitStep = 60 * time.Second

// Wait returns job id once it is terminal, waiting on the server (GET /v1/jobs/{id}?wait=) in
// requests of up to a minute, each shorter than the client's own HTTP timeout. It ends with
// ctx's error (and the job as last read) when ctx ends first. A 503 busy (too many requests
// waiting) is retried after its Retry-After.
func (c *Client) Wait(ctx context.Context, id int64) (job.Job, error) {
	var j job.Job
	for {
		step := maxWaitStep
		if c.HTTP != nil && c.HTTP.Timeout > 0 {
			step = min(step, c.HTTP.Timeout-5*time.Second)
		}
		if dl, ok := ctx.Deadline(); ok {
			// A tenth short of the deadline, so that the answer arrives before ctx ends.
			left := time.Until(dl)
			step = min(step, left-left/10)
		}
		// A client timeout of 5 s or less leaves no room above: wait half of it instead.
		if step <= 0 && c.HTTP != nil && c.HTTP.Timeout > 0 {
			step = c.HTTP.Timeout / 2
		}
		step = max(step, 0)
		path := "/v1/jobs/" + strconv.FormatInt(id, 10) + "?wait=" + strconv.FormatFloat(step.Seconds(), 'f', 3, 64)
		var got job.Job
		_, err := c.Do(ctx, http.MethodGet, path, nil, &got)
		var e *Error
		switch {
		case err == nil:
			j = got
			if j.Status.Terminal() {
				return j, nil
			}
		case errors.As(err, &e) && e.Code == job.CodeBusy:
			t := time.NewTimer(time.Duration(max(e.RetryAfter, 1)) * time.Second)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		case ctx.Err() == nil:
			return j, err
		}
		if ctx.Err() != nil {
			return j, ctx.Err()
		}
	}
}
