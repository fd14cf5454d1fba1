package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/drainer/simulate"
	"github.com/sluicehq/sluice/gate/api"
)

// simulate is the API's POST /v1/config/simulate (api.Config.Simulate): the audit trail's window
// from since to until replayed under the runtime configuration in force and under it with
// changes, with the drainer's default claim batch (the one this process's drainer uses). It reads
// the app's pool a page at a time, each read a statement of its own, so it holds no transaction
// open, and ctx bounds every read.
func (a *App) simulate(ctx context.Context, changes map[string]json.RawMessage, since, until time.Time) (*api.Simulation, error) {
	cmp, err := simulate.RunRecorded(ctx, a.db, since, until, changes,
		simulate.Options{ArrivalPickup: simulate.DefaultArrivalPickup, OutcomePickup: simulate.DefaultOutcomePickup}, nil)
	if errors.Is(err, simulate.ErrNoArrivals) {
		return nil, fmt.Errorf("%w: %w", api.ErrNoArrivals, err)
	}
	if err != nil {
		return nil, err
	}
	var js, table bytes.Buffer
	if err := cmp.WriteJSON(&js); err != nil {
		return nil, fmt.Errorf("simulate: encode the comparison: %w", err)
	}
	if err := cmp.WriteTable(&table, api.SimulateTop); err != nil {
		return nil, fmt.Errorf("simulate: write the table: %w", err)
	}
	return &api.Simulation{Comparison: js.Bytes(), Table: table.String()}, nil
}
