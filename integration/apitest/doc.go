// Package apitest builds a test's front door: the admission API that `sluice serve` runs
// (gate.Admitter and api.Server), over a database of the test's own, with a client for each
// role, so that a test drives it over HTTP, sets the runtime config, injects faults and reads
// the log and metrics.
//
// In River's style, one call sets up the whole environment and returns it as a bundle:
//
//	f := apitest.Setup(t, apitest.Options{})
//	r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": "acme"})
//	id := apitest.JobID(t, r.Body)
//
// SetupOn starts a second front door on the same database (another process, or the same one
// with other options); DBThroughCutter puts a proxy between a front door and its database that
// cuts a COMMIT or takes the database away.
package apitest
