package api_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/gate/client"
	"github.com/sluicehq/sluice/integration/apitest"
)

// memcachedGates reads rate gates in the format SPEC §5 documents (key
// sluice:gate:<sha256>, value the not-before instant in Unix milliseconds), the way the gate
// store does; the test writes gates the way an executor may.
type memcachedGates struct{ mc *memcache.Client }

func (g memcachedGates) NotBefore(_ context.Context, hashes []string) (map[string]time.Time, error) {
	keys := make([]string, len(hashes))
	for i, h := range hashes {
		keys[i] = "sluice:gate:" + h
	}
	items, err := g.mc.GetMulti(keys)
	if err != nil {
		return nil, err
	}
	out := map[string]time.Time{}
	for _, h := range hashes {
		if it, ok := items["sluice:gate:"+h]; ok {
			ms, err := strconv.ParseInt(string(it.Value), 10, 64)
			if err != nil {
				return out, errors.New("bad gate value")
			}
			out[h] = time.UnixMilli(ms)
		}
	}
	return out, nil
}

// TestFrontDoorImmediate: queue=false admits only a job that could be claimed now; otherwise
// 429 capacity_exceeded with Retry-After min(30, 5 × (ahead + 1)), 120 while paused, the
// remaining gate time for a gated key, and nothing written. Queued admissions carry their
// position in the header and the body, equal to GET's.
func TestFrontDoorImmediate(t *testing.T) {
	t.Parallel()
	mc := memcache.New("127.0.0.1:11211")
	f := apitest.Setup(t, apitest.Options{Gates: memcachedGates{mc}})
	no := false
	immediate := func(tenant, rateKey string) map[string]any {
		b := map[string]any{"tenant": tenant, "queue": no}
		if rateKey != "" {
			b["rate_key"] = rateKey
		}
		return b
	}
	expectRefusal := func(name string, body map[string]any, scope string, retry int, paused bool) {
		t.Helper()
		before := f.RowCounts(t)
		r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, body)
		if r.Status != 429 || r.Body["error_code"] != "capacity_exceeded" || r.Body["scope"] != scope ||
			r.Body["retry_after"] != float64(retry) || r.Body["paused"] != paused ||
			r.Header.Get("Retry-After") != strconv.Itoa(retry) || r.Header.Get("Sluice-Capacity-Decision") != "refused" {
			t.Errorf("%s: HTTP %d %s Retry-After %q decision %q; want 429 capacity_exceeded scope %s retry %d paused %v",
				name, r.Status, r.Raw, r.Header.Get("Retry-After"), r.Header.Get("Sluice-Capacity-Decision"), scope, retry, paused)
		}
		if after := f.RowCounts(t); after != before {
			t.Errorf("%s: refusal wrote rows: %v → %v", name, before, after)
		}
	}

	// Free capacity, nothing queued: admitted, 202 like any other.
	r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, immediate("fresh", ""))
	if r.Status != 202 || r.Header.Get("Sluice-Capacity-Decision") != "admitted" ||
		r.Header.Get("Sluice-Capacity-Limit") != "2" || r.Header.Get("Sluice-Capacity-In-Flight") != "0" {
		t.Errorf("immediate with capacity: %d %v %s", r.Status, r.Header, r.Raw)
	}
	// The tenant now has 1 queued job ahead: 5 × 2 = 10 s.
	expectRefusal("1 queued ahead", immediate("fresh", ""), "tenant", 10, false)
	f.FillQueued(t, "deep", 9, "queued")
	expectRefusal("9 queued ahead", immediate("deep", ""), "tenant", 30, false)
	// Tenant at its in-flight cap, nothing queued: 5 s.
	f.FillQueued(t, "busy", 2, "running")
	expectRefusal("tenant at cap", immediate("busy", ""), "tenant", 5, false)
	// Global cap reached (2 busy + 2 more in flight = 4); 10 queued overall ahead: 30 s.
	f.FillQueued(t, "other", 2, "dispatched")
	expectRefusal("global at cap", immediate("idle", ""), "global", 30, false)
	f.SetConfig(t, map[string]any{"global_in_flight": 10})
	if r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, immediate("idle", "")); r.Status != 202 {
		t.Errorf("after raising the global cap: %d %s", r.Status, r.Raw)
	}
	// Paused: 120 s.
	f.SetConfig(t, map[string]any{"global_in_flight": 0})
	expectRefusal("paused globally", immediate("idle2", ""), "global", 120, true)
	f.SetConfig(t, map[string]any{"global_in_flight": 10, "tenant_in_flight_overrides": map[string]int{"frozen": 0}})
	expectRefusal("tenant paused", immediate("frozen", ""), "tenant", 120, true)

	// A gated rate key: the remaining gate time, scope rate_key.
	key := apitest.UniqueTenant("api-key")
	sum := sha256.Sum256([]byte(key))
	nb := f.Time().Add(42*time.Second + 300*time.Millisecond)
	if err := mc.Set(&memcache.Item{Key: "sluice:gate:" + hex.EncodeToString(sum[:]), Value: []byte(strconv.FormatInt(nb.UnixMilli(), 10)), Expiration: 300}); err != nil {
		t.Fatalf("write gate: %v", err)
	}
	expectRefusal("gated key", immediate("gated", key), "rate_key", 43, false)
	if r := f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, immediate("gated", key+"-other")); r.Status != 202 {
		t.Errorf("another key of the same tenant: %d %s", r.Status, r.Raw)
	}

	// Shadow mode admits what enforce refuses and says so.
	f.SetConfig(t, map[string]any{"admission_mode": "shadow"})
	r = f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, immediate("deep", ""))
	if r.Status != 202 || r.Header.Get("Sluice-Capacity-Decision") != "shadow-refused" {
		t.Errorf("shadow: %d %v", r.Status, r.Header)
	}
	f.SetConfig(t, map[string]any{"admission_mode": "enforce"})

	// queue=true (the default): 202 with the position, the same in the header, body and GET.
	r = f.Do(t, http.MethodPost, "/v1/jobs", apitest.StarToken, map[string]any{"tenant": "deep"})
	if r.Status != 202 || r.Body["position"] != float64(11) || r.Header.Get("Sluice-Queue-Position") != "11" {
		t.Errorf("queued admission behind 10: %d position %v header %q, want 11", r.Status, r.Body["position"], r.Header.Get("Sluice-Queue-Position"))
	}
	g := f.Do(t, http.MethodGet, "/v1/jobs/"+strconv.FormatInt(apitest.JobID(t, r.Body), 10), apitest.StarToken, nil)
	if g.Body["position"] != float64(11) || g.Body["status"] != "queued" {
		t.Errorf("GET: %s, want queued at position 11", g.Raw)
	}
}

// TestFrontDoorImmediateBatchTakesSlots: the queue=false jobs admitted earlier in one transaction
// (a batch, or single admissions sharing one) count against the free global slots of the later
// ones. With 3 of the 4 slots in flight, a batch of four queue=false jobs for four idle tenants
// starts one and refuses three: only one could be claimed now (SPEC §5).
func TestFrontDoorImmediateBatchTakesSlots(t *testing.T) {
	t.Parallel()
	f := apitest.Setup(t, apitest.Options{})
	f.FillQueued(t, apitest.UniqueTenant("busy"), 3, "running")
	no := false
	reqs := make([]client.AdmitRequest, 4)
	for i := range reqs {
		reqs[i] = client.AdmitRequest{Tenant: apitest.UniqueTenant("idle"), Queue: &no}
	}
	res, err := f.Star.AdmitBatch(context.Background(), reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		want, code := 429, "capacity_exceeded"
		if i == 0 {
			want, code = 202, ""
		}
		got := ""
		if r.Error != nil {
			got, _ = r.Error["error_code"].(string)
		}
		if r.Status != want || got != code || (code != "" && r.Error["scope"] != "global") {
			t.Errorf("item %d: %d %v, want %d %s", i, r.Status, r.Error, want, code)
		}
	}
}
