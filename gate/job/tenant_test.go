package job

import (
	"strings"
	"testing"
)

// TestValidTenant is SPEC §7's rule for tenant names: 1-191 bytes of valid UTF-8 without
// control or format characters (Cc, Cf), and not `*` alone.
func TestValidTenant(t *testing.T) {
	cases := []struct {
		tenant string
		ok     bool
	}{
		{"acme", true},
		{"a.b*c > d ü 日本", true},
		{"**", true},
		{"a*", true},
		{"*.acme", true},
		{strings.Repeat("x", MaxTenantBytes), true},
		{"", false},
		{strings.Repeat("x", MaxTenantBytes+1), false},
		{"\xff", false},
		{"ac\x00me", false},
		{"ac\nme", false},
		{"ac\u0085me", false},     // C1 control (NEL)
		{"*", false},              // every tenant, in a token's scope
		{"ac\u200bme", false},     // zero-width space
		{"ac\u200dme", false},     // zero-width joiner
		{"\u202eemca", false},     // right-to-left override
		{"acme\u2066", false},     // left-to-right isolate
		{"\ufeffacme", false},     // zero-width no-break space (BOM)
		{"ac\u00adme", false},     // soft hyphen
		{"ac\U000E0041me", false}, // tag character
	}
	for _, c := range cases {
		err := ValidTenant("tenant", c.tenant)
		if (err == nil) != c.ok {
			t.Errorf("ValidTenant(%+q) = %v, want ok %v", c.tenant, err, c.ok)
			continue
		}
		if err != nil {
			if je, isJob := err.(*Error); !isJob || je.Code != CodeInvalidRequest || je.Detail["field"] != "tenant" {
				t.Errorf("ValidTenant(%+q) = %#v, want invalid_request naming tenant", c.tenant, err)
			}
		}
	}
}
