package job

import (
	"unicode"
	"unicode/utf8"
)

// MaxTenantBytes is the longest tenant name, in bytes (SPEC §6): the width of the tenant
// columns.
const MaxTenantBytes = 191

// ValidTenant returns an invalid_request error naming field unless t is 1-191 bytes of valid
// UTF-8 without control or format characters (Unicode Cc and Cf: no zero-width characters, no
// bidi overrides, which let two names that look alike name different tenants) and is not `*`
// alone, which tokens use to mean every tenant (SPEC §7). It is here, not in gate, because every writer that names a
// tenant checks it: admission, the API's releases, and the producers' Go client in publisher,
// which must not depend on gate.
func ValidTenant(field, t string) error {
	switch {
	case t == "":
		return Invalid(field, "%s is required", field)
	case len(t) > MaxTenantBytes:
		return Invalid(field, "%s is %d bytes; at most %d", field, len(t), MaxTenantBytes)
	case !utf8.ValidString(t):
		return Invalid(field, "%s is not valid UTF-8", field)
	case t == "*":
		return Invalid(field, "%s may not be * alone: tokens use it to mean every tenant", field)
	}
	for _, r := range t {
		if unicode.IsControl(r) {
			return Invalid(field, "%s contains a control character", field)
		}
		if unicode.Is(unicode.Cf, r) {
			return Invalid(field, "%s contains an invisible format character (U+%04X)", field, r)
		}
	}
	return nil
}
