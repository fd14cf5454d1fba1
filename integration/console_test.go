package integration_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/gate/api"
	"github.com/sluicehq/sluice/integration/harness"
	"github.com/sluicehq/sluice/integration/memcachedtest"
)

// consoleStep bounds each step of a browser test: the slowest is a live refresh (2 s) plus a
// page load on a loaded 2-core machine under -race.
const consoleStep = 30 * time.Second

// acmeToken is a producer's token scoped to tenant acme.
const acmeToken = "acme-portal-token-0123456789abcdef0123"

// screenshotsDir is where SLUICE_UPDATE_SCREENSHOTS=1 writes the README's screenshots.
const screenshotsDir = "../gate/console/screenshots"

// browser is a headless chromium driven by chromedp, with a fresh profile, for one test.
type browser struct {
	t   *testing.T
	ctx context.Context
	// shots saves each page for the README (SLUICE_UPDATE_SCREENSHOTS=1).
	shots bool
}

// startBrowser starts Debian's chromium (deploy/local/setup.sh installs it) on a fresh profile
// in a temporary directory, with everything that would reach the network turned off.
func startBrowser(t *testing.T) *browser {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium is not installed (deploy/local/setup.sh installs it): %v", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.WindowSize(1280, 900),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc() // waits for the browser process to exit
	})
	// The first Run starts the browser.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return &browser{t: t, ctx: ctx, shots: os.Getenv("SLUICE_UPDATE_SCREENSHOTS") == "1"}
}

// step runs actions within consoleStep; on failure it saves a screenshot of the page to a
// directory it names in the log, and fails the test.
func (b *browser) step(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, consoleStep)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("%s: %v (screenshot: %s)", what, err, b.failureShot(what))
	}
}

// check fails the test, with a screenshot, unless the JavaScript expression cond is true now.
func (b *browser) check(what, cond string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, consoleStep)
	defer cancel()
	ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](cond))
	if err != nil || !ok {
		b.t.Fatalf("%s: %s is false (%v; screenshot: %s)", what, cond, err, b.failureShot(what))
	}
}

// until waits, with consoleStep as the deadline, until the JavaScript expression cond is true.
func until(cond string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](cond, chromedp.WithPollingTimeout(consoleStep))
}

// watchTop starts recording the viewport top of the element selector names at every change of
// the page, from before it shows; watchedStill is true when it showed and never moved.
func watchTop(selector string) string {
	return fmt.Sprintf(`(() => {
		window.watchedTops = [];
		window.watched?.disconnect();
		window.watched = new MutationObserver(() => {
			const e = document.querySelector(%q);
			if (e) window.watchedTops.push(e.getBoundingClientRect().top);
		});
		window.watched.observe(document.querySelector('main'), {subtree: true, childList: true, characterData: true});
	})()`, selector)
}

const watchedStill = `(() => {
	window.watched.disconnect();
	return window.watchedTops.length > 0 && window.watchedTops.every((top) => top === window.watchedTops[0]);
})()`

// watchedTops returns the tops watchTop recorded, as JSON, for a failure's message.
func (b *browser) watchedTops() string {
	ctx, cancel := context.WithTimeout(b.ctx, consoleStep)
	defer cancel()
	tops, err := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify(window.watchedTops)`))
	if err != nil {
		return err.Error()
	}
	return tops
}

// goTo moves the console to a route (a hash change: the page is not reloaded).
func goTo(hash string) chromedp.Action[chromedp.Void] {
	return chromedp.Evaluate[chromedp.Void](fmt.Sprintf("location.hash = %q", hash))
}

func (b *browser) failureShot(what string) string {
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		return "none: " + err.Error()
	}
	// Not t.TempDir: it is removed when the test ends, and the screenshot is for afterwards.
	dir, err := os.MkdirTemp("", "sluice-console-failure-")
	if err != nil {
		return "none: " + err.Error()
	}
	name := filepath.Join(dir, strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(what))+".png")
	if err := os.WriteFile(name, png, 0o644); err != nil {
		return "none: " + err.Error()
	}
	return name
}

// shot saves the page for the README when SLUICE_UPDATE_SCREENSHOTS=1.
func (b *browser) shot(name string) {
	b.t.Helper()
	if !b.shots {
		return
	}
	ctx, cancel := context.WithTimeout(b.ctx, consoleStep)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.MkdirAll(screenshotsDir, 0o755); err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(screenshotsDir, name+".png"), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// labelled is true when every form control on the page has a label or an accessible name.
const labelled = `[...document.querySelectorAll('input, select, textarea')].every((e) =>
	e.labels.length > 0 || e.getAttribute('aria-label'))`

// TestConsole drives the operator console in a real browser against a running sluice: sign in
// with the keyboard, see the overview, see a tenant's depth change after admissions without
// reloading, open a job, cancel one (a confirmation first, whose Cancel leaves the job alone),
// redrive a failed one, clear a gate, change a config value (a refusal shows the server's reason) and find it in the
// history, simulate a change (its table shows, nothing changes), and sign in as a producer of one tenant who sees only that tenant and no admin page.
// Every page has labelled controls and no horizontal scrolling at 200 % zoom.
func TestConsole(t *testing.T) {
	t.Parallel()
	env := harness.Start(t, harness.Options{Memcached: []string{memcachedtest.SharedAddr()}, GateTimeout: time.Second,
		Tokens: []api.Token{{Name: "acme-portal", Token: acmeToken, Role: api.Producer, Tenants: []string{"acme"}}}})
	b := startBrowser(t)

	// Some finished work for the overview's charts, then dispatch paused so that what is
	// admitted next stays queued.
	for i := range 12 {
		env.Admit(t, fmt.Sprintf("warmup-%d", i%3), map[string]any{"sleep_ms": 20})
	}
	failed := env.Admit(t, "warmup-0", map[string]any{"outcome": "failed"}) // to redrive
	harness.WaitFor(t, 30*time.Second, "the warm-up jobs to finish", func() (bool, error) {
		n, err := env.CountJobs(context.Background())
		return n["succeeded"] == 12 && n["failed"] == 1, err
	})
	// A live slot in a lane, for the overview and the slots page: taken while dispatch runs (a
	// paused cap refuses slots), with the longest lease so that it outlives the test.
	patchConfig(t, env, map[string]any{"lanes": map[string]int{"search": 3}})
	slot := env.Do(t, http.MethodPost, "/v1/slots", harness.AdminToken, map[string]any{"tenant": "initech", "lanes": []string{"search"}, "lease_seconds": 900})
	if slot.Status != http.StatusCreated {
		t.Fatalf("take a slot: HTTP %d %s", slot.Status, slot.Raw)
	}
	slotID := int64(slot.Body["id"].(float64))
	patch := env.Do(t, http.MethodPatch, "/v1/config", harness.AdminToken,
		map[string]any{"changes": map[string]any{"global_in_flight": 0}, "note": "hold the console test's jobs queued"})
	if patch.Status != http.StatusOK {
		t.Fatalf("pause dispatch: HTTP %d %s", patch.Status, patch.Raw)
	}
	// A gated key with a queued job, for the gates page; unique, since memcached is shared.
	rateKey := "console-test-" + randomHex(t)
	if r := env.Do(t, http.MethodPost, "/v1/gates", harness.AdminToken, map[string]any{"rate_key": rateKey, "retry_after": 600}); r.Status != http.StatusOK {
		t.Fatalf("gate a key: HTTP %d %s", r.Status, r.Raw)
	}
	if r := env.Do(t, http.MethodPost, "/v1/jobs", harness.ProducerToken, map[string]any{"tenant": "globex", "rate_key": rateKey}); r.Status != http.StatusAccepted {
		t.Fatalf("admit globex: HTTP %d %s", r.Status, r.Raw)
	}

	// Sign in with the keyboard only: type the token, press Enter.
	b.step("open the console", chromedp.Navigate(env.URL+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#token")))
	b.check("the sign-in form is labelled", labelled)
	b.shot("signin")
	b.step("sign in as admin",
		chromedp.SendKeys(chromedp.CSS("#token"), harness.AdminToken+"\r"),
		until(`document.querySelector('#whoami')?.textContent === 'admin (admin)'`),
		until(`document.querySelector('h1')?.textContent === 'Overview' && document.querySelector('#queue-depth')?.textContent === '1'`),
		until(`[...document.querySelectorAll('#drainers td')].some((td) => ['active', 'idle', 'gated'].includes(td.textContent))`))
	b.check("the token is in sessionStorage and nowhere else",
		`sessionStorage.getItem('sluice.token') === '`+harness.AdminToken+`' && !location.href.includes('`+harness.AdminToken+`') && document.cookie === ''`)
	// The warm-up shows on the charts once its 5 s step is complete.
	b.step("the overview charts what finished",
		until(`Number(document.querySelector('#chart-finished svg')?.getAttribute('aria-label').match(/peak ([0-9.]+)/)?.[1]) > 0`),
		until(`/p50: latest [0-9.]+ m?s/.test(document.querySelector('#chart-wait svg')?.getAttribute('aria-label'))`))
	b.check("the overview shows the slot and its lane", `document.querySelector('#slot-total')?.textContent === '1' &&
		document.querySelector('#lane-use')?.textContent.includes('search: 1 of 3')`)
	b.shot("overview")

	// A tenant's depth changes on the tenants page after admissions, without a reload.
	b.step("the tenants page", goTo("#/tenants"),
		until(`document.querySelector('#tenant-list') !== null && !document.querySelector('#tenant-list').textContent.includes('acme')`))
	b.check("tenants page is labelled", labelled)
	b.check("marker survives (no reload)", `(window.sluiceTestMarker = 1) === 1`)
	var ids []int64
	for range 3 {
		ids = append(ids, env.Admit(t, "acme", nil))
	}
	acmeDepth := func(n int) chromedp.Action[chromedp.Void] {
		return until(fmt.Sprintf(`[...document.querySelectorAll('#tenant-list tr')].some((tr) =>
			tr.cells[0]?.textContent === 'acme' && tr.cells[1]?.textContent === '%d')`, n))
	}
	b.step("acme's depth is 3", acmeDepth(3))
	ids = append(ids, env.Admit(t, "acme", nil), env.Admit(t, "acme", nil))
	b.step("acme's depth is 5", acmeDepth(5))
	b.check("the page was never reloaded", `window.sluiceTestMarker === 1`)
	b.shot("tenants")

	// A tenant's page, and a job's.
	b.step("open acme's page", chromedp.Click(chromedp.CSS(`#tenant-list a[data-key="t:acme"]`)),
		until(`document.querySelector('#tenant-depth')?.textContent === '5' && document.querySelectorAll('#job-list tbody tr').length === 5`))
	b.shot("tenant")
	job := ids[0]
	b.step("open a job", chromedp.Click(chromedp.CSS(fmt.Sprintf(`#job-list a[data-key="j:%d"]`, job))),
		until(`document.querySelector('#job-status')?.textContent === 'queued'`),
		until(`/^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}Z$/.test(document.querySelector('#job-queued-at')?.textContent)`),
		until(`document.querySelector('#job-position')?.textContent === '1'`),
		// global_in_flight is 0: the job says so, and has no estimate.
		until(`document.querySelector('#job-waiting-on')?.textContent.endsWith('(paused)')`),
		until(`document.querySelector('#job-estimated-start')?.textContent === 'unknown'`),
		until(`[...document.querySelectorAll('#job-events tbody tr')].some((r) => r.cells[1].textContent === 'admitted')`))
	b.shot("job")

	// Cancel: the confirmation's Cancel leaves the job queued; Confirm cancels it.
	b.step("cancel, then think again", chromedp.Click(chromedp.CSS("#cancel")),
		until(`document.querySelector('#confirm').open`),
		chromedp.Click(chromedp.CSS("#confirm-cancel")),
		until(`!document.querySelector('#confirm').open`))
	if r := env.Do(t, http.MethodGet, fmt.Sprintf("/v1/jobs/%d", job), harness.AdminToken, nil); r.Body["status"] != "queued" {
		t.Fatalf("job %d is %v after the confirmation was dismissed; want queued", job, r.Body["status"])
	}
	// Dismissed and opened again in one task, the first closing's event is still queued when the
	// second opening waits for its answer: it must not answer it.
	b.step("cancel the job", chromedp.Click(chromedp.CSS("#cancel")),
		until(`document.querySelector('#confirm').open`),
		chromedp.Evaluate[chromedp.Void](`document.querySelector('#confirm-cancel').click(); document.querySelector('#cancel').click()`),
		until(`document.querySelector('#confirm').open`),
		chromedp.Click(chromedp.CSS("#confirm-ok")),
		until(`document.querySelector('#job-status')?.textContent === 'canceled' && document.querySelector('#cancel') === null`),
		until(`[...document.querySelectorAll('#job-events tbody tr')].some((r) => r.cells[2].textContent === 'queued → canceled' && r.cells[3].textContent === 'admin')`))
	if r := env.Do(t, http.MethodGet, fmt.Sprintf("/v1/jobs/%d", job), harness.AdminToken, nil); r.Body["status"] != "canceled" {
		t.Fatalf("job %d is %v after the console canceled it", job, r.Body["status"])
	}

	// Redrive a failed job, after a confirmation: a new job, retry_of the failed one. The button
	// stays where it first showed while the page finishes loading: a click aimed at it as it
	// appears lands on it (the live note used to take its line only after the events came).
	b.step("open the failed job", chromedp.Evaluate[chromedp.Void](watchTop("#redrive")),
		goTo(fmt.Sprintf("#/jobs/%d", failed)),
		until(`document.querySelector('#job-status')?.textContent === 'failed'`),
		until(`document.querySelector('#updated').textContent.startsWith('Live:') && document.querySelector('#job-events table') !== null`))
	b.check("the redrive button kept its place (its tops, px: "+b.watchedTops()+")", watchedStill)
	b.step("redrive a failed job", chromedp.Click(chromedp.CSS("#redrive")),
		until(`document.querySelector('#confirm').open`),
		chromedp.Click(chromedp.CSS("#confirm-ok")),
		until(`document.querySelector('#redriven') !== null`),
		chromedp.Click(chromedp.CSS("#redriven")),
		until(fmt.Sprintf(`document.querySelector('#job-status')?.textContent === 'queued' && document.querySelector('main a[href="#/jobs/%d"]') !== null`, failed)))
	if r := env.Do(t, http.MethodGet, "/v1/jobs?status=queued&tenant=warmup-0", harness.AdminToken, nil); r.Status != http.StatusOK ||
		len(r.Body["jobs"].([]any)) != 1 || r.Body["jobs"].([]any)[0].(map[string]any)["retry_of"] != float64(failed) {
		t.Fatalf("after the console's redrive, warmup-0's queued jobs are %s; want one, retry_of %d", r.Raw, failed)
	}

	// The jobs page filters by tenant and state.
	b.step("filter the jobs", goTo("#/jobs?tenant=acme&status=canceled"),
		until(fmt.Sprintf(`document.querySelectorAll('#job-list tbody tr').length === 1 && document.querySelector('#job-list a[data-key="j:%d"]') !== null`, job)))
	b.check("jobs page is labelled", labelled)
	b.step("all jobs", goTo("#/jobs"), until(`document.querySelectorAll('#job-list tbody tr').length === 20`))
	b.shot("jobs")

	// Gates: the gated key is listed, and cleared after a confirmation.
	b.step("the gates page", goTo("#/gates"),
		until(`document.querySelectorAll('#gate-list tbody tr').length === 1`))
	b.shot("gates")
	b.step("clear the gate", chromedp.Click(chromedp.CSS(`#gate-list button`)),
		until(`document.querySelector('#confirm').open`),
		chromedp.Click(chromedp.CSS("#confirm-ok")),
		until(`document.querySelector('#gate-list')?.textContent.includes('No rate key of a queued job is gated')`))

	// Slots: the live slot is listed, and released after a confirmation.
	b.step("the slots page", chromedp.Click(chromedp.CSS(`nav a[href="#/slots"]`)),
		until(fmt.Sprintf(`document.querySelectorAll('#slot-list tbody tr').length === 1 &&
			document.querySelector('#slot-list tbody tr').cells[0].textContent === '%d' &&
			document.querySelector('#slot-list tbody tr').cells[2].textContent === 'search'`, slotID)))
	b.check("slots page is labelled", labelled)
	b.shot("slots")
	b.step("release the slot", chromedp.Click(chromedp.CSS(fmt.Sprintf(`#slot-list button[data-key="release:%d"]`, slotID))),
		until(`document.querySelector('#confirm').open`),
		chromedp.Click(chromedp.CSS("#confirm-ok")),
		until(`document.querySelector('#slot-list')?.textContent.includes('No slot is live')`))
	if r := env.Do(t, http.MethodGet, "/v1/slots", harness.AdminToken, nil); r.Status != http.StatusOK || len(r.Body["slots"].([]any)) != 0 {
		t.Fatalf("after the console's release the live slots are %s; want none", r.Raw)
	}

	// Config: a refused value shows the server's reason; an accepted one is in force and in the
	// history, with who and the note.
	b.step("the config page", goTo("#/config"),
		until(`document.querySelectorAll('#config-current tbody tr').length > 10`),
		chromedp.SetValue(chromedp.CSS("#config-key"), "tenant_queue_depth"),
		chromedp.SetValue(chromedp.CSS("#config-value"), "-3"),
		chromedp.SendKeys(chromedp.CSS("#config-note"), "too small"),
		chromedp.Click(chromedp.CSS("#config-submit")),
		until(`document.querySelector('#config-outcome [role=alert]')?.textContent.includes('tenant_queue_depth')`))
	b.check("config page is labelled", labelled)
	refusal, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS("#config-outcome")))
	if err != nil {
		t.Fatalf("read the refusal: %v", err)
	}
	want := env.Do(t, http.MethodPatch, "/v1/config", harness.AdminToken,
		map[string]any{"changes": map[string]any{"tenant_queue_depth": -3}, "note": "too small"})
	if msg, _ := want.Body["message"].(string); want.Status != http.StatusBadRequest || msg == "" || !strings.Contains(refusal, msg) {
		t.Errorf("the console showed %q; the server's refusal is HTTP %d %q", refusal, want.Status, msg)
	}
	b.step("change tenant_queue_depth",
		chromedp.SetValue(chromedp.CSS("#config-value"), "321"),
		chromedp.SetValue(chromedp.CSS("#config-note"), "room for the console test"),
		chromedp.Click(chromedp.CSS("#config-submit")),
		until(`document.querySelector('#config-outcome [role=status]')?.textContent.includes('Changed tenant_queue_depth to 321')`),
		until(`(() => { const r = document.querySelector('#config-history tbody tr'); return r &&
			r.cells[2].textContent === 'admin' && r.cells[3].textContent === 'tenant_queue_depth: 500 → 321' && r.cells[4].textContent === 'room for the console test'; })()`))
	if r := env.Do(t, http.MethodGet, "/v1/config", harness.AdminToken, nil); r.Body["config"].(map[string]any)["tenant_queue_depth"] != float64(321) {
		t.Errorf("after the console's change the config is %v", r.Body["config"])
	}
	b.shot("config")
	// Simulate a change before making it: the jobs of the last 15 minutes replayed under the
	// config in force (dispatch paused) and with the change, as a table; nothing is changed.
	b.step("simulate a change",
		chromedp.SetValue(chromedp.CSS("#config-key"), "global_in_flight"),
		chromedp.SetValue(chromedp.CSS("#config-value"), "8"),
		chromedp.SetValue(chromedp.CSS("#config-window"), "15m"),
		chromedp.Click(chromedp.CSS("#config-simulate")),
		until(`(() => { const t = document.querySelector('#config-simulation-table')?.textContent || '';
			return /^replayed \d+ job arrivals/.test(t) && t.includes('changes: global_in_flight=8'); })()`))
	if r := env.Do(t, http.MethodGet, "/v1/config", harness.AdminToken, nil); r.Body["config"].(map[string]any)["global_in_flight"] != float64(0) {
		t.Errorf("after the console's simulation the config is %v; want it unchanged", r.Body["config"])
	}

	// 200 % zoom: half the width, every page without horizontal scrolling.
	b.step("zoom", chromedp.EmulateViewport(640, 900))
	for _, page := range []struct{ hash, ready string }{
		{"#/overview", "#drainers table"},
		{"#/tenants", "#tenant-list table"},
		{"#/tenants/acme", "#job-list table"},
		{"#/jobs", "#job-list table"},
		{fmt.Sprintf("#/jobs/%d", job), "#job dl"},
		{"#/gates", "#gate-list p"},
		{"#/slots", "#slot-list p"},
		{"#/config", "#config-history table"},
	} {
		b.step("zoomed "+page.hash, goTo(page.hash), until(fmt.Sprintf(`document.querySelector(%q) !== null`, page.ready)))
		b.check("no horizontal scrolling at 200 % on "+page.hash, `document.documentElement.scrollWidth <= window.innerWidth`)
	}
	b.step("unzoom", chromedp.EmulateViewport(1280, 900))

	// A producer of acme: only acme, nothing admin-only.
	b.step("sign out", chromedp.Click(chromedp.CSS("#signout")), chromedp.WaitVisible(chromedp.CSS("#token")))
	b.check("signing out forgets the token", `sessionStorage.getItem('sluice.token') === null`)
	b.step("sign in as acme's producer",
		chromedp.SendKeys(chromedp.CSS("#token"), acmeToken),
		chromedp.Click(chromedp.CSS(`#signin button[type=submit]`)),
		until(`document.querySelector('#whoami')?.textContent === 'acme-portal (producer for acme)'`),
		until(`document.querySelector('h1')?.textContent === 'Jobs' && document.querySelectorAll('#job-list tbody tr').length === 5`))
	b.check("a producer sees only acme's jobs", `[...document.querySelectorAll('#job-list tbody tr')].every((tr) => tr.cells[1].textContent === 'acme')`)
	b.check("a producer has no admin page in the navigation",
		`[...document.querySelectorAll('#nav a')].map((a) => a.textContent).join(',') === 'Tenants,Jobs'`)
	b.step("a producer's tenants", goTo("#/tenants"), until(`[...document.querySelectorAll('#my-tenants a')].map((a) => a.textContent).join(',') === 'acme'`))
	b.step("an admin page", goTo("#/config"), until(`document.querySelector('h1')?.textContent === 'Not available'`))
	var globex int64
	if r := env.Do(t, http.MethodGet, "/v1/jobs?tenant=globex", harness.AdminToken, nil); r.Status == http.StatusOK {
		globex = int64(r.Body["jobs"].([]any)[0].(map[string]any)["id"].(float64))
	}
	b.step("another tenant's job", goTo(fmt.Sprintf("#/jobs/%d", globex)),
		until(`document.querySelector('#job')?.textContent.includes('No such job')`))
	b.step("another tenant's page", goTo("#/tenants/globex"),
		until(`document.querySelector('main [role=alert]')?.textContent.includes('may not read')`))
	b.check("nothing of globex was shown", `!document.querySelector('main').textContent.includes('#`+fmt.Sprint(globex)+`')`)
}

func randomHex(t *testing.T) string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
