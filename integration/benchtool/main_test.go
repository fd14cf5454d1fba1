package main

import (
	"bytes"
	"context"
	"math"
	"regexp"
	"strings"
	"testing"
)

const run1 = `ok, some log line
{"bench":"admission_single_http","clients":4,"jobs":3840,"jobs_per_s":900,"ratio":0.3}
{"bench":"admission_single_http","clients":16,"jobs":3840,"jobs_per_s":1800,"ratio":0.6}
{"bench":"pickup_latency","samples":200,"one_process_p50_ms":4.5}
`

const run2 = `{"bench":"admission_single_http","clients":4,"jobs":3840,"jobs_per_s":1100,"ratio":0.4}
{"bench":"admission_single_http","clients":16,"jobs":3840,"jobs_per_s":1700,"ratio":0.5}
{"bench":"pickup_latency","samples":200,"one_process_p50_ms":3.5}
`

// TestFiguresGroupByIdentity: lines of one bench with other identity values are other figures;
// the measured fields are the rest.
func TestFiguresGroupByIdentity(t *testing.T) {
	figs, err := parseFigures(strings.NewReader(run1))
	if err != nil || len(figs) != 3 {
		t.Fatalf("%d figures (%v), want 3", len(figs), err)
	}
	if k := keyOf(figs[0].identity()); k != "admission_single_http clients=4 jobs=3840" {
		t.Errorf("key %q", k)
	}
	if m := figs[0].metrics(); len(m) != 2 || m["jobs_per_s"] != 900 {
		t.Errorf("metrics %v, want jobs_per_s and ratio", m)
	}
	stated, _ := parseFigures(strings.NewReader(`{"bench":"x","take_over_raw_p50":1.5,"target_ratio":2}`))
	if m := stated[0].metrics(); len(m) != 1 || !lowerIsBetter("take_over_raw_p50") || lowerIsBetter("jobs_per_s") {
		t.Errorf("metrics %v: a stated target is no measure, and a time over its raw limit is better lower", m)
	}
	nested, _ := parseFigures(strings.NewReader(`{"bench":"x","jobs_per_s":9,"server_work_per_job":{"server_cpu_us":30.5,"note":"n"}}`))
	if m := nested[0].metrics(); len(m) != 2 || m["server_work_per_job.server_cpu_us"] != 30.5 ||
		!lowerIsBetter("server_work_per_job.server_cpu_us") {
		t.Errorf("metrics %v: an object's numbers are metrics one level down, and work is better lower", m)
	}
	if _, err := parseFigures(strings.NewReader(`{"bench": nope}`)); err == nil {
		t.Error("a broken line was accepted")
	}
}

// twoRounds records two alternated rounds of base's and head's output: base, head, head, base.
func twoRounds(base, head string) *rounds {
	r := newRounds()
	for i, out := range []string{base, head, head, base} {
		figs, _ := parseFigures(strings.NewReader(out))
		r.add(i == 0 || i == 3, figs)
	}
	return r
}

// reportHas prints r's report of the metrics fields matches, checks that it holds every line of
// wants, and returns it.
func reportHas(t *testing.T, r *rounds, fields string, wants ...string) string {
	t.Helper()
	var b bytes.Buffer
	r.report(&b, regexp.MustCompile(fields))
	out := b.String()
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	return out
}

// TestReportMediansAndLosses: medians over rounds, head/base, and the rounds the head lost in,
// a latency's loss being a higher value.
func TestReportMediansAndLosses(t *testing.T) {
	r := twoRounds(run1, run2)
	out := reportHas(t, r, `jobs_per_s$|_ms$`,
		"admission_single_http clients=4 jobs=3840   jobs_per_s          900          1100         1.222      0/2 rounds",
		"admission_single_http clients=16 jobs=3840  jobs_per_s          1800         1700         0.944      2/2 rounds",
		"pickup_latency samples=200                  one_process_p50_ms  4.500        3.500        0.778      0/2 rounds")
	if strings.Contains(out, "ratio") {
		t.Errorf("a metric outside -fields was printed:\n%s", out)
	}
	if median([]float64{3, 1, 2, 10}) != 2.5 {
		t.Error("median of an even count")
	}
}

// TestPairAcrossIdentities: a benchmark that gained an identity field since the base build (the
// drain's tenants=64) is still compared figure for figure; where the new field tells two head
// figures apart, neither is paired with the base's one.
func TestPairAcrossIdentities(t *testing.T) {
	const base = `{"bench":"drain_throughput","caps":64,"jobs":20000,"jobs_per_s":2000}
{"bench":"pickup_latency","samples":300,"one_process_p50_ms":3}
{"bench":"split","jobs":10,"jobs_per_s":5}
`
	const head = `{"bench":"drain_throughput","caps":64,"jobs":20000,"tenants":64,"jobs_per_s":2500}
{"bench":"pickup_latency","samples":300,"one_process_p50_ms":2}
{"bench":"split","jobs":10,"tenants":1,"jobs_per_s":6}
{"bench":"split","jobs":10,"tenants":2,"jobs_per_s":7}
`
	r := twoRounds(base, head)
	notes := r.pairAcrossIdentities()
	if len(notes) != 1 || !strings.Contains(notes[0], `"drain_throughput caps=64 jobs=20000 tenants=64"`) {
		t.Fatalf("pairings %q, want the drain's alone", notes)
	}
	out := reportHas(t, r, `jobs_per_s$`,
		"drain_throughput caps=64 jobs=20000 tenants=64  jobs_per_s  2000         2500         1.250      0/2 rounds",
		"split jobs=10                                   jobs_per_s  5.000        -            -          0/0 rounds",
		"split jobs=10 tenants=1                         jobs_per_s  -            6.000        -          0/0 rounds")
	if strings.Contains(out, "drain_throughput caps=64 jobs=20000  ") {
		t.Errorf("the base's drain figure is still printed on its own:\n%s", out)
	}
}

// TestPeersPairing: a sluice figure beside the peer figure of the same run, the ratio, and the
// target; a side that is missing is said.
func TestPeersPairing(t *testing.T) {
	figs, _ := parseFigures(strings.NewReader(`{"bench":"drain_throughput","jobs":20000,"jobs_per_s":3000,"all_procs_jobs_per_s":3300}
{"bench":"pickup_latency","one_process_p50_ms":3,"one_process_from_answer_p50_ms":2.4,"one_process_p99_ms":8}`))
	lines, err := parsePeers(strings.NewReader(`== river
{"prog":"river","measure":"drain","settings":"defaults","jobs_per_s":5000}
{"prog":"river","measure":"drain","settings":"fast(FetchCooldown=1ms)","jobs_per_s":12000}
{"prog":"river","measure":"pickup","settings":"fast-notify(FetchCooldown=1ms)","p50_ms":9,"p99_ms":9}
{"prog":"river","measure":"pickup","settings":"fastest(FetchCooldown=1ms,FetchPollInterval=1ms)","p50_ms":1.5,"p99_ms":3}`))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	reportPeers(&b, figs, lines)
	out := b.String()
	for _, want := range []string{
		"drain, caps 64, one P", "3000", "river drain (fast)", "12000", "0.250", "≥ 0.600",
		"pickup p50 (sluice from the admission's answer", "2.400", "1.600", "≤ 2.000",
		"batch admission", "no sluice figure admission_batch_http.jobs_per_s",
		"against Asynq", "no peer figure",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

func TestCompareNamesABadRevision(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-base", "no-such-revision"}, "-base"},
		{[]string{"-base", "HEAD", "-head", "no-such-revision"}, "-head"},
	} {
		var stdout, stderr strings.Builder
		err := compare(context.Background(), tc.args, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "no-such-revision") {
			t.Errorf("compare %q: got %v, want an error naming %s and the revision", tc.args, err, tc.want)
		}
	}
}

// TestSignTest: the chance of a head no different from base losing at least k of n rounds, and
// the report's line on how many figures lose that often by chance.
func TestSignTest(t *testing.T) {
	for _, tc := range []struct {
		worse, n int
		want     float64
	}{
		{0, 8, 1}, {8, 8, 1.0 / 256}, {7, 8, 9.0 / 256}, {6, 8, 37.0 / 256}, {1, 2, 0.75}, {3, 5, 0.5},
	} {
		if got := signTest(tc.worse, tc.n); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("signTest(%d, %d) = %v, want %v", tc.worse, tc.n, got, tc.want)
		}
	}
	r := twoRounds(run1, run2)
	reportHas(t, r, `jobs_per_s$|_ms$`,
		"0/2 rounds     1.000",
		"2/2 rounds     0.250",
		"of these 3 figure(s), about 0.75 lose in 2 or more of 2 rounds by chance alone")
	r = newRounds()
	for i := 0; i < 8; i++ {
		r.add(true, []figure{{"bench": "x", "jobs_per_s": 100.0}})
		v := 90.0
		if i == 0 {
			v = 110
		}
		r.add(false, []figure{{"bench": "x", "jobs_per_s": v}})
	}
	reportHas(t, r, "", "7/8 rounds     0.035", "of these 1 figure(s), about 0.04 lose in 7 or more of 8 rounds")
}

// TestDefaultFieldsNameEveryFigure: compare's default prints the rates and ratios of every
// benchmark's lines, those named for a variant included, and leaves out the counts beside them.
func TestDefaultFieldsNameEveryFigure(t *testing.T) {
	re := regexp.MustCompile(defaultFields)
	for _, m := range []string{"jobs_per_s", "audit_off_jobs_per_s", "jobs_per_s_6400_tenants", "jobs_per_s_100000_tenants",
		"ratio_6400", "ratio_100000", "audit_ratio", "ratio_to_raw_drain", "one_process_p50_ms", "tenants_64_p99_ms"} {
		if !re.MatchString(m) {
			t.Errorf("the default fields leave out %s", m)
		}
	}
	for _, m := range []string{"peak_in_flight", "seconds", "raw_two_statement_tx_p90_ms"} {
		if re.MatchString(m) {
			t.Errorf("the default fields print %s", m)
		}
	}
}
