package integration_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate/api"
	"github.com/sluicehq/sluice/integration/harness"
)

// Slots (SPEC §5a) through the API of one process without a drainer, so queued jobs stay
// queued: grants, refusals by each scope with their Retry-After, the rollout modes, the fair-order
// rule, renewal and release fenced on the caller, and expiry.

const otherProducerToken = "other-producer-token-0123456789abcdef"

func startSlotsEnv(t *testing.T, o harness.Options) *harness.Env {
	t.Helper()
	o.Tokens = append(o.Tokens, api.Token{Name: "other", Token: otherProducerToken, Role: api.Producer, Tenants: []string{"*"}})
	return harness.Start(t, o)
}

// takeSlot posts a slot request, aware or not.
func takeSlot(t *testing.T, e *harness.Env, token string, aware bool, body map[string]any) harness.Response {
	t.Helper()
	return doWith(t, e, http.MethodPost, "/v1/slots", token, body, map[string]string{api.AwareHeader: strconv.FormatBool(aware)})
}

// doWith is Env.Do with extra request headers.
func doWith(t *testing.T, e *harness.Env, method, path, token string, body any, headers map[string]string) harness.Response {
	t.Helper()
	h := http.Header{}
	for k, v := range headers {
		h.Set(k, v)
	}
	return e.DoHeader(t, method, path, token, body, h)
}

func slotIDOf(t *testing.T, r harness.Response) string {
	t.Helper()
	if r.Status != http.StatusCreated {
		t.Fatalf("take slot: HTTP %d %s", r.Status, r.Raw)
	}
	return strconv.FormatInt(int64(r.Body["id"].(float64)), 10)
}

// expireSlot moves a slot's lease into the past on the database's clock (instead of waiting
// out the 5 s minimum lease).
func expireSlot(t *testing.T, e *harness.Env, id string) {
	t.Helper()
	if _, err := e.DB.ExecContext(context.Background(), "UPDATE slots SET expires_at = NOW(6) - INTERVAL 1 SECOND WHERE id = ?", id); err != nil {
		t.Fatal(err)
	}
}

func liveSlots(t *testing.T, e *harness.Env) int {
	t.Helper()
	var n int
	if err := e.DB.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM slots WHERE expires_at > NOW(6)").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSlotReleaseTellsNothingOfOthersSlots: DELETE /v1/slots/{id} answers another caller's live
// slot exactly as it answers a missing or an already released one, 204 with no body, so that a
// producer cannot probe which slot ids exist (issue 30, finding 12c); it releases nothing and
// audits nothing. The owner then releases it.
func TestSlotReleaseTellsNothingOfOthersSlots(t *testing.T) {
	t.Parallel()
	e := startSlotsEnv(t, harness.Options{API: true})
	live := slotIDOf(t, takeSlot(t, e, harness.ProducerToken, true, map[string]any{"tenant": "acme", "lease_seconds": 600}))
	released := slotIDOf(t, takeSlot(t, e, harness.ProducerToken, true, map[string]any{"tenant": "acme"}))
	if r := e.Do(t, http.MethodDelete, "/v1/slots/"+released, harness.ProducerToken, nil); r.Status != http.StatusNoContent {
		t.Fatalf("release: HTTP %d %s", r.Status, r.Raw)
	}
	n, _ := strconv.ParseInt(live, 10, 64)
	missing := strconv.FormatInt(n+1000, 10)
	var answers []string
	for _, id := range []string{live, released, missing} {
		r := e.Do(t, http.MethodDelete, "/v1/slots/"+id, otherProducerToken, nil)
		answers = append(answers, fmt.Sprintf("HTTP %d %q %s", r.Status, r.Raw, r.Header.Get("Content-Type")))
	}
	if answers[0] != answers[1] || answers[0] != answers[2] || !strings.HasPrefix(answers[0], "HTTP 204 ") {
		t.Errorf("another caller's DELETE of a live, a released and a missing slot: %q, want the same 204 for each", answers)
	}
	if got := liveSlots(t, e); got != 1 {
		t.Errorf("%d live slots after another caller's DELETE, want the owner's 1", got)
	}
	if evs := readAudit(t, e.DB.DB, "event = 'slot_released' AND slot_id = ?", live); len(evs) != 0 {
		t.Errorf("another caller's DELETE audited a release: %v", evs)
	}
	if r := e.Do(t, http.MethodPost, "/v1/slots/"+live+"/renew", harness.ProducerToken, nil); r.Status != http.StatusOK {
		t.Errorf("the owner's renewal after another caller's DELETE: HTTP %d %s", r.Status, r.Raw)
	}
	if r := e.Do(t, http.MethodDelete, "/v1/slots/"+live, harness.ProducerToken, nil); r.Status != http.StatusNoContent || liveSlots(t, e) != 0 {
		t.Errorf("the owner's release: HTTP %d %s, %d live slots", r.Status, r.Raw, liveSlots(t, e))
	}
}

// TestSlotLifecycle: grant (201, body and headers), renew, a forged renew (404) or release (204,
// releasing nothing) by another caller, release (204, twice), renewal after expiry (410, never revived), validation.
func TestSlotLifecycle(t *testing.T) {
	t.Parallel()
	e := startSlotsEnv(t, harness.Options{API: true})
	patchConfig(t, e, map[string]any{"lanes": map[string]int{"search": 2}})
	r := takeSlot(t, e, harness.ProducerToken, true, map[string]any{"tenant": "acme", "lanes": []string{"search"}, "lease_seconds": 30})
	id := slotIDOf(t, r)
	if r.Body["decision"] != "admitted" || r.Body["renew_every_seconds"] != float64(10) || r.Body["lease_seconds"] != float64(30) ||
		r.Header.Get("Sluice-Capacity-Decision") != "admitted" || r.Header.Get("Sluice-Capacity-Tier") != "default" ||
		r.Header.Get("Sluice-Capacity-Suggested-Concurrency") != "2" || r.Header.Get("Location") != "/v1/slots/"+id {
		t.Errorf("granted: %s %v", r.Raw, r.Header)
	}
	for _, bad := range []struct {
		body  map[string]any
		field string
	}{
		{map[string]any{"tenant": "acme", "lanes": []string{"gpu"}}, "lanes"},
		{map[string]any{"tenant": "acme", "lease_seconds": 4}, "lease_seconds"},
		{map[string]any{"tenant": "acme", "lease_seconds": 901}, "lease_seconds"},
		{map[string]any{"tenant": ""}, "tenant"},
	} {
		if r := takeSlot(t, e, harness.ProducerToken, true, bad.body); r.Status != http.StatusBadRequest || r.Body["field"] != bad.field {
			t.Errorf("%v: HTTP %d %s, want 400 naming %s", bad.body, r.Status, r.Raw, bad.field)
		}
	}
	if r := e.Do(t, http.MethodPost, "/v1/slots/"+id+"/renew", otherProducerToken, nil); r.Status != http.StatusNotFound {
		t.Errorf("forged renew: HTTP %d %s", r.Status, r.Raw)
	}
	if r := e.Do(t, http.MethodDelete, "/v1/slots/"+id, otherProducerToken, nil); r.Status != http.StatusNoContent || liveSlots(t, e) != 1 {
		t.Errorf("forged release: HTTP %d %s, %d live slots; want 204 as for a missing slot, and the slot still live", r.Status, r.Raw, liveSlots(t, e))
	}
	if r := e.Do(t, http.MethodPost, "/v1/slots/"+id+"/renew", harness.ProducerToken, nil); r.Status != http.StatusOK || r.Body["expires_at"] == nil {
		t.Errorf("renew: HTTP %d %s", r.Status, r.Raw)
	}
	if r := e.Do(t, http.MethodGet, "/v1/slots?tenant=acme", harness.AdminToken, nil); r.Status != http.StatusOK || len(r.Body["slots"].([]any)) != 1 {
		t.Errorf("list: HTTP %d %s", r.Status, r.Raw)
	}
	if r := e.Do(t, http.MethodGet, "/v1/slots", harness.ProducerToken, nil); r.Status != http.StatusForbidden {
		t.Errorf("a producer's list: HTTP %d", r.Status)
	}
	for range 2 {
		if r := e.Do(t, http.MethodDelete, "/v1/slots/"+id, harness.ProducerToken, nil); r.Status != http.StatusNoContent {
			t.Errorf("release: HTTP %d %s", r.Status, r.Raw)
		}
	}
	if r := e.Do(t, http.MethodPost, "/v1/slots/"+id+"/renew", harness.ProducerToken, nil); r.Status != http.StatusNotFound {
		t.Errorf("renew after release: HTTP %d %s", r.Status, r.Raw)
	}

	// Expired: 410 slot_lost, and it stays expired.
	id = slotIDOf(t, takeSlot(t, e, harness.ProducerToken, true, map[string]any{"tenant": "acme"}))
	expireSlot(t, e, id)
	for range 2 {
		if r := e.Do(t, http.MethodPost, "/v1/slots/"+id+"/renew", harness.ProducerToken, nil); r.Status != http.StatusGone || r.Body["error_code"] != "slot_lost" {
			t.Errorf("renew after expiry: HTTP %d %s", r.Status, r.Raw)
		}
	}
	if n := liveSlots(t, e); n != 0 {
		t.Errorf("%d live slots after expiry: revived", n)
	}
	if r := e.Do(t, http.MethodDelete, "/v1/slots/"+id, harness.ProducerToken, nil); r.Status != http.StatusNoContent {
		t.Errorf("release after expiry: HTTP %d", r.Status)
	}

	// A shorter lease configured later does not shorten a live slot: renewal uses the slot's own.
	id = slotIDOf(t, takeSlot(t, e, harness.ProducerToken, true, map[string]any{"tenant": "acme", "lease_seconds": 600}))
	patchConfig(t, e, map[string]any{"lease_seconds": 5})
	r = e.Do(t, http.MethodPost, "/v1/slots/"+id+"/renew", harness.ProducerToken, nil)
	exp, err := time.Parse(time.RFC3339Nano, r.Body["expires_at"].(string))
	if err != nil || time.Until(exp) < 500*time.Second {
		t.Errorf("renewed to %v (%v), want about 600 s from now", exp, err)
	}
}

// TestSlotRefusals: each scope refuses exactly when full, with its Retry-After; a paused limit
// first (120 s); nothing written.
func TestSlotRefusals(t *testing.T) {
	t.Parallel()
	e := startSlotsEnv(t, harness.Options{API: true})
	take := func(tenant string, interactive bool, lanes ...string) harness.Response {
		return takeSlot(t, e, harness.ProducerToken, true, map[string]any{"tenant": tenant, "interactive": interactive, "lanes": lanes})
	}
	refused := func(r harness.Response, scope string, retry int, paused bool) {
		t.Helper()
		if r.Status != http.StatusTooManyRequests || r.Body["error_code"] != "capacity_exceeded" || r.Body["scope"] != scope ||
			r.Body["paused"] != paused || r.Body["retry_after"] != float64(retry) || r.Header.Get("Retry-After") != strconv.Itoa(retry) ||
			r.Header.Get("Sluice-Capacity-Decision") != "refused" || r.Header.Get("Sluice-Capacity-Scope") != scope {
			t.Errorf("want %s refusal (retry %d, paused %v): HTTP %d %s %v", scope, retry, paused, r.Status, r.Raw, r.Header)
		}
	}
	release := func(r harness.Response) {
		t.Helper()
		if d := e.Do(t, http.MethodDelete, "/v1/slots/"+slotIDOf(t, r), harness.ProducerToken, nil); d.Status != http.StatusNoContent {
			t.Fatalf("release: %d", d.Status)
		}
	}

	// Tenant cap 2 (default): the third slot of acme is refused; the tenant has nothing queued,
	// so 5 s, then 10 s for the next refusal of that scope within 5 s.
	a1, a2 := take("acme", false), take("acme", false)
	refused(take("acme", false), "tenant", 5, false)
	refused(take("acme", false), "tenant", 10, false)
	// Global cap 4: two more tenants fill it.
	b1, c1 := take("beta", false), take("gamma", false)
	refused(take("delta", false), "global", 5, false)
	for _, r := range []harness.Response{a1, a2, b1, c1} {
		release(r)
	}

	// Lanes.
	patchConfig(t, e, map[string]any{"lanes": map[string]int{"search": 1}})
	s1 := take("acme", false, "search")
	refused(take("beta", false, "search"), "lane:search", 5, false)
	release(s1)

	// Tiers: a ceiling on the tier's total.
	patchConfig(t, e, map[string]any{"tenant_tiers": map[string]string{"acme": "gold", "beta": "gold"}, "tier_in_flight": map[string]int{"gold": 1}})
	g1 := take("acme", false)
	if h := g1.Header; h.Get("Sluice-Capacity-Tier") != "gold" || h.Get("Sluice-Capacity-Tier-Limit") != "1" || h.Get("Sluice-Capacity-Tier-In-Flight") != "0" {
		t.Errorf("tier headers %v", h)
	}
	refused(take("beta", false), "tier", 5, false)
	release(g1)
	patchConfig(t, e, map[string]any{"tenant_tiers": map[string]string{}, "tier_in_flight": map[string]int{}})

	// The interactive reserve: 1 of 2 global slots only interactive work may take.
	patchConfig(t, e, map[string]any{"global_in_flight": 2, "interactive_reserve": 1})
	n1 := take("acme", false)
	refused(take("beta", false), "reserve", 5, false)
	i1 := take("beta", true)
	release(n1)
	release(i1)

	// Paused: 120 s, reported before a full limit.
	patchConfig(t, e, map[string]any{"global_in_flight": 0, "interactive_reserve": 0})
	r := take("acme", false)
	refused(r, "global", 120, true)
	if r.Header.Get("Sluice-Capacity-Suggested-Concurrency") != "0" {
		t.Errorf("paused suggested concurrency %q", r.Header.Get("Sluice-Capacity-Suggested-Concurrency"))
	}
	if n := liveSlots(t, e); n != 0 {
		t.Errorf("%d live slots: a refusal wrote one", n)
	}
	if n := harness.Counter(t, e.App.Registry(), "sluice_slot_decisions_total", "decision", "refused", "scope", "global"); n != 2 {
		t.Errorf("refused global decisions counted %v", n)
	}
}

// TestSlotRollout: shadow never refuses and says so; enforce_for=aware refuses only aware
// requests; off grants without headers.
func TestSlotRollout(t *testing.T) {
	t.Parallel()
	e := startSlotsEnv(t, harness.Options{API: true})
	patchConfig(t, e, map[string]any{"tenant_in_flight": 1, "global_in_flight": 100})
	slotIDOf(t, takeSlot(t, e, harness.ProducerToken, true, map[string]any{"tenant": "acme"}))

	patchConfig(t, e, map[string]any{"admission_mode": "shadow"})
	for _, aware := range []bool{true, false} {
		r := takeSlot(t, e, harness.ProducerToken, aware, map[string]any{"tenant": "acme"})
		if r.Status != http.StatusCreated || r.Body["decision"] != "shadow-refused" || r.Header.Get("Sluice-Capacity-Decision") != "shadow-refused" ||
			r.Header.Get("Sluice-Capacity-Scope") != "tenant" {
			t.Errorf("shadow (aware %v): HTTP %d %s %v", aware, r.Status, r.Raw, r.Header)
		}
	}

	patchConfig(t, e, map[string]any{"admission_mode": "enforce", "enforce_for": "aware"})
	if r := takeSlot(t, e, harness.ProducerToken, false, map[string]any{"tenant": "acme"}); r.Status != http.StatusCreated || r.Body["decision"] != "shadow-refused" {
		t.Errorf("aware mode, unaware request: HTTP %d %s", r.Status, r.Raw)
	}
	if r := takeSlot(t, e, harness.ProducerToken, true, map[string]any{"tenant": "acme"}); r.Status != http.StatusTooManyRequests || r.Body["scope"] != "tenant" {
		t.Errorf("aware mode, aware request: HTTP %d %s", r.Status, r.Raw)
	}

	patchConfig(t, e, map[string]any{"admission_mode": "off"})
	r := takeSlot(t, e, harness.ProducerToken, true, map[string]any{"tenant": "acme"})
	if r.Status != http.StatusCreated || r.Header.Get("Sluice-Capacity-Decision") != "" {
		t.Errorf("off: HTTP %d %s %v", r.Status, r.Raw, r.Header)
	}
	if n := liveSlots(t, e); n != 5 {
		t.Errorf("%d live slots, want 5 (shadow and off grants are granted)", n)
	}
	var refusedEvents, granted int
	if err := e.DB.QueryRowContext(context.Background(), `SELECT
		(SELECT COUNT(*) FROM audit_events WHERE event = 'slot_granted'),
		(SELECT COUNT(*) FROM audit_events WHERE event = 'slot_refused')`).Scan(&granted, &refusedEvents); err != nil {
		t.Fatal(err)
	}
	if granted != 5 {
		t.Errorf("%d granted audit events", granted)
	}
	harness.WaitFor(t, 10*time.Second, "the refusal's audit event", func() (bool, error) {
		var n int
		err := e.DB.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM audit_events WHERE event = 'slot_refused' AND scope = 'tenant'").Scan(&n)
		return n == 1, err
	})
}

// TestSlotFairOrder: a non-interactive slot does not take the last unit while a tenant with
// fewer in flight has queued work; a tenant with nothing in flight, or an interactive slot within
// the reserve, is not held back.
func TestSlotFairOrder(t *testing.T) {
	t.Parallel()
	e := startSlotsEnv(t, harness.Options{API: true})
	patchConfig(t, e, map[string]any{"global_in_flight": 2})
	slotIDOf(t, takeSlot(t, e, harness.ProducerToken, true, map[string]any{"tenant": "acme"}))
	e.Admit(t, "beta", map[string]any{}) // beta: 0 in flight, one queued job the claim would start next
	r := takeSlot(t, e, harness.ProducerToken, true, map[string]any{"tenant": "acme"})
	if r.Status != http.StatusTooManyRequests || r.Body["scope"] != "global" {
		t.Errorf("acme's second slot with beta waiting: HTTP %d %s", r.Status, r.Raw)
	}
	// gamma holds nothing: nobody with fewer in flight waits ahead of it.
	slotIDOf(t, takeSlot(t, e, harness.ProducerToken, true, map[string]any{"tenant": "gamma"}))

	// An interactive slot within the reserve goes ahead.
	f := startSlotsEnv(t, harness.Options{API: true})
	patchConfig(t, f, map[string]any{"global_in_flight": 3, "interactive_reserve": 1})
	slotIDOf(t, takeSlot(t, f, harness.ProducerToken, true, map[string]any{"tenant": "acme"}))
	f.Admit(t, "beta", map[string]any{})
	f.Admit(t, "gamma", map[string]any{})
	slotIDOf(t, takeSlot(t, f, harness.ProducerToken, true, map[string]any{"tenant": "acme", "interactive": true}))

	// A tenant whose oldest job's rate key is gated does not wait ahead: its job cannot start.
	g := startSlotsEnv(t, harness.Options{API: true, Memcached: []string{"127.0.0.1:11211"}, GateTimeout: 2 * time.Second})
	patchConfig(t, g, map[string]any{"global_in_flight": 2})
	slotIDOf(t, takeSlot(t, g, harness.ProducerToken, true, map[string]any{"tenant": "acme"}))
	key := "slot-fair-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	if r := g.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, map[string]any{"tenant": "beta", "rate_key": key}); r.Status != http.StatusAccepted {
		t.Fatalf("admit: HTTP %d %s", r.Status, r.Raw)
	}
	if r := takeSlot(t, g, harness.ProducerToken, true, map[string]any{"tenant": "acme"}); r.Status != http.StatusTooManyRequests {
		t.Errorf("acme's second slot with beta's ungated job waiting: HTTP %d %s", r.Status, r.Raw)
	}
	// In shadow the same slot is decided once beta's gate is read: granted past the fair order,
	// it does not count.
	patchConfig(t, g, map[string]any{"admission_mode": "shadow"})
	if r := takeSlot(t, g, harness.ProducerToken, true, map[string]any{"tenant": "acme"}); r.Status != http.StatusCreated ||
		r.Body["decision"] != "shadow-refused" || r.Body["counted"] != false {
		t.Errorf("shadow: acme's second slot with beta's ungated job waiting: HTTP %d %s", r.Status, r.Raw)
	}
	patchConfig(t, g, map[string]any{"admission_mode": "enforce"})
	if r := g.Do(t, http.MethodPost, "/v1/gates", harness.ExecutorToken, map[string]any{"rate_key": key, "retry_after": 60}); r.Status != http.StatusOK {
		t.Fatalf("gate: HTTP %d %s", r.Status, r.Raw)
	}
	if r := takeSlot(t, g, harness.ProducerToken, true, map[string]any{"tenant": "acme"}); r.Body["decision"] != "admitted" || r.Body["counted"] != true {
		t.Errorf("acme's second slot with beta's job gated: HTTP %d %s", r.Status, r.Raw)
	}
}
