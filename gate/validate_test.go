package gate

import (
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
)

// FuzzDecodeRequest: the admission decoder and validator never panic, refuse with
// invalid_request naming a field or payload_too_large, and whatever they accept satisfies the
// documented rules. Seeds are in testdata/fuzz/FuzzDecodeRequest.
func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"tenant":"acme","rate_key":"k","payload":{"a":[1,2]},"idempotency_key":"i","queue":false}`))
	f.Add([]byte(`{"tenant":"a.b*c > d"}`))
	f.Add([]byte("{\"tenant\":\"\xff\"}"))
	f.Add([]byte(`{"tenant":1}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"tenant":"acme","lanes":["gpu","search","gpu"],"interactive":true}`))
	f.Add([]byte(`{"tenant":"acme","lanes":"gpu"}`))
	f.Add([]byte(`{"tenant":"acme","lanes":[""]}`))
	f.Add([]byte(`{"tenant":"acme","lanes":["a,b"],"interactive":1}`))
	f.Add([]byte(`{"tenant":"acme","run_at":"2026-12-06T12:00:00.5Z"}`))
	f.Add([]byte(`{"tenant":"acme","delay_seconds":1.5,"queue":false}`))
	f.Add([]byte(`{"tenant":"acme","start_by":"2026-12-06T12:00:00Z","refuse_if_late":true}`))
	f.Add([]byte(`{"tenant":"acme","replace_key":"repo-1","queue":false}`))
	const maxPayload = 1024
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := DecodeRequest(data)
		if err == nil {
			err = req.Validate(maxPayload)
		}
		if err != nil {
			code := job.ErrorCode(err)
			if code != job.CodeInvalidRequest && code != job.CodePayloadTooLarge {
				t.Fatalf("refusal with code %s: %v", code, err)
			}
			je := err.(*job.Error)
			if field, _ := je.Detail["field"].(string); field == "" || je.Message == "" {
				t.Fatalf("refusal without field or message: %+v", je)
			}
			return
		}
		if req.Tenant == "" || req.Tenant == "*" || len(req.Tenant) > MaxTenantBytes || !utf8.ValidString(req.Tenant) ||
			strings.ContainsFunc(req.Tenant, func(r rune) bool { return r < 0x20 || (r >= 0x7f && r < 0xa0) || unicode.Is(unicode.Cf, r) }) {
			t.Fatalf("accepted tenant %q", req.Tenant)
		}
		if req.RateKey != nil && (len(*req.RateKey) == 0 || len(*req.RateKey) > MaxRateKeyBytes) {
			t.Fatalf("accepted rate key of %d bytes", len(*req.RateKey))
		}
		if len(req.Payload) > maxPayload {
			t.Fatalf("accepted payload of %d bytes", len(req.Payload))
		}
		if !utf8.Valid(data) {
			t.Fatalf("accepted invalid UTF-8 %q", data)
		}
		if len(req.Lanes) > MaxLanes {
			t.Fatalf("accepted %d lanes", len(req.Lanes))
		}
		for i, l := range req.Lanes {
			if l == "" || strings.Contains(l, ",") || len(l) > config.MaxNameBytes || (i > 0 && l <= req.Lanes[i-1]) {
				t.Fatalf("accepted lanes %q (not sorted, distinct lane names)", req.Lanes)
			}
		}
		if req.RunAt != nil && req.DelaySeconds != nil {
			t.Fatal("accepted both run_at and delay_seconds")
		}
		if d := req.due(time.Now()); !d.IsZero() && (d.Before(time.Now()) || d.After(time.Now().Add(MaxSchedule+time.Minute))) {
			t.Fatalf("accepted a schedule due at %v", d)
		}
		if req.ReplaceKey != nil && (*req.ReplaceKey == "" || len(*req.ReplaceKey) > MaxReplaceKeyBytes || (req.Queue != nil && !*req.Queue)) {
			t.Fatalf("accepted replace_key %q with queue %v", *req.ReplaceKey, req.Queue)
		}
		if len(req.fingerprint()) != 32 {
			t.Fatal("fingerprint is not a SHA-256")
		}
	})
}

func TestDecodeRequestNamesTheField(t *testing.T) {
	for body, field := range map[string]string{
		`{"tenant": 5}`:                                "tenant",
		`{"tenant": "a", "queue": "yes"}`:              "queue",
		`{"tenant": "a", "rate_key": [1]}`:             "rate_key",
		`{"tenant": "a", "idempotency_key": 1}`:        "idempotency_key",
		`{"tenant": "a", "lanes": "gpu"}`:              "lanes",
		`{"tenant": "a", "lanes": [1]}`:                "lanes",
		`{"tenant": "a", "interactive": "yes"}`:        "interactive",
		`{"tenant": "a", "run_at": 5}`:                 "run_at",
		`{"tenant": "a", "delay_seconds": "5"}`:        "delay_seconds",
		`{"tenant": "a", "replace_key": 5}`:            "replace_key",
		"{\"tenant\": \"a\", \"rate_key\": \"\xfe\"}":  "rate_key",
		"{\"tenant\": \"a\", \"payload\": [\"\xfe\"]}": "payload",
		`{"tenant": "a",}`:                             "body",
		`"just a string"`:                              "body",
	} {
		_, err := DecodeRequest([]byte(body))
		je, ok := err.(*job.Error)
		if !ok || je.Code != job.CodeInvalidRequest || je.Detail["field"] != field {
			t.Errorf("%s: %v, want invalid_request naming %s", body, err, field)
		}
	}
	req, err := DecodeRequest([]byte(`{"tenant": "a", "unknown": {"x": 1}, "payload": 7}`))
	if err != nil || req.Tenant != "a" || string(req.Payload) != "7" {
		t.Errorf("unknown field: %+v %v", req, err)
	}
}

func TestFingerprintIgnoresPayloadFormatting(t *testing.T) {
	a, _ := DecodeRequest([]byte(`{"tenant":"t","payload":{"a":1, "b":[1, 2]}}`))
	b, _ := DecodeRequest([]byte(`{"payload":{"a":1,"b":[1,2]},"tenant":"t"}`))
	c, _ := DecodeRequest([]byte(`{"tenant":"t","payload":{"a":2,"b":[1,2]}}`))
	if string(a.fingerprint()) != string(b.fingerprint()) || string(a.fingerprint()) == string(c.fingerprint()) {
		t.Error("fingerprints: formatting must not matter, content must")
	}
}

func TestImmediateRetryAfter(t *testing.T) {
	cases := []struct {
		name     string
		global   int
		tenant   int
		st       func(*state)
		gatedFor int
		scope    string
		after    int
		paused   bool
		unit     config.Unit
		cfg      func(*config.Config)
	}{
		{"free", 4, 2, func(*state) {}, 0, "", 0, false, config.Unit{}, nil},
		{"one ahead", 4, 2, func(s *state) { s.tenantDepth["t"] = 1 }, 0, "tenant", 10, false, config.Unit{}, nil},
		{"many ahead", 4, 2, func(s *state) { s.tenantDepth["t"] = 40 }, 0, "tenant", 30, false, config.Unit{}, nil},
		{"tenant full", 4, 2, func(s *state) { busy(s, "t", 2) }, 0, "tenant", 5, false, config.Unit{}, nil},
		{"global full", 4, 2, func(s *state) { busy(s, "o", 4); s.globalDepth = 2 }, 0, "global", 15, false, config.Unit{}, nil},
		{"fullest scope wins", 4, 2, func(s *state) { busy(s, "o", 4); s.globalDepth, s.tenantDepth["t"] = 9, 1 }, 0, "global", 30, false, config.Unit{}, nil},
		{"lane full", 4, 2, func(s *state) {
			s.usage.Add(config.Default(), config.Unit{Tenant: "o", Lanes: []string{"gpu"}}, 1)
			s.globalDepth = 3
		}, 0, "lane:gpu", 20, false, config.Unit{Tenant: "t", Lanes: []string{"gpu"}}, func(c *config.Config) { c.Lanes = map[string]int{"gpu": 1} }},
		{"lane paused", 4, 2, func(*state) {}, 0, "lane:gpu", 120, true, config.Unit{Tenant: "t", Lanes: []string{"gpu"}},
			func(c *config.Config) { c.Lanes = map[string]int{"gpu": 0} }},
		{"tier full", 4, 2, func(s *state) { busy(s, "o", 1) }, 0, "tier", 5, false, config.Unit{},
			func(c *config.Config) { c.TierInFlight = map[string]int{"default": 1} }},
		{"reserve", 4, 2, func(s *state) { busy(s, "o", 3) }, 0, "reserve", 5, false, config.Unit{},
			func(c *config.Config) { c.InteractiveReserve = 1 }},
		{"interactive takes the reserve", 4, 2, func(s *state) { busy(s, "o", 3) }, 0, "", 0, false, config.Unit{Tenant: "t", Interactive: true},
			func(c *config.Config) { c.InteractiveReserve = 1 }},
		{"interactive goes before plain queued jobs", 4, 2, func(s *state) { s.tenantDepth["t"] = 3 }, 0, "", 0, false,
			config.Unit{Tenant: "t", Interactive: true}, nil},
		{"interactive behind interactive", 4, 2, func(s *state) { s.tenantDepth["t"], s.tenantInteractive["t"] = 3, 1 }, 0, "tenant", 10, false,
			config.Unit{Tenant: "t", Interactive: true}, nil},
		{"paused", 0, 2, func(*state) {}, 0, "global", 120, true, config.Unit{}, nil},
		{"tenant paused", 4, 0, func(*state) {}, 0, "tenant", 120, true, config.Unit{}, nil},
		{"gated", 4, 2, func(*state) {}, 77, "rate_key", 77, false, config.Unit{}, nil},
		{"gated longer than queue", 4, 2, func(s *state) { s.tenantDepth["t"] = 1 }, 12, "rate_key", 12, false, config.Unit{}, nil},
	}
	for _, c := range cases {
		st := newState()
		c.st(st)
		l := defaultLimits()
		l.GlobalInFlight, l.TenantInFlight = c.global, c.tenant
		if c.cfg != nil {
			c.cfg(l)
		}
		if c.unit.Tenant == "" {
			c.unit.Tenant = "t"
		}
		scope, err := immediate(l.Check(st.usage, c.unit), c.unit, st, c.gatedFor)
		if scope != c.scope {
			t.Errorf("%s: scope %q, want %q", c.name, scope, c.scope)
		}
		if c.scope == "" {
			if err != nil {
				t.Errorf("%s: %v, want admitted", c.name, err)
			}
			continue
		}
		je, ok := err.(*job.Error)
		if !ok || je.Code != job.CodeCapacityExceeded || je.Detail["scope"] != c.scope || je.Detail["retry_after"] != c.after || je.Detail["paused"] != c.paused {
			t.Errorf("%s: %v %v, want %s %d paused=%v", c.name, err, je.Detail, c.scope, c.after, c.paused)
		}
	}
}

func defaultLimits() *config.Config {
	c := config.Default()
	return &c
}

// TestValidSchedule: run_at or delay_seconds, one of them, in range, never with queue=false; the
// due time is the run_at or the admission's time plus the delay, or none once it has passed; and
// a schedule is part of the request an idempotency key stands for.
func TestValidSchedule(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for body, field := range map[string]string{
		`{"tenant":"a","run_at":"2026-12-06T13:00:00Z","delay_seconds":5}`: "run_at",
		`{"tenant":"a","run_at":"tomorrow"}`:                               "run_at",
		`{"tenant":"a","run_at":"2026-12-06 13:00:00"}`:                    "run_at",
		`{"tenant":"a","run_at":"2027-12-07T12:00:00Z"}`:                   "run_at",
		`{"tenant":"a","delay_seconds":-1}`:                                "delay_seconds",
		`{"tenant":"a","delay_seconds":31536001}`:                          "delay_seconds",
		`{"tenant":"a","delay_seconds":5,"queue":false}`:                   "queue",
	} {
		req, err := DecodeRequest([]byte(body))
		if err == nil {
			err = req.validSchedule(now)
		}
		if je, ok := err.(*job.Error); !ok || je.Code != job.CodeInvalidRequest || je.Detail["field"] != field {
			t.Errorf("%s: %v; want invalid_request naming %s", body, err, field)
		}
	}
	for body, want := range map[string]time.Time{
		`{"tenant":"a"}`: {},
		`{"tenant":"a","run_at":"2026-12-06T13:00:00.1234567+01:00"}`: now.Add(123456 * time.Microsecond), // UTC, to the microsecond
		`{"tenant":"a","run_at":"2026-12-06T11:00:00Z"}`:              {},                                 // passed: due now
		`{"tenant":"a","delay_seconds":90.5}`:                         now.Add(90500 * time.Millisecond),
		`{"tenant":"a","delay_seconds":0}`:                            {},
		`{"tenant":"a","run_at":"2027-12-06T11:59:00Z"}`:              now.Add(MaxSchedule - time.Minute),
	} {
		req, err := DecodeRequest([]byte(body))
		if err == nil {
			err = req.validSchedule(now)
		}
		if err != nil {
			t.Errorf("%s: %v", body, err)
			continue
		}
		if got := req.due(now); !got.Equal(want) {
			t.Errorf("%s: due %v; want %v", body, got, want)
		}
	}
	plain, _ := DecodeRequest([]byte(`{"tenant":"a"}`))
	later, _ := DecodeRequest([]byte(`{"tenant":"a","delay_seconds":60}`))
	at, _ := DecodeRequest([]byte(`{"tenant":"a","run_at":"2026-12-06T13:00:00Z"}`))
	if string(plain.fingerprint()) == string(later.fingerprint()) || string(later.fingerprint()) == string(at.fingerprint()) {
		t.Error("a schedule must change the request's fingerprint")
	}
}

// TestValidDeadline: start_by in RFC 3339 and within a year; refuse_if_late only with a start_by;
// both are part of the fingerprint.
func TestValidDeadline(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for body, field := range map[string]string{
		`{"tenant":"a","start_by":"soon"}`:                 "start_by",
		`{"tenant":"a","start_by":"2028-01-01T00:00:00Z"}`: "start_by",
		`{"tenant":"a","refuse_if_late":true}`:             "refuse_if_late",
		`{"tenant":"a","start_by":7}`:                      "start_by",
		`{"tenant":"a","refuse_if_late":"yes"}`:            "refuse_if_late",
	} {
		req, err := DecodeRequest([]byte(body))
		if err == nil {
			err = req.validDeadline(now)
		}
		if je, ok := err.(*job.Error); !ok || je.Code != job.CodeInvalidRequest || je.Detail["field"] != field {
			t.Errorf("%s: %v; want invalid_request naming %s", body, err, field)
		}
	}
	ok, _ := DecodeRequest([]byte(`{"tenant":"a","start_by":"2026-12-06T13:00:00.5+01:00","refuse_if_late":true}`))
	if err := ok.validDeadline(now); err != nil {
		t.Fatal(err)
	}
	if got := ok.startBy(); got == nil || !got.Equal(now.Add(500*time.Millisecond)) {
		t.Fatalf("startBy() = %v", got)
	}
	plain, _ := DecodeRequest([]byte(`{"tenant":"a","start_by":"2026-12-06T13:00:00.5+01:00"}`))
	if string(plain.fingerprint()) == string(ok.fingerprint()) {
		t.Error("refuse_if_late must change the fingerprint")
	}
	if none, _ := DecodeRequest([]byte(`{"tenant":"a"}`)); none.startBy() != nil || string(none.fingerprint()) == string(plain.fingerprint()) {
		t.Error("a start_by must change the fingerprint, and none is nil")
	}
}

func TestReplaceKeyFingerprint(t *testing.T) {
	a, _ := DecodeRequest([]byte(`{"tenant":"t","replace_key":"r1"}`))
	b, _ := DecodeRequest([]byte(`{"tenant":"t","replace_key":"r2"}`))
	c, _ := DecodeRequest([]byte(`{"tenant":"t"}`))
	if string(a.fingerprint()) == string(b.fingerprint()) || string(a.fingerprint()) == string(c.fingerprint()) {
		t.Error("a replace key must change the fingerprint")
	}
	key := "\xff"
	bad := Request{Tenant: "t", ReplaceKey: &key}
	if je, ok := bad.Validate(1024).(*job.Error); !ok || je.Detail["field"] != "replace_key" {
		t.Errorf("a replace key that is not UTF-8: %v; want invalid_request on replace_key", je)
	}
}
