package integration_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gate"
	"github.com/sluicehq/sluice/gate/api"
	"github.com/sluicehq/sluice/gate/config"
	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/memcachedtest"
)

// hostileRequests is how many requests TestHostileAPI sends: enough for every route to see
// every kind of caller and most kinds of bad input many times, few enough for well under a
// minute with -race on a loaded machine.
const hostileRequests = 800

// hostileBurst is how many requests TestHostileAPI then sends from four callers at once.
const hostileBurst = 200

// The fuzz's own callers and tenants: scopedToken may act for scopedTenant only; otherTenant's
// jobs carry otherSecret in their payloads and idempotency keys, which no answer to the scoped
// producer may show unless its own request named it.
const (
	scopedToken  = "scoped-producer-token-0123456789abcdef"
	scopedTenant = "fz-a"
	otherTenant  = "fz-b"
	otherSecret  = "fz-secret-of-b"
)

// The names no answer to a producer may show (issue 30, finding 12a): the admin token that admits
// the set-up jobs, and the drainer id that ends some of them. Only their roles may show.
const (
	namedAdminToken = "named-admin-token-0123456789abcdef01"
	namedAdmin      = "fz-ops-alice"
	namedDrainer    = "fz-web-7.example.net-4242"
)

// doneKey is the rate key of the dispatched set-up jobs: only a /complete carrying a job's own
// nonce may gate it (issue 30, finding 10).
const doneKey = "fz-done-key"

// TestHostileAPI sends a seeded stream of hostile requests to every route of a running sluice
// (the App, API role, with memcached for the gates): random methods, headers, bodies (malformed
// JSON, wrong types, huge, invalid UTF-8, deep), ids, cursors and tokens of every role. Each
// answer must be JSON with a stable error_code, or a success; never a 5xx other than 503 busy or
// unavailable; a refused request must leave every table as it was (a depth-cap refusal excepted:
// SPEC §5 records it as a rejected job); an admission that succeeds writes exactly its job; a
// role never succeeds on a route it may not call; nothing in an answer to the producer scoped
// to one tenant belongs to another tenant, and nothing in an answer to a producer names an admin
// token or a drainer; a refused /complete without the job's own nonce gates nothing; a release
// never answers 404 for a slot id; a config history page holds at most its limit; every
// tenant's queue state matches its jobs. Then a
// burst from four callers at once is checked the same way, but for the writes. SLUICE_FUZZ_SEED
// runs another seed and SLUICE_FUZZ_REQUESTS another number of requests.
func TestHostileAPI(t *testing.T) {
	t.Parallel()
	seed := uint64(20)
	if v := os.Getenv("SLUICE_FUZZ_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("SLUICE_FUZZ_SEED: %v", err)
		}
		seed = n
	}
	t.Logf("seed %d (SLUICE_FUZZ_SEED replays it)", seed)
	mc := memcachedtest.Start(t)
	env := harness.Start(t, harness.Options{API: true, Memcached: []string{mc.Addr()}, GateTimeout: time.Second,
		Tokens: []api.Token{{Name: "scoped", Token: scopedToken, Role: api.Producer, Tenants: []string{scopedTenant}},
			{Name: namedAdmin, Token: namedAdminToken, Role: api.Admin}}})
	h := newHostile(t, env, seed)
	h.setUp()
	h.last = h.snapshot()
	n := hostileRequests
	if v := os.Getenv("SLUICE_FUZZ_REQUESTS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			t.Fatalf("SLUICE_FUZZ_REQUESTS: %v", err)
		}
	}
	for i := range n {
		h.one(i, h.request())
		if i%100 == 99 {
			h.checkQueueState()
		}
	}
	// Then a burst of more from several callers at once, to find what only a race shows: each
	// answer is checked (which request wrote what can no longer be told), then the tenants'
	// queue state against their jobs.
	burst := make([]hostileReq, hostileBurst)
	for i := range burst {
		burst[i] = h.request()
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(burst) {
					return
				}
				a, err := h.send(n+i, burst[i])
				if err != nil {
					t.Error(err)
					return
				}
				h.checkAnswer(burst[i], a)
			}
		})
	}
	wg.Wait()
	h.checkQueueState()
	t.Logf("answers by status: %v", h.statuses)
	var untried []string
	for _, r := range h.routes {
		if h.succeeded[r] == 0 {
			untried = append(untried, r)
		}
	}
	// A route that never answered with a success was only ever refused: the fuzz would not see
	// a success that writes or leaks.
	if len(untried) > 0 {
		t.Errorf("routes that never succeeded in %d requests: %v", n, untried)
	}
}

type caller int

const (
	asNone caller = iota
	asInvalid
	asScoped
	asStar
	asExecutor
	asAdmin
)

var callerNames = []string{"none", "invalid", "scoped", "star", "executor", "admin"}

// mayCall says which callers a route lets succeed (SPEC §6).
func mayCall(route string, c caller) bool {
	switch route {
	case "GET /healthz", "GET /readyz", "GET /metrics":
		return true
	case "POST /v1/jobs", "POST /v1/jobs:batch", "GET /v1/jobs", "GET /v1/jobs/{id}", "DELETE /v1/jobs/{id}",
		"GET /v1/jobs/{id}/events", "POST /v1/slots", "POST /v1/slots/{id}/renew", "DELETE /v1/slots/{id}":
		return c == asScoped || c == asStar || c == asAdmin
	case "GET /v1/whoami":
		return c != asNone && c != asInvalid
	case "POST /v1/jobs/{id}/start", "POST /v1/jobs/{id}/complete", "POST /v1/gates", "POST /v1/releases":
		return c == asExecutor || c == asAdmin
	}
	return c == asAdmin
}

type hostileReq struct {
	route   string // the pattern it was built from; "" for a made-up path
	id      int64  // the job its path names, when the fuzz knows it
	method  string
	path    string
	caller  caller
	auth    string
	header  http.Header
	body    []byte
	chunked bool
}

type hostile struct {
	t         *testing.T
	env       *harness.Env
	rng       *rand.Rand
	http      *http.Client
	routes    []string
	snapQuery string
	tables    []string // snapQuery's, in its order
	codes     map[string]bool

	// honest is set while a request is built to succeed if the service lets it: its route's
	// method, a caller the route allows, values that pass validation. The fuzz needs successes
	// too: a write or a leak can only hide in one.
	honest bool

	ownIDs, otherIDs, anyIDs []int64
	failedIDs                []int64
	slotIDs                  []int64 // slots the scoped producer took in setUp
	keptSlotIDs              []int64 // more of its slots, which only the star producer is sent to release
	storyIDs                 []int64 // scopedTenant's jobs whose events name the named admin or drainer
	nonces                   []string
	nonceOf                  map[int64]string // the dispatched jobs' nonces, while they are usable
	sentNonce                map[int64]string // every dispatched job's nonce, for good
	cursors                  []string
	hashes                   []string
	keys                     []string
	statuses                 map[int]int
	last                     snapshot // the tables after the last request
	succeeded                map[string]int
}

func newHostile(t *testing.T, env *harness.Env, seed uint64) *hostile {
	lim := config.NewCache(env.DB.DB, nil)
	adm, err := gate.New(gate.Config{DB: env.DB.DB, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	toks, err := api.NewTokens(nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Config{DB: env.DB.DB, Admitter: adm, Limits: lim, Tokens: toks})
	if err != nil {
		t.Fatal(err)
	}
	h := &hostile{t: t, env: env, rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), routes: srv.Routes(),
		codes: map[string]bool{}, statuses: map[int]int{}, succeeded: map[string]int{}, nonceOf: map[int64]string{},
		sentNonce: map[int64]string{},
		http: &http.Client{Timeout: 30 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	for _, c := range []job.Code{job.CodeInvalidRequest, job.CodeUnauthorized, job.CodeForbidden, job.CodeNotFound,
		job.CodePayloadTooLarge, job.CodeQueueFull, job.CodeCapacityExceeded, job.CodeRateLimited,
		job.CodeIdempotencyConflict, job.CodeNotCancelable, job.CodeNonceInvalid, job.CodeNonceExpired,
		job.CodeNonceUsed, job.CodeDispatchVoid, job.CodeOutcomeConflict, job.CodeUnavailable,
		job.CodeMethodNotAllowed, job.CodeNotRedrivable, job.CodeBusy} {
		h.codes[string(c)] = true
	}
	h.snapQuery, h.tables = snapshotQuery(t, env.DB.DB)
	return h
}

// snapshot is every table's row count and two checksums over its rows, "count:xor:sum".
type snapshot struct {
	tables []string
	sums   []string
}

// changed lists the tables whose rows differ between s and after, but for skip.
func (s snapshot) changed(after snapshot, skip ...string) []string {
	var out []string
	for i, name := range s.tables {
		if s.sums[i] != after.sums[i] && !slices.Contains(skip, name) {
			out = append(out, name)
		}
	}
	return out
}

// rows is table's row count in s.
func (s snapshot) rows(table string) int64 {
	i := slices.Index(s.tables, table)
	n, _, _ := strings.Cut(s.sums[i], ":")
	rows, _ := strconv.ParseInt(n, 10, 64)
	return rows
}

// snapshotQuery builds one statement that reads, for every table, its row count and two
// checksums over every row's columns, in one round trip. The outbox's delivery columns are left
// out: the fast path marks rows published after the request that wrote them has answered.
func snapshotQuery(t *testing.T, db *sql.DB) (string, []string) {
	ctx := context.Background()
	rows, err := db.QueryContext(ctx, `SELECT c.TABLE_NAME, c.COLUMN_NAME FROM information_schema.COLUMNS c
		JOIN information_schema.TABLES t ON t.TABLE_SCHEMA = c.TABLE_SCHEMA AND t.TABLE_NAME = c.TABLE_NAME
		WHERE c.TABLE_SCHEMA = DATABASE() AND t.TABLE_TYPE = 'BASE TABLE' AND c.EXTRA NOT LIKE '%VIRTUAL%'
		AND c.EXTRA NOT LIKE '%STORED%' ORDER BY c.TABLE_NAME, c.ORDINAL_POSITION`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols := map[string][]string{}
	var tables []string
	for rows.Next() {
		var tbl, col string
		if err := rows.Scan(&tbl, &col); err != nil {
			t.Fatal(err)
		}
		if tbl == "outbox" && (col == "published_at" || col == "attempts" || col == "last_error") {
			continue
		}
		// A refusal's one write by design is its audit event (SPEC §10), queued and flushed
		// in the background, so it lands between later requests: TestAuditRefusals covers it.
		if tbl == "audit_events" {
			continue
		}
		if _, ok := cols[tbl]; !ok {
			tables = append(tables, tbl)
		}
		cols[tbl] = append(cols[tbl], "IFNULL(HEX(`"+col+"`),'-')")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var parts []string
	for _, tbl := range tables {
		row := "CRC32(CONCAT_WS('|'," + strings.Join(cols[tbl], ",") + "))"
		parts = append(parts, fmt.Sprintf("(SELECT CONCAT(COUNT(*), ':', IFNULL(BIT_XOR(%s),0), ':', IFNULL(SUM(%s),0)) FROM `%s`)", row, row, tbl))
	}
	return "SELECT " + strings.Join(parts, ", "), tables
}

func (h *hostile) snapshot() snapshot {
	h.t.Helper()
	s := snapshot{tables: h.tables, sums: make([]string, len(h.tables))}
	dest := make([]any, len(s.sums))
	for i := range s.sums {
		dest[i] = &s.sums[i]
	}
	if err := h.env.DB.QueryRowContext(context.Background(), h.snapQuery).Scan(dest...); err != nil {
		h.t.Fatal(err)
	}
	return s
}

// setUp writes the jobs the fuzz aims at: queued jobs of both tenants, and dispatched jobs whose
// nonces it knows, so that /start and /complete sometimes succeed, and some then fail so that
// redrive can.
func (h *hostile) setUp() {
	t, ctx := h.t, context.Background()
	for i := range 6 {
		for _, tenant := range []string{scopedTenant, otherTenant} {
			body := map[string]any{"tenant": tenant, "payload": map[string]any{"n": i}, "idempotency_key": fmt.Sprintf("k-%d", i)}
			if tenant == otherTenant {
				body["payload"] = map[string]any{"secret": otherSecret, "n": i}
				body["idempotency_key"] = fmt.Sprintf("%s-%d", otherSecret, i)
			}
			r := h.env.Do(t, http.MethodPost, "/v1/jobs", namedAdminToken, body)
			if r.Status != http.StatusAccepted {
				t.Fatalf("set up: HTTP %d %s", r.Status, r.Raw)
			}
			h.addJob(tenant, int64(r.Body["id"].(float64)))
			if tenant == scopedTenant {
				h.storyIDs = append(h.storyIDs, int64(r.Body["id"].(float64)))
			}
		}
	}
	for i := range 40 {
		tenant := []string{scopedTenant, otherTenant}[i%2]
		nonce := fmt.Sprintf("fz-nonce-%d", i)
		payload := `{"n":1}`
		if tenant == otherTenant {
			payload = fmt.Sprintf(`{"secret":%q}`, otherSecret)
		}
		res, err := h.env.DB.ExecContext(ctx, `INSERT INTO jobs (tenant, status, version, attempt, queued_at,
			claimed_at, dispatched_at, lease_until, drainer_id, nonce_sha256, nonce_expires_at, payload, rate_key_sha256)
			VALUES (?, 'dispatched', 1, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
			UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, 'fz', ?, UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, ?, ?)`,
			tenant, store.HashNonce(nonce), payload, gate.RateKeyHash(doneKey))
		if err != nil {
			t.Fatal(err)
		}
		id, _ := res.LastInsertId()
		h.addJob(tenant, id)
		h.nonces = append(h.nonces, nonce)
		h.nonceOf[id] = nonce
		h.sentNonce[id] = nonce
		switch {
		case i < 2: // ended failed: redrive's material
			delete(h.nonceOf, id)
			h.failedIDs = append(h.failedIDs, id)
			r := h.env.Do(t, http.MethodPost, fmt.Sprintf("/v1/jobs/%d/complete", id), harness.ExecutorToken,
				map[string]any{"nonce": nonce, "status": "failed", "error_code": "boom"})
			if r.Status != http.StatusOK {
				t.Fatalf("set up: complete: HTTP %d %s", r.Status, r.Raw)
			}
		case i < 4: // ended failed by a drainer, whose id the job's events name
			delete(h.nonceOf, id)
			h.failedIDs = append(h.failedIDs, id)
			h.drainerFails(id, nonce)
			if tenant == scopedTenant {
				h.storyIDs = append(h.storyIDs, id)
			}
		}
	}
	h.hashes = []string{gate.RateKeyHash("rk-1"), gate.RateKeyHash("rk-2")}
	h.keys = []string{"k-1", "k-2", otherSecret + "-1", "fz-key"}
	// Room beside the 36 dispatched jobs, so that slot requests (SPEC §5a) can be granted, and
	// slots of the scoped producer's for renewals and releases to find.
	if r := h.env.Do(t, http.MethodPatch, "/v1/config", harness.AdminToken, map[string]any{
		"changes": map[string]any{"global_in_flight": 200, "tenant_in_flight": 100}, "note": "fuzz"}); r.Status != http.StatusOK {
		t.Fatalf("set up: config: HTTP %d %s", r.Status, r.Raw)
	}
	for i := range 6 {
		r := h.env.Do(t, http.MethodPost, "/v1/slots", scopedToken, map[string]any{"tenant": scopedTenant, "lease_seconds": 900})
		if r.Status != http.StatusCreated {
			t.Fatalf("set up: slot: HTTP %d %s", r.Status, r.Raw)
		}
		if i < 4 {
			h.slotIDs = append(h.slotIDs, int64(r.Body["id"].(float64)))
		} else {
			h.keptSlotIDs = append(h.keptSlotIDs, int64(r.Body["id"].(float64)))
		}
	}
}

// drainerFails records job id failed as a drainer does, under its id.
func (h *hostile) drainerFails(id int64, nonce string) {
	t, ctx := h.t, context.Background()
	tx, err := h.env.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	now := time.Now().UTC().Truncate(time.Microsecond)
	if _, _, err := (&store.Store{Actor: namedDrainer}).Complete(ctx, tx, now, id,
		store.Completion{Nonce: nonce, Status: "failed", ErrorCode: "boom"}); err != nil {
		t.Fatalf("set up: a drainer's outcome: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

func (h *hostile) addJob(tenant string, id int64) {
	h.anyIDs = append(h.anyIDs, id)
	if tenant == scopedTenant {
		h.ownIDs = append(h.ownIDs, id)
	} else {
		h.otherIDs = append(h.otherIDs, id)
	}
}

func (h *hostile) chance(p float64) bool { return h.rng.Float64() < p }

func pick[T any](h *hostile, xs ...T) T { return xs[h.rng.IntN(len(xs))] }

// either picks one of good, or while the request is not honest one of good and bad.
func either[T any](h *hostile, good []T, bad ...T) T {
	if h.honest || h.chance(0.4) {
		return pick(h, good...)
	}
	return pick(h, bad...)
}

// hostileChance is chance(p), never while the request is honest.
func (h *hostile) hostileChance(p float64) bool { return !h.honest && h.chance(p) }

// request builds the next hostile request.
func (h *hostile) request() hostileReq {
	if h.chance(0.04) {
		return h.forgedCompletion()
	}
	q := hostileReq{header: http.Header{}}
	h.honest = h.chance(0.35)
	q.caller = pick(h, asNone, asInvalid, asScoped, asScoped, asStar, asExecutor, asExecutor, asAdmin, asAdmin)
	if h.hostileChance(0.06) {
		q.method = pick(h, "GET", "POST", "DELETE", "PATCH")
		q.path = pick(h, "/", "/v1", "/v1/", "/v1/jobs/", "/v1/jobs//1", "/v1/jobs/1/", "/v1/jobs/1/start/x",
			"/v1/JOBS", "/v2/jobs", "/v1/jobs:batch/", "/v1/jobs%3Abatch", "/v1/jobs/%2e%2e/status", "/v1/./status",
			"/v1/config/history/x", "/metrics/x", "/v1/gates/", "/v1/jobs/1/redrive/", "/"+strings.Repeat("a", 4000))
	} else {
		q.route = pick(h, h.routes...)
		method, pattern, _ := strings.Cut(q.route, " ")
		q.method = method
		for h.honest && !mayCall(q.route, q.caller) {
			q.caller = pick(h, asScoped, asStar, asExecutor, asAdmin)
		}
		if h.hostileChance(0.2) {
			q.method = pick(h, "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE", "PROPFIND", "get")
		}
		q.path, q.id = h.fillPath(q.route, pattern, q.caller)
		q.path += h.query(q.route)
		q.body = h.body(q.route, q.caller, q.id)
	}
	q.auth = h.authFor(q.caller)
	h.headers(&q)
	if h.hostileChance(0.3) {
		q.body = h.mutate(q.body)
	}
	q.chunked = h.chance(0.1)
	return q
}

// forgedCompletion is a well-formed /complete with a gate on a dispatched job, from a caller
// that may report outcomes, carrying a nonce that is not the one sluice sent with that job: another
// job's, or made up. It must be refused and gate nothing.
func (h *hostile) forgedCompletion() hostileReq {
	h.honest = false
	id := pick(h, slices.Sorted(maps.Keys(h.sentNonce))...)
	nonce := pick(h, h.nonces...)
	if nonce == h.sentNonce[id] || h.chance(0.3) {
		nonce = "forged-" + strconv.Itoa(h.rng.IntN(1000))
	}
	body, err := json.Marshal(map[string]any{"nonce": nonce, "status": pick(h, "succeeded", "failed", "not_started"),
		"gate": map[string]any{"retry_after": pick(h, 1, 30, 86400)}})
	if err != nil {
		h.t.Fatal(err)
	}
	c := pick(h, asExecutor, asAdmin)
	q := hostileReq{route: "POST /v1/jobs/{id}/complete", id: id, method: http.MethodPost,
		path: fmt.Sprintf("/v1/jobs/%d/complete", id), caller: c, header: http.Header{}, body: body}
	q.header.Set("Content-Type", "application/json")
	q.auth = h.authFor(c)
	return q
}

// fillPath fills pattern's {id} and {rate_key_sha256}, and returns the job id it named, if any.
func (h *hostile) fillPath(route, pattern string, c caller) (string, int64) {
	var named int64
	id := func() string {
		if h.honest {
			switch {
			case route == "POST /v1/jobs/{id}/redrive" && len(h.failedIDs) > 0:
				named = pick(h, h.failedIDs...)
			case (strings.HasPrefix(route, "POST /v1/slots/") || strings.HasPrefix(route, "DELETE /v1/slots/")) && c == asStar:
				// Another caller's live slots: refused as if missing, never released.
				return strconv.FormatInt(pick(h, h.keptSlotIDs...), 10)
			case strings.HasPrefix(route, "POST /v1/slots/") || strings.HasPrefix(route, "DELETE /v1/slots/"):
				return strconv.FormatInt(pick(h, h.slotIDs...), 10) // not a job: named stays 0
			case route == "GET /v1/jobs/{id}/events" && (c == asScoped || c == asStar) && h.chance(0.5):
				named = pick(h, h.storyIDs...)
			case strings.HasSuffix(route, "/start") || strings.HasSuffix(route, "/complete"):
				if ids := slices.Sorted(maps.Keys(h.nonceOf)); len(ids) > 0 {
					named = pick(h, ids...)
				}
			case c == asScoped:
				named = pick(h, h.ownIDs...)
			default:
				named = pick(h, h.anyIDs...)
			}
			if named != 0 {
				return strconv.FormatInt(named, 10)
			}
		}
		switch h.rng.IntN(10) {
		case 0, 1, 2:
			return strconv.FormatInt(pick(h, h.ownIDs...), 10)
		case 3, 4, 5:
			return strconv.FormatInt(pick(h, h.otherIDs...), 10)
		case 6:
			return strconv.FormatInt(pick(h, h.anyIDs...), 10)
		}
		return pick(h, "0", "-1", "abc", "9223372036854775808", "1e3", "00001", "%20", "%00",
			"١٢٣", strings.Repeat("9", 3000), "1;DROP%20TABLE%20jobs", "0x10", "+1")
	}
	hash := func() string {
		if h.honest || h.chance(0.5) {
			return pick(h, h.hashes...)
		}
		return pick(h, "", "abc", strings.Repeat("g", 64), strings.ToUpper(h.hashes[0]), strings.Repeat("a", 65), "%ff")
	}
	pattern = strings.Replace(pattern, "{id}", id(), 1)
	return strings.Replace(pattern, "{rate_key_sha256}", hash(), 1), named
}

func (h *hostile) query(route string) string {
	if h.honest {
		if route == "GET /v1/config/history" && h.chance(0.5) {
			q := "?limit=" + pick(h, "1", "2", "1000")
			if len(h.cursors) > 0 && h.chance(0.5) {
				q += "&cursor=" + pick(h, h.cursors...)
			}
			return q
		}
		if route == "GET /v1/jobs" && h.chance(0.5) {
			q := "?limit=" + pick(h, "1", "3", "50")
			if len(h.cursors) > 0 && h.chance(0.5) {
				q += "&cursor=" + pick(h, h.cursors...)
			}
			return q
		}
		return ""
	}
	if !strings.HasPrefix(route, "GET ") || h.chance(0.3) {
		if h.chance(0.05) {
			return "?" + pick(h, "x=1", "tenant=fz-b", "limit=-1", "%zz", "a=%ff")
		}
		return ""
	}
	var params []string
	add := func(k, v string) { params = append(params, k+"="+v) }
	if h.chance(0.5) {
		add("tenant", pick(h, scopedTenant, otherTenant, "*", "", "fz-new", "%E2%80%8B", "a%00b", strings.Repeat("t", 300), "%ff"))
	}
	if h.chance(0.4) {
		add("status", pick(h, "queued", "failed", "dispatched", "bogus", "", "QUEUED"))
	}
	if h.chance(0.5) {
		add("limit", pick(h, "1", "2", "1000", "1001", "0", "-5", "x", "99999999999999999999", "1.5"))
	}
	if h.chance(0.5) {
		c := pick(h, "", "x", "%ff", base64.RawURLEncoding.EncodeToString([]byte("before:-1")),
			base64.RawURLEncoding.EncodeToString([]byte("before:abc")), base64.RawURLEncoding.EncodeToString([]byte("depth:1:"+otherTenant)),
			base64.RawURLEncoding.EncodeToString([]byte("name:"+otherTenant)), strings.Repeat("A", 5000))
		if len(h.cursors) > 0 && h.chance(0.5) {
			c = pick(h, h.cursors...)
		}
		add("cursor", c)
	}
	if h.chance(0.3) {
		add("order", pick(h, "name", "depth", "bogus"))
	}
	if h.chance(0.1) {
		params = append(params, params...) // every parameter twice
	}
	if len(params) == 0 {
		return ""
	}
	return "?" + strings.Join(params, "&")
}

func (h *hostile) authFor(c caller) string {
	var tok string
	switch c {
	case asNone:
		return ""
	case asInvalid:
		tok = pick(h, "", "x", "test-secret", harness.AdminToken[:len(harness.AdminToken)-1]+"X",
			strings.Repeat("z", 40), harness.AdminToken+" "+harness.AdminToken, "Bearer "+harness.AdminToken)
		return pick(h, "Bearer "+tok, "Basic "+base64.StdEncoding.EncodeToString([]byte("admin:"+harness.AdminToken)),
			harness.AdminToken, "Bearer", "Token "+harness.AdminToken)
	case asScoped:
		tok = scopedToken
	case asStar:
		tok = harness.ProducerToken
	case asExecutor:
		tok = harness.ExecutorToken
	case asAdmin:
		tok = harness.AdminToken
	}
	if h.honest {
		return "Bearer " + tok
	}
	return pick(h, "Bearer "+tok, "Bearer "+tok, "bearer "+tok, "BEARER  "+tok+" ", "Bearer "+tok+"\t")
}

func (h *hostile) headers(q *hostileReq) {
	if h.honest {
		q.header.Set("Content-Type", "application/json")
		return
	}
	q.header.Set("Content-Type", pick(h, "application/json", "application/json", "text/plain", "",
		"application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/json; charset=latin1"))
	if h.chance(0.1) {
		q.header.Set("X-Forwarded-For", pick(h, "10.0.0.1", "::1", "garbage", "1.2.3.4, 5.6.7.8"))
	}
	if h.chance(0.05) {
		q.header.Set("Content-Encoding", "gzip")
	}
	if h.chance(0.05) {
		q.header.Set("Idempotency-Key", otherSecret+"-1")
	}
	if h.chance(0.05) {
		q.header.Set("X-Padding", strings.Repeat("p", 16<<10))
	}
	if h.chance(0.05) {
		q.header.Set("Accept", pick(h, "text/html", "application/xml", "*/*"))
	}
}

// jsonValue is a random JSON value of at most depth levels.
func (h *hostile) jsonValue(depth int) any {
	n := 7
	if depth <= 0 {
		n = 5
	}
	switch h.rng.IntN(n) {
	case 0:
		return nil
	case 1:
		return h.chance(0.5)
	case 2:
		return pick[any](h, 0, -1, 1.5, 1e300, 9007199254740993, 42)
	case 3:
		return pick(h, "", "x", "ü\u200b\u202e", "\u0000", strings.Repeat("s", 1000))
	case 4:
		return pick(h, "fz-a", "fz-b", "*")
	case 5:
		arr := make([]any, h.rng.IntN(4))
		for i := range arr {
			arr[i] = h.jsonValue(depth - 1)
		}
		return arr
	}
	obj := map[string]any{}
	for range h.rng.IntN(4) {
		obj[pick(h, "a", "tenant", "id", "status", "nonce", "", "\u202e")] = h.jsonValue(depth - 1)
	}
	return obj
}

// tenant is a tenant name for c to name.
func (h *hostile) tenant(c caller) any {
	if h.honest {
		if c == asScoped {
			return scopedTenant
		}
		return pick(h, scopedTenant, otherTenant, "fz-new-"+strconv.Itoa(h.rng.IntN(20)))
	}
	return pick[any](h, scopedTenant, scopedTenant, otherTenant, "fz-new-"+strconv.Itoa(h.rng.IntN(20)), "*", "",
		"a b", "ten\u200bant", "\u202ertl", strings.Repeat("t", 300), "ok-ü", "nul\x00x", 123, nil, []any{"fz-a"})
}

func (h *hostile) admission(c caller) map[string]any {
	m := map[string]any{"tenant": h.tenant(c)}
	if h.chance(0.7) {
		m["payload"] = h.jsonValue(3)
	}
	if h.hostileChance(0.03) {
		m["payload"] = strings.Repeat("p", 300<<10) // above max_payload_bytes
	}
	if h.chance(0.4) {
		m["idempotency_key"] = either[any](h, []any{pick(h, h.keys...), "k-" + strconv.Itoa(h.rng.IntN(5))}, "", strings.Repeat("k", 300), 7)
	}
	if h.chance(0.3) {
		m["rate_key"] = either[any](h, []any{"rk-1", "rk-2"}, "", strings.Repeat("r", 2000), false)
	}
	if h.chance(0.3) {
		m["queue"] = either[any](h, []any{true, false}, "yes", 0)
	}
	if h.hostileChance(0.1) {
		m[pick(h, "id", "status", "extra", "not_before")] = h.jsonValue(1)
	}
	return m
}

// body is a body for route, sent by c about job id (0: none).
func (h *hostile) body(route string, c caller, id int64) []byte {
	var v any
	switch route {
	case "POST /v1/jobs":
		v = h.admission(c)
	case "POST /v1/jobs:batch":
		n := either(h, []int{1, 2, 3, 5, 8}, 0, 70, 1001)
		jobs := make([]any, n)
		for i := range jobs {
			switch {
			case i >= 8: // the many items of a large batch are plain, to keep it a small body
				jobs[i] = map[string]any{"tenant": h.tenant(c)}
			case h.hostileChance(0.1):
				jobs[i] = h.jsonValue(1)
			default:
				jobs[i] = h.admission(c)
			}
		}
		v = map[string]any{"jobs": jobs}
		if h.hostileChance(0.1) {
			v = map[string]any{"jobs": h.jsonValue(1)}
		}
	case "POST /v1/jobs/{id}/start":
		m := map[string]any{"nonce": h.nonce(id)}
		if h.chance(0.7) {
			// Two attempts share a few names, so that a start repeats itself and a replay
			// comes with another attempt's name.
			m["start_id"] = either[any](h, []any{"attempt-1", "attempt-2", ""}, strings.Repeat("s", 129), 5, nil,
				[]any{"attempt-1"})
		}
		v = m
	case "POST /v1/jobs/{id}/complete":
		m := map[string]any{"nonce": h.nonce(id),
			"status": either[any](h, []any{"succeeded", "failed", "not_started"}, "", "lost", 1)}
		if h.chance(0.5) {
			m["error_code"] = either[any](h, []any{"E1"}, "", strings.Repeat("e", 200), "bad\u0001code", 5)
		}
		if h.chance(0.3) {
			m["error_message"] = either[any](h, []any{"m", nil}, strings.Repeat("m", 70000))
		}
		if h.chance(0.5) {
			m["result"] = h.jsonValue(2)
		}
		if h.chance(0.3) {
			m["gate"] = either[any](h, []any{map[string]any{"retry_after": pick(h, 1, 30)}},
				map[string]any{"retry_after": pick[any](h, 0, -5, 86401, "x", nil, 1.5)}, map[string]any{}, "x")
		}
		v = m
	case "POST /v1/gates":
		m := map[string]any{}
		switch either(h, []int{0, 1}, 2, 3) {
		case 0:
			m["rate_key"] = either[any](h, []any{"rk-1", "rk-2"}, "", strings.Repeat("r", 2000), 3)
		case 1:
			m["rate_key_sha256"] = either[any](h, []any{h.hashes[0], strings.ToUpper(h.hashes[1])}, "abc", strings.Repeat("z", 64))
		case 2:
			m["rate_key"], m["rate_key_sha256"] = "rk-1", h.hashes[0]
		}
		if h.honest || h.chance(0.8) {
			m["retry_after"] = either[any](h, []any{1, 30, 86400}, 0, -1, 86401, json.Number("1e400"), "5", nil)
		}
		v = m
	case "POST /v1/releases":
		v = map[string]any{"tenant": h.tenant(c)}
	case "POST /v1/slots":
		m := map[string]any{"tenant": h.tenant(c)}
		if h.chance(0.3) {
			m["lanes"] = either[any](h, []any{[]string{}}, []string{"no-such-lane"}, "x", 3)
		}
		if h.chance(0.3) {
			m["interactive"] = either[any](h, []any{true, false}, "yes", 1)
		}
		if h.chance(0.5) {
			m["lease_seconds"] = either[any](h, []any{5, 60, 900}, 4, 901, -1, "60", json.Number("1e400"))
		}
		v = m
	case "PATCH /v1/config":
		changes := map[string]any{}
		for range h.rng.IntN(3) + 1 {
			k, val := h.configChange()
			changes[k] = val
		}
		v = map[string]any{"changes": changes, "note": either[any](h, []any{"fuzz", ""}, strings.Repeat("n", 10001), 5)}
		if h.hostileChance(0.1) {
			v = map[string]any{"changes": h.jsonValue(1)}
		}
	case "POST /v1/config/simulate":
		m := map[string]any{}
		if h.chance(0.7) {
			k, val := h.configChange()
			m["changes"] = map[string]any{k: val}
		}
		if h.chance(0.5) {
			m["since"] = either[any](h, []any{"1h", "15m", "-2h"}, "25h", "yesterday", "", 5)
		}
		if h.chance(0.2) {
			m["until"] = either[any](h, []any{"1m", "2030-01-01T00:00:00Z"}, "2h", "soon", false)
		}
		v = m
		if h.hostileChance(0.1) {
			v = h.jsonValue(2)
		}
	default:
		if h.hostileChance(0.1) {
			v = h.jsonValue(2)
		} else {
			return nil
		}
	}
	raw, err := json.Marshal(v)
	if err != nil {
		h.t.Fatalf("marshal %v: %v", v, err)
	}
	return raw
}

// nonce is a nonce for job id: its own while the request is honest.
func (h *hostile) nonce(id int64) any {
	if n, ok := h.nonceOf[id]; ok && h.honest {
		return n
	}
	if h.chance(0.5) {
		return pick(h, h.nonces...)
	}
	return pick[any](h, "", "wrong", strings.Repeat("n", 5000), 5, nil, []any{"x"})
}

// configChange is one key of a PATCH /v1/config and its new value. An honest one keeps the
// service able to admit: caps stay at least their defaults, the mode one of the three.
func (h *hostile) configChange() (string, any) {
	if h.honest {
		kv := pick(h, []any{"tenant_queue_depth", pick(h, 3, 500)}, []any{"global_queue_depth", 2000},
			[]any{"admission_mode", pick(h, "enforce", "shadow", "off")}, []any{"ordering", pick(h, "fifo", "fair")},
			[]any{"admission_rate_per_minute", pick(h, 0, 5, 100000)}, []any{"max_payload_bytes", pick(h, 262144, config.MaxPayloadCap)},
			[]any{"tenant_in_flight_overrides", map[string]any{scopedTenant: 1}}, []any{"retention_days", 30})
		return kv[0].(string), kv[1]
	}
	k := pick(h, "global_in_flight", "tenant_in_flight", "tenant_in_flight_overrides", "tenant_queue_depth",
		"global_queue_depth", "admission_mode", "admission_rate_per_minute", "ordering", "execution_wall_seconds",
		"max_queue_age_seconds", "lease_seconds", "nonce_ttl_seconds", "dispatch_attempts", "max_payload_bytes",
		"retention_days", "outbox_retention_days", "bogus", "")
	return k, pick[any](h, 1, 2, 3, 10, 0, -1, 1e12, 2147483648, config.MaxPayloadCap+1, 16<<20, "enforce", "shadow",
		"off", "fifo", "fair", nil, true, map[string]any{"fz-a": 1}, map[string]any{"": -1}, []any{1})
}

// mutate breaks a body: truncated, with invalid UTF-8, replaced by another JSON type or by
// nonsense, nested deep, or huge.
func (h *hostile) mutate(b []byte) []byte {
	switch h.rng.IntN(9) {
	case 0:
		if len(b) > 1 {
			return b[:h.rng.IntN(len(b))]
		}
	case 1:
		if len(b) > 0 {
			at := h.rng.IntN(len(b))
			return append(append(append([]byte{}, b[:at]...), 0xff, 0xfe), b[at:]...)
		}
		return []byte{0xff}
	case 2:
		return []byte(pick(h, "[]", `"str"`, "42", "null", "true", "", "{", `{"a":}`, "{}", `{"tenant":"fz-a","tenant":"fz-b"}`, "\ufeff{}"))
	case 3:
		return []byte(strings.Repeat("[", 20000) + strings.Repeat("]", 20000))
	case 4:
		if h.chance(0.3) {
			big := make([]byte, 1<<20+h.rng.IntN(1<<20))
			var seed [32]byte
			binary.LittleEndian.PutUint64(seed[:], h.rng.Uint64())
			_, _ = rand.NewChaCha8(seed).Read(big)
			return big
		}
	case 5:
		return []byte(`{"jobs":[` + strings.Repeat(`{"tenant":"fz-a"},`, 1001) + `{}]}`)
	case 6:
		return []byte(strings.Replace(string(b), `"`, `'`, -1))
	case 7:
		return append(b, []byte(" trailing")...)
	}
	return b
}

// one sends q and checks its answer and what it wrote.
func (h *hostile) one(i int, q hostileReq) {
	t := h.t
	t.Helper()
	// Nothing else writes (the App runs the API role only: no drainer, no relay), so the
	// tables are as the previous request left them.
	before := h.last
	complete := q.route == "POST /v1/jobs/{id}/complete"
	var gateBefore time.Time
	var gatedBefore bool
	if complete {
		gateBefore, gatedBefore = h.doneGate()
	}
	a, err := h.send(i, q)
	if err != nil {
		t.Fatal(err)
	}
	after := h.snapshot()
	if complete && a.status >= 300 && !h.ownNonce(q) {
		if nb, ok := h.doneGate(); ok && (!gatedBefore || nb.After(gateBefore)) {
			t.Errorf("%s: a refused /complete without the job's own nonce gated its rate key until %s", a.what, nb)
		}
	}
	if q.route == "DELETE /v1/slots/{id}" && q.caller == asStar && slices.Contains(h.keptSlotIDs, h.pathSlot(q)) {
		if c := before.changed(after); len(c) > 0 {
			t.Errorf("%s: another caller's release of a slot changed %v", a.what, c)
		}
	}
	h.last = after
	h.statuses[a.status]++
	if a.status < 300 {
		h.succeeded[q.route]++
	}
	h.checkAnswer(q, a)
	h.checkWrites(a.what, q, a.status, a.code, a.body, before, after)
	h.learn(q, a.status, a.body)
}

// answer is what came back for a request.
type answer struct {
	what   string // the request and its answer, for messages
	status int
	header http.Header
	raw    []byte
	body   map[string]any // raw as a JSON object, if it is one
	code   string         // its error_code
}

// send sends q, the i-th request. Safe for concurrent use.
func (h *hostile) send(i int, q hostileReq) (answer, error) {
	var rd io.Reader
	if q.body != nil {
		rd = bytes.NewReader(q.body)
		if q.chunked {
			rd = io.MultiReader(rd) // no length known: sent chunked
		}
	}
	req, err := http.NewRequest(q.method, h.env.URL+q.path, rd)
	if err != nil {
		return answer{}, fmt.Errorf("request %d: %w", i, err)
	}
	req.Header = q.header
	if q.auth != "" {
		req.Header.Set("Authorization", q.auth)
	}
	what := fmt.Sprintf("request %d: %s %s as %s (%d-byte body)", i, q.method, trimmed(q.path), callerNames[q.caller], len(q.body))
	resp, err := h.http.Do(req)
	if err != nil {
		return answer{}, fmt.Errorf("%s: %w", what, err)
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return answer{}, fmt.Errorf("%s: read the answer: %w", what, err)
	}
	a := answer{what: what + fmt.Sprintf(": HTTP %d %s", resp.StatusCode, trimmed(string(raw))),
		status: resp.StatusCode, header: resp.Header, raw: raw}
	if json.Unmarshal(raw, &a.body) == nil {
		a.code, _ = a.body["error_code"].(string)
	}
	return a, nil
}

// checkAnswer: JSON with a stable error_code or a success, never a 5xx but 503 busy or
// unavailable, no success for a caller the route does not allow, and nothing of another tenant's
// for the scoped producer. Safe for concurrent use.
func (h *hostile) checkAnswer(q hostileReq, a answer) {
	t := h.t
	t.Helper()
	switch {
	case a.status >= 500 && !(a.status == 503 && (a.code == "busy" || a.code == "unavailable")):
		t.Errorf("%s: a server error", a.what)
	case a.status >= 400 && q.method != http.MethodHead && (a.body == nil || !h.codes[a.code]):
		t.Errorf("%s: an error answer without a stable error_code", a.what)
	case a.status >= 300 && a.status < 400 && a.header.Get("Location") == "":
		t.Errorf("%s: a redirect to nowhere", a.what)
	case a.status < 300 && q.method != http.MethodHead && q.route != "GET /metrics" && a.status != http.StatusNoContent && !json.Valid(a.raw):
		t.Errorf("%s: a success that is not JSON", a.what)
	}
	if a.status < 300 && q.route != "" && !mayCall(q.route, q.caller) {
		t.Errorf("%s: %s may not call %s", a.what, callerNames[q.caller], q.route)
	}
	if q.caller == asScoped || q.caller == asStar {
		for _, name := range []string{namedAdmin, namedDrainer} {
			if bytes.Contains(a.raw, []byte(name)) {
				t.Errorf("%s: a producer was shown the name %q", a.what, name)
			}
		}
	}
	if q.caller == asScoped {
		h.checkScoped(a.what, q, a.raw)
	}
	if q.route == "DELETE /v1/slots/{id}" && q.method == http.MethodDelete && a.status == http.StatusNotFound && h.pathSlot(q) > 0 {
		// 404 is for an id that is none at all: another caller's slot answers as a missing one.
		t.Errorf("%s: a release answered 404 for a slot id, telling whether it is someone's live slot", a.what)
	}
	if q.route == "GET /v1/config/history" && q.method == http.MethodGet && a.status == http.StatusOK {
		limit := 50
		if u, err := url.Parse(q.path); err == nil && u.Query().Has("limit") {
			limit, _ = strconv.Atoi(u.Query().Get("limit"))
		}
		if hist, _ := a.body["history"].([]any); len(hist) > limit {
			t.Errorf("%s: %d changes on a page of at most %d", a.what, len(hist), limit)
		}
		if _, ok := a.body["next_cursor"]; !ok {
			t.Errorf("%s: a history page without next_cursor", a.what)
		}
	}
}

// pathSlot is the slot id q's path names as the server reads it, or 0.
func (h *hostile) pathSlot(q hostileReq) int64 {
	n, err := strconv.ParseInt(strings.TrimPrefix(pathOnly(q.path), "/v1/slots/"), 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// doneGate reads the gate of doneKey: when it ends, and whether there is one.
func (h *hostile) doneGate() (time.Time, bool) {
	h.t.Helper()
	nb, ok, err := h.env.App.RateGates().Get(context.Background(), gate.RateKeyHash(doneKey))
	if err != nil {
		h.t.Fatal(err)
	}
	return nb, ok
}

// ownNonce reports whether q, a /complete, carries the nonce sluice sent with the job its path
// names.
func (h *hostile) ownNonce(q hostileReq) bool {
	id, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(pathOnly(q.path), "/v1/jobs/"), "/complete"), 10, 64)
	if err != nil {
		return false
	}
	var body struct {
		Nonce string `json:"nonce"`
	}
	if json.Unmarshal(q.body, &body) != nil {
		return false
	}
	n, ok := h.sentNonce[id]
	return ok && body.Nonce == n
}

// checkWrites: a refused request writes nothing (a depth-cap refusal writes its rejected job),
// an admission exactly the jobs it admitted.
func (h *hostile) checkWrites(what string, q hostileReq, status int, code string, body map[string]any, before, after snapshot) {
	t := h.t
	t.Helper()
	jobsDelta := after.rows("jobs") - before.rows("jobs")
	changed := func(skip ...string) []string { return before.changed(after, skip...) }
	admission := status < 300 && (q.method == http.MethodPost && (q.route == "POST /v1/jobs" || q.route == "POST /v1/jobs:batch"))
	switch {
	case status >= 300 && code == string(job.CodeQueueFull):
		// SPEC §5: the refusal is recorded as a rejected job, whose tenant row it may create.
		if jobsDelta != 1 {
			t.Errorf("%s: a depth-cap refusal wrote %d jobs, want its one rejected job", what, jobsDelta)
		}
		if c := changed("jobs", "tenants"); len(c) > 0 {
			t.Errorf("%s: a depth-cap refusal changed %v", what, c)
		}
	case status >= 300:
		if c := changed(); len(c) > 0 {
			t.Errorf("%s: a refused request changed %v", what, c)
		}
	case admission && q.route == "POST /v1/jobs":
		want := int64(1)
		if status == http.StatusOK { // a replay
			want = 0
		}
		if jobsDelta != want {
			t.Errorf("%s: wrote %d jobs, want %d", what, jobsDelta, want)
		}
	case admission:
		results, _ := body["results"].([]any)
		want := int64(0)
		for _, r := range results {
			it, _ := r.(map[string]any)
			st, _ := it["status"].(float64)
			if st == http.StatusAccepted {
				want++
			} else if e, _ := it["error"].(map[string]any); e != nil && e["error_code"] == string(job.CodeQueueFull) {
				want++
			}
		}
		if jobsDelta != want {
			t.Errorf("%s: wrote %d jobs, want %d (its items admitted or rejected at a depth cap)", what, jobsDelta, want)
		}
	}
}

// checkScoped: no answer to the producer scoped to scopedTenant names another tenant's job, or
// shows another tenant's secret unless its own request carried it.
func (h *hostile) checkScoped(what string, q hostileReq, raw []byte) {
	t := h.t
	t.Helper()
	mentioned := bytes.Contains(q.body, []byte(otherSecret)) || strings.Contains(q.path, otherSecret) ||
		strings.Contains(q.header.Get("Idempotency-Key"), otherSecret)
	if !mentioned && bytes.Contains(raw, []byte(otherSecret)) {
		t.Errorf("%s: the scoped producer was shown another tenant's data", what)
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return
	}
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if tn, ok := x["tenant"].(string); ok && tn != scopedTenant {
				if _, isJob := x["id"]; isJob {
					t.Errorf("%s: the scoped producer was shown a job of tenant %q", what, tn)
				}
			}
			for _, e := range x {
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
}

// checkQueueState: every tenant's queue state (migration 0010: its queued count and head job)
// is what its jobs say, whatever the requests did.
func (h *hostile) checkQueueState() {
	t := h.t
	t.Helper()
	rows, err := h.env.DB.QueryContext(context.Background(), `SELECT tenant, queued, IFNULL(head_id, 0), n, IFNULL(head, 0) FROM (
		SELECT t.tenant, t.queued, t.head_id,
			(SELECT COUNT(*) FROM jobs j WHERE j.status = 'queued' AND j.tenant = t.tenant) AS n,
			(SELECT j.id FROM jobs j WHERE j.status = 'queued' AND j.tenant = t.tenant ORDER BY j.queued_at, j.id LIMIT 1) AS head
		FROM tenants t) x WHERE queued <> n OR NOT (head_id <=> head)`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var tenant string
		var queued, head, n, want int64
		if err := rows.Scan(&tenant, &queued, &head, &n, &want); err != nil {
			t.Fatal(err)
		}
		t.Errorf("tenant %q: queue state says %d queued, head %d; its jobs say %d, head %d", tenant, queued, head, n, want)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}

// learn keeps what an answer gave away for later requests: job ids, cursors, which nonces are
// spent and which jobs failed.
func (h *hostile) learn(q hostileReq, status int, body map[string]any) {
	if status >= 300 || body == nil {
		return
	}
	if q.route == "POST /v1/jobs/{id}/complete" || q.route == "DELETE /v1/jobs/{id}" {
		if id, ok := body["id"].(float64); ok {
			if st, _ := body["status"].(string); st != string(job.Running) && st != string(job.Dispatched) {
				delete(h.nonceOf, int64(id))
				if st == string(job.Failed) {
					h.failedIDs = append(h.failedIDs, int64(id))
				}
			}
		}
	}
	if c, ok := body["next_cursor"].(string); ok {
		h.cursors = append(h.cursors, c)
	}
	if id, ok := body["id"].(float64); ok {
		if tn, ok := body["tenant"].(string); ok && !slices.Contains(h.anyIDs, int64(id)) {
			h.addJob(tn, int64(id))
		}
	}
}

// pathOnly is path without its query, as the server routes it.
func pathOnly(path string) string {
	p, _, _ := strings.Cut(path, "?")
	return p
}

func trimmed(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}
