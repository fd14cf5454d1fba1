package integration_test

import (
	"context"
	"math/rand"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/integration/harness"
)

// receipt is a dispatch's arrival at the executor, timed there.
type receipt struct {
	id int64
	at time.Time
}

// measurePickup admits n jobs one at a time into an idle sluice and returns, for each, the time
// from the producer starting POST /v1/jobs to the executor receiving the dispatch (SPEC §14).
// With admit, it also records each admission's answer time, and with fromAnswer the time from
// the producer having its answer to the executor's receipt (issue 31's pickup figure; negative
// when the dispatch arrived first).
func measurePickup(b *testing.B, env *harness.Env, got chan receipt, n int, admit, fromAnswer *[]time.Duration, pace func() time.Duration) []time.Duration {
	out := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		if pace != nil {
			// Arrival pacing of the load generator (not synchronisation): producers arrive at
			// random moments, not in step with the drainer's poll.
			<-time.After(pace())
		}
		start := time.Now()
		r := env.Do(b, http.MethodPost, "/v1/jobs", harness.ProducerToken, map[string]any{"tenant": "pickup"})
		answered := time.Now()
		if admit != nil {
			*admit = append(*admit, answered.Sub(start))
		}
		if r.Status != http.StatusAccepted {
			b.Fatalf("admit: HTTP %d %s", r.Status, r.Raw)
		}
		id := int64(r.Body["id"].(float64))
		for {
			select {
			case rc := <-got:
				if rc.id != id {
					continue
				}
				out = append(out, rc.at.Sub(start))
				if fromAnswer != nil {
					*fromAnswer = append(*fromAnswer, rc.at.Sub(answered))
				}
			case <-time.After(10 * time.Second):
				b.Fatalf("job %d was not dispatched within 10 s", id)
			}
			break
		}
		// Let the job finish so that every sample starts from an idle drainer.
		harness.WaitFor(b, 10*time.Second, "the job to finish", func() (bool, error) {
			return readJobB(b, env, id) == "succeeded", nil
		})
	}
	return out
}

func readJobB(b *testing.B, env *harness.Env, id int64) string {
	var s string
	if err := env.DB.QueryRow("SELECT status FROM jobs WHERE id = ?", id).Scan(&s); err != nil {
		b.Fatal(err)
	}
	return s
}

// pickupEnv starts a sluice with the roles of o whose executor reports each receipt on the
// returned channel.
func pickupEnv(b *testing.B, o harness.Options) (*harness.Env, chan receipt) {
	got := make(chan receipt, 16)
	o.OnReceive = func(id int64, _ string, at time.Time) {
		select {
		case got <- receipt{id, at}:
		default:
		}
	}
	return harness.Start(b, o), got
}

// BenchmarkPickupLatency measures pickup latency with pokes in both deployments, beside a raw
// JetStream publish with acknowledgement and the raw two-statement transaction in the same run,
// and then with the broker stopped (the 1 Hz poll alone). One process runs every role, as
// `sluice serve` does by default: the API wakes its own drainer when it commits a job. With split
// roles (API and relay in one process, the drainer in another) the drainer hears of the job by
// the broker's poke, and with the broker down only by its poll.
func BenchmarkPickupLatency(b *testing.B) {
	const n = 300
	one, oneGot := pickupEnv(b, harness.Options{})
	// Warm the connection pools before measuring.
	measurePickup(b, one, oneGot, 20, nil, nil, nil)
	var admit, fromAnswer []time.Duration
	oneProcess := measurePickup(b, one, oneGot, n, &admit, &fromAnswer, nil)

	env, got := pickupEnv(b, harness.Options{API: true, Relay: true})
	env.StartApp(b, harness.Options{Drainer: true})
	measurePickup(b, env, got, 20, nil, nil, nil)
	split := measurePickup(b, env, got, n, nil, nil, nil)

	nc, err := nats.Connect(env.NATS.URL())
	if err != nil {
		b.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var rawPub []time.Duration
	for i := 0; i < n; i++ {
		start := time.Now()
		if _, err := js.Publish(ctx, "sluice.bench.raw", []byte("x")); err != nil {
			b.Fatal(err)
		}
		rawPub = append(rawPub, time.Since(start))
	}
	nc.Close()
	raw := rawTx(b, env.DB, n)

	env.NATS.Stop()
	rng := rand.New(rand.NewSource(1))
	pollOnly := measurePickup(b, env, got, 30, nil, nil, func() time.Duration {
		return time.Duration(rng.Int63n(int64(time.Second)))
	})

	p := harness.Percentiles(oneProcess, 50, 99)
	s := harness.Percentiles(split, 50, 99)
	q := harness.Percentiles(pollOnly, 50, 100)
	j := harness.Percentiles(rawPub, 50)
	r := harness.Percentiles(raw, 50)
	a := harness.Percentiles(admit, 50)
	f := harness.Percentiles(fromAnswer, 50, 99)
	harness.Emit("pickup_latency", map[string]any{
		"samples": n, "admission_response_p50_ms": a[0],
		"one_process_from_answer_p50_ms": f[0], "one_process_from_answer_p99_ms": f[1],
		"one_process_p50_ms": p[0], "one_process_p99_ms": p[1],
		"split_roles_p50_ms": s[0], "split_roles_p99_ms": s[1],
		"raw_jetstream_publish_ack_p50_ms": j[0], "raw_two_statement_tx_p50_ms": r[0],
		"one_process_p50_over_raw_tx_p50": round2(p[0] / r[0]),
		"broker_down_samples":             len(pollOnly), "broker_down_p50_ms": q[0], "broker_down_max_ms": q[1],
	})
}
