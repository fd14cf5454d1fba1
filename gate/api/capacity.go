package api

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/gate/config"
)

// capacityHeaders are the SPEC §5a headers of a capacity decision, in the order
// Access-Control-Expose-Headers lists them to browsers.
var capacityHeaders = []string{"Sluice-Capacity-Decision", "Sluice-Capacity-Scope",
	"Sluice-Capacity-Limit", "Sluice-Capacity-In-Flight", "Sluice-Capacity-Tier",
	"Sluice-Capacity-Tier-Limit", "Sluice-Capacity-Tier-In-Flight",
	"Sluice-Capacity-Suggested-Concurrency", "Sluice-Queue-Position", "Retry-After"}

// setVerdictHeaders writes the SPEC §5a capacity headers of a slot or admission answer:
// decision is admitted, shadow-refused or refused, and v the verdict that decided it (its
// Scope the refusing or else the fullest limit). Nothing is written with the rollout mode off:
// callers do not call it then.
func setVerdictHeaders(h http.Header, decision string, v config.Verdict) {
	h.Set("Sluice-Capacity-Decision", decision)
	h.Set("Sluice-Capacity-Scope", v.Scope)
	h.Set("Sluice-Capacity-Limit", strconv.Itoa(v.Limit))
	h.Set("Sluice-Capacity-In-Flight", strconv.Itoa(v.InFlight))
	h.Set("Sluice-Capacity-Tier", v.Tier)
	h.Set("Sluice-Capacity-Tier-Limit", strconv.Itoa(v.TierLimit))
	h.Set("Sluice-Capacity-Tier-In-Flight", strconv.Itoa(v.TierInFlight))
	h.Set("Sluice-Capacity-Suggested-Concurrency", strconv.Itoa(v.Suggested))
}

// capacityAware reports whether r says its client handles a capacity refusal (SPEC §5a: with
// enforce_for=aware only such requests are refused on capacity).
func capacityAware(r *http.Request) bool {
	return strings.EqualFold(strings.TrimSpace(r.Header.Get(AwareHeader)), "true")
}
