package integration_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/testdb"
)

// BenchmarkSlotTakeRelease measures a slot's take and release (gate.Admitter.TakeSlot and
// ReleaseSlot: the grant under the claim lock with the counts of jobs and slots, the INSERT with
// its audit row, then the release's lock, audit row, DELETE and poke) one after the other on one
// client, beside the raw two-statement transaction on the same database (SPEC §14: take + release
// p50 at most twice the raw transaction's). One JSON line.
func BenchmarkSlotTakeRelease(b *testing.B) {
	ctx := context.Background()
	for range b.N {
		db := testdb.New(b)
		testdb.SetLimits(b, db.DB, func(c *config.Config) { c.GlobalInFlight, c.TenantInFlight = 64, 64 })
		lim := config.NewCache(db.DB, nil)
		if err := lim.Reload(ctx); err != nil {
			b.Fatal(err)
		}
		adm, err := gate.New(gate.Config{DB: db.DB, Limits: lim})
		if err != nil {
			b.Fatal(err)
		}
		const samples = 300
		raw := rawTx(b, db, samples)
		took := make([]time.Duration, 0, samples)
		released := make([]time.Duration, 0, samples)
		for range samples {
			start := time.Now()
			res, err := adm.TakeSlot(ctx, "bench", gate.SlotRequest{Tenant: "acme"}, nil)
			if err != nil {
				b.Fatal(err)
			}
			mid := time.Now()
			if _, err := adm.ReleaseSlot(ctx, "bench", false, res.Slot.ID); err != nil {
				b.Fatal(err)
			}
			took, released = append(took, mid.Sub(start)), append(released, time.Since(mid))
		}
		t := harness.Percentiles(took, 50, 99)
		l := harness.Percentiles(released, 50, 99)
		r := harness.Percentiles(raw, 50, 99)
		// SPEC §14: taking a slot and releasing one cost one transaction each, so each is set
		// against the raw two-statement transaction.
		harness.Emit("slot_take_release", map[string]any{"samples": samples,
			"take_p50_ms": t[0], "take_p99_ms": t[1], "release_p50_ms": l[0], "release_p99_ms": l[1],
			"raw_two_statement_tx_p50_ms": r[0], "raw_two_statement_tx_p99_ms": r[1],
			"take_over_raw_p50": round2(t[0] / r[0]), "release_over_raw_p50": round2(l[0] / r[0]),
			"target_ratio_p50": 2})
	}
}

// BenchmarkDrainWithSlots drains the same queue twice into fresh databases with caps 64: once
// alone, once beside 8 live slots of another tenant held all along (drainThroughput checks that
// the jobs in flight never exceed the 56 units the slots leave). The slots' own share of the
// capacity is 8/64: the drain should slow by no more than that. One JSON line.
func BenchmarkDrainWithSlots(b *testing.B) {
	const jobs = 5000
	for range b.N {
		none, raw := drainThroughput(b, 64, jobs, 0, false)
		eight, _ := drainThroughput(b, 64, jobs, 8, false)
		r := harness.Percentiles(raw, 50)
		harness.Emit("drain_with_slots", map[string]any{"jobs": jobs, "caps": 64,
			"jobs_per_s_0_slots": int(float64(jobs) / none.el.Seconds()), "jobs_per_s_8_slots": int(float64(jobs) / eight.el.Seconds()),
			"ratio": round2(none.el.Seconds() / eight.el.Seconds()), "slots_share_floor": round2(56.0 / 64),
			"peak_in_flight_0_slots": none.peak, "peak_in_flight_8_slots": eight.peak,
			"raw_two_statement_tx_p50_ms": r[0]})
	}
}
