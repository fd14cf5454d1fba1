package gate

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/limits"
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
			if l == "" || strings.Contains(l, ",") || len(l) > limits.MaxNameBytes || (i > 0 && l <= req.Lanes[i-1]) {
				t.Fatalf("accepted lanes %q (not sorted, distinct lane names)", req.Lanes)
			}
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
	base := func() *state {
		return &state{tenantDepth: map[string]int{}, tenantInFlight: map[string]int{}}
	}
	cases := []struct {
		name     string
		global   int
		tenant   int
		st       func(*state)
		gatedFor int
		scope    string
		after    int
		paused   bool
	}{
		{"free", 4, 2, func(*state) {}, 0, "", 0, false},
		{"one ahead", 4, 2, func(s *state) { s.tenantDepth["t"] = 1 }, 0, "tenant", 10, false},
		{"many ahead", 4, 2, func(s *state) { s.tenantDepth["t"] = 40 }, 0, "tenant", 30, false},
		{"tenant full", 4, 2, func(s *state) { s.tenantInFlight["t"] = 2 }, 0, "tenant", 5, false},
		{"global full", 4, 2, func(s *state) { s.globalInFlight, s.globalDepth = 4, 2 }, 0, "global", 15, false},
		{"fullest scope wins", 4, 2, func(s *state) { s.globalInFlight, s.globalDepth, s.tenantDepth["t"] = 4, 9, 1 }, 0, "global", 30, false},
		{"paused", 0, 2, func(*state) {}, 0, "global", 120, true},
		{"tenant paused", 4, 0, func(*state) {}, 0, "tenant", 120, true},
		{"gated", 4, 2, func(*state) {}, 77, "rate_key", 77, false},
		{"gated longer than queue", 4, 2, func(s *state) { s.tenantDepth["t"] = 1 }, 12, "rate_key", 12, false},
	}
	for _, c := range cases {
		st := base()
		c.st(st)
		l := defaultLimits()
		l.GlobalInFlight, l.TenantInFlight = c.global, c.tenant
		err := immediate(l, "t", st, c.gatedFor)
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

func defaultLimits() limits.Config { return limits.Default() }
