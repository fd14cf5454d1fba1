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
	"github.com/sluicehq/sluice/gate/sqldb"
)

// Simulator is the API's POST /v1/config/simulate (api.Config.Simulate) on db: the audit trail's
// window from since to until replayed under the runtime configuration in force and under it with
// changes, with the drainer's default claim batch and the pickup delays measured on the window
// (simulate.Calibrate). It reads db a
// page at a time, each read a statement of its own, so it holds no transaction open, and ctx
// bounds every read.
func Simulator(db sqldb.DB) api.SimulateFunc {
	return func(ctx context.Context, changes map[string]json.RawMessage, since, until time.Time) (*api.Simulation, error) {
		return simulateRecorded(ctx, db, changes, since, until)
	}
}

func simulateRecorded(ctx context.Context, db sqldb.DB, changes map[string]json.RawMessage, since, until time.Time) (*api.Simulation, error) {
	arrival, outcome, _, err := simulate.Calibrate(ctx, db, since, until)
	if err != nil {
		return nil, err
	}
	cmp, err := simulate.RunRecorded(ctx, db, since, until, changes, simulate.Options{ArrivalPickup: arrival, OutcomePickup: outcome}, nil)
	if errors.Is(err, simulate.ErrNoArrivals) {
		return nil, fmt.Errorf("%w: %w", api.ErrNoArrivals, err)
	}
	if err != nil {
		return nil, err
	}
	var js, table bytes.Buffer
	if err := cmp.WriteJSON(&js, api.SimulateTop); err != nil {
		return nil, fmt.Errorf("simulate: encode the comparison: %w", err)
	}
	if err := cmp.WriteTable(&table, api.SimulateTop); err != nil {
		return nil, fmt.Errorf("simulate: write the table: %w", err)
	}
	return &api.Simulation{Comparison: js.Bytes(), Table: table.String()}, nil
}
