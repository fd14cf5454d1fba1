package drainer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/limits"
	"github.com/sluicehq/sluice/gate/store"
)

func loadLimits(ctx context.Context, q limits.Querier) (limits.Config, error) {
	v, err := limits.Load(ctx, q)
	return v.Config, err
}

// candidate is a queued job that a pass may claim.
type candidate struct {
	id       int64
	tenant   string
	rateKey  sql.NullString
	queuedAt time.Time
	version  int64
}

func (c candidate) before(o candidate) bool {
	if !c.queuedAt.Equal(o.queuedAt) {
		return c.queuedAt.Before(o.queuedAt)
	}
	return c.id < o.id
}

// claimed is a job this pass moved to dispatched, with what the dispatch needs.
type claimed struct {
	row    store.Row
	nonce  string
	wall   time.Duration
	budget int // the dispatch budget in force at the claim
}

// inFlightPerTenant counts the jobs in flight of each tenant with any.
const inFlightPerTenant = `SELECT tenant, COUNT(*) FROM jobs WHERE status IN ('claimed','dispatched','running') GROUP BY tenant`

// scanInFlight reads the rows of inFlightPerTenant. The count reads the claim index over the
// in-flight states only, so its cost is bounded by the global cap, not by any backlog.
func scanInFlight(rows *sql.Rows) (map[string]int, int, error) {
	out := map[string]int{}
	total := 0
	for rows.Next() {
		var t string
		var n int
		if err := rows.Scan(&t, &n); err != nil {
			return nil, 0, fmt.Errorf("count in-flight jobs: %w", err)
		}
		out[t] = n
		total += n
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("count in-flight jobs: %w", err)
	}
	return out, total, nil
}

// want is how many queue heads a pass reads for one tenant.
type want struct {
	tenant string
	n      int // heads to read: room plus gateSlack
	room   int // jobs the tenant could start now
}

// tenantPage is what one read of the tenants index gave a pass: the next tenants with queued
// work in the pass's ordering, whether the read was full (more tenants with work may follow), and
// where the next read starts.
type tenantPage struct {
	tenants []string
	full    bool
	after   tenantKey
}

// tenantKey is a position in the tenants index of an ordering: (head_at, head_id) for fair and
// fifo, the name for round_robin. wrapped marks a round_robin read that went past the last name
// and started again at the first.
type tenantKey struct {
	headAt  time.Time
	headID  int64
	name    string
	wrapped bool
}

// maxTenantPages bounds the tenant reads of one pass. A pass reads further pages only while the
// tenants it read give fewer eligible jobs than it has free slots (their heads gated, not before
// a 503's retry, or their tenants at a cap), so tenants stuck behind gates cost at most this many
// reads a pass; tenants further down wait for the next passes' first pages to clear.
const maxTenantPages = 4

// tenantsPerPage is how many tenants with work a page holds: the jobs a pass may claim, plus
// gateSlack so a few gated or capped tenants do not force a second read.
func (d *Drainer) tenantsPerPage(cfg limits.Config) int {
	return max(min(cfg.GlobalInFlight, d.cfg.ClaimBatch), 1) + gateSlack
}

// passState reads, in one round trip, the jobs in flight per tenant and the first page of
// tenants with queued work in cfg's ordering. The in-flight count reads the claim index over the
// in-flight states only, so it is bounded by the global cap; the page reads one index of tenants
// (migrations/0010) for a number of rows bounded by the claim batch. Neither grows with the number
// of tenants that have work or ever had it, nor with any tenant's backlog.
func (d *Drainer) passState(ctx context.Context, cfg limits.Config) (inFlight map[string]int, total int, page tenantPage, err error) {
	q, args := d.tenantsSQL(cfg, tenantKey{}, true)
	rows, err := d.cfg.DB.QueryContext(ctx, q+` UNION ALL SELECT tenant, COUNT(*), NULL, NULL FROM jobs
		WHERE status IN ('claimed','dispatched','running') GROUP BY tenant`, args...)
	if err != nil {
		return nil, 0, page, fmt.Errorf("read in-flight counts and tenants with queued jobs: %w", err)
	}
	defer rows.Close()
	inFlight = map[string]int{}
	var work []tenantRow
	for rows.Next() {
		var r tenantRow
		var n sql.NullInt64
		if err := rows.Scan(&r.name, &n, &r.headAt, &r.headID); err != nil {
			return nil, 0, page, fmt.Errorf("read in-flight counts and tenants with queued jobs: %w", err)
		}
		if !n.Valid {
			work = append(work, r)
			continue
		}
		inFlight[r.name] = int(n.Int64)
		total += int(n.Int64)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, page, fmt.Errorf("read in-flight counts and tenants with queued jobs: %w", err)
	}
	return inFlight, total, d.pageOf(cfg, tenantKey{}, work), nil
}

// nextTenants reads the page of tenants with work that follows prev.
func (d *Drainer) nextTenants(ctx context.Context, cfg limits.Config, prev tenantPage) (tenantPage, error) {
	q, args := d.tenantsSQL(cfg, prev.after, false)
	rows, err := d.cfg.DB.QueryContext(ctx, q, args...)
	if err != nil {
		return tenantPage{}, fmt.Errorf("read tenants with queued jobs: %w", err)
	}
	defer rows.Close()
	var work []tenantRow
	for rows.Next() {
		var r tenantRow
		var n sql.NullInt64
		if err := rows.Scan(&r.name, &n, &r.headAt, &r.headID); err != nil {
			return tenantPage{}, fmt.Errorf("read tenants with queued jobs: %w", err)
		}
		work = append(work, r)
	}
	if err := rows.Err(); err != nil {
		return tenantPage{}, fmt.Errorf("read tenants with queued jobs: %w", err)
	}
	return d.pageOf(cfg, prev.after, work), nil
}

// tenantRow is a row of tenantsSQL.
type tenantRow struct {
	name   string
	headAt sql.NullTime
	headID sql.NullInt64
}

// tenantsSQL is the read of the page of tenants with work after from (from the start when
// first), in cfg's ordering, with the columns of inFlightPerTenant's rows (tenant, NULL) plus the
// tenant's index position (passState adds the in-flight counts as rows (tenant, count, NULL,
// NULL)). fair and fifo walk the head index (every tenant's oldest queued job,
// oldest first); round_robin walks work_tenant by name from the tenant served last to the end,
// then from the first name up to it.
func (d *Drainer) tenantsSQL(cfg limits.Config, from tenantKey, first bool) (string, []any) {
	n := d.tenantsPerPage(cfg)
	const cols = "SELECT tenant, NULL, head_at, head_id FROM tenants"
	if cfg.Ordering == limits.RoundRobin {
		if first {
			from.name = d.rrLast
		}
		if from.wrapped {
			return "(" + cols + " FORCE INDEX (work_tenant) WHERE work_tenant > ? AND work_tenant <= ? ORDER BY work_tenant LIMIT ?)",
				[]any{from.name, d.rrLast, n}
		}
		return "(" + cols + " FORCE INDEX (work_tenant) WHERE work_tenant > ? ORDER BY work_tenant LIMIT ?)", []any{from.name, n}
	}
	if first {
		return "(" + cols + " FORCE INDEX (head) WHERE head_at IS NOT NULL ORDER BY head_at, head_id LIMIT ?)", []any{n}
	}
	// A row constructor comparison is not a range MariaDB seeks to, so the keyset is spelt out.
	return "(" + cols + ` FORCE INDEX (head) WHERE head_at IS NOT NULL AND (head_at > ? OR (head_at = ? AND head_id > ?))
		ORDER BY head_at, head_id LIMIT ?)`, []any{from.headAt, from.headAt, from.headID, n}
}

// pageOf turns the rows of tenantsSQL read from from into a page.
func (d *Drainer) pageOf(cfg limits.Config, from tenantKey, rows []tenantRow) tenantPage {
	p := tenantPage{full: len(rows) >= d.tenantsPerPage(cfg), after: from}
	for _, r := range rows {
		p.tenants = append(p.tenants, r.name)
	}
	if len(rows) > 0 {
		last := rows[len(rows)-1]
		p.after = tenantKey{headAt: last.headAt.Time, headID: last.headID.Int64, name: last.name, wrapped: from.wrapped}
	}
	if cfg.Ordering == limits.RoundRobin && !p.full && !from.wrapped && d.rrLast != "" {
		// The names after the tenant served last are done; those up to it are the next page.
		p.full, p.after = true, tenantKey{wrapped: true}
	}
	return p
}

// wants returns the tenants of withWork below their cap, with how many heads to read for each,
// and whether a tenant with work was left out at a cap. A tenant at its cap is skipped without
// reading its backlog.
func (d *Drainer) wants(cfg limits.Config, inFlight map[string]int, total int, withWork []string) (ws []want, capped bool) {
	free := cfg.GlobalInFlight - total
	if free <= 0 {
		return nil, len(withWork) > 0
	}
	for _, t := range withWork {
		room := cfg.TenantCap(t) - inFlight[t]
		if room <= 0 {
			capped = true
			continue
		}
		ws = append(ws, want{tenant: t, room: min(room, free, d.cfg.ClaimBatch)})
	}
	// A pass reads each tenant's fair share of the free slots, not each tenant's full room: with
	// 64 tenants and 64 free slots that is 1 head each instead of 64. A tenant whose share runs
	// out while it may have more stops the pass early (see claim), and the next pass goes on.
	share := (min(free, d.cfg.ClaimBatch) + len(ws) - 1) / max(len(ws), 1)
	for i := range ws {
		ws[i].room = min(ws[i].room, max(share, 1))
		ws[i].n = ws[i].room + gateSlack
	}
	return ws, capped
}

// maxStatementBytes bounds the text of one heads statement: a pass's reads stay far below the
// server's packet limit (SPEC §14: no statement of a pass exceeds 64 KiB) whatever the number of
// tenants read and of gated keys excluded, by splitting the read into several statements.
const maxStatementBytes = 48 << 10

// heads returns, for each tenant of ws, its oldest eligible queued jobs (at most w.n), leaving
// out the jobs of the rate keys in excluded (keys found gated earlier in the pass).
func (d *Drainer) heads(ctx context.Context, now time.Time, ws []want, excluded []string) (map[string][]candidate, error) {
	out := map[string][]candidate{}
	exclude := ""
	if len(excluded) > 0 {
		exclude = " AND (rate_key_sha256 IS NULL OR rate_key_sha256 NOT IN (" + store.Placeholders(len(excluded)) + "))"
	}
	var q strings.Builder
	var args []any
	flush := func() error {
		if q.Len() == 0 {
			return nil
		}
		err := d.readHeads(ctx, q.String(), args, out)
		q.Reset()
		args = args[:0]
		return err
	}
	for _, w := range ws {
		// The claim index is forced and walked in (queued_at, id) order, stopping after LIMIT
		// rows: without the hint MariaDB may pick tenant_id and sort the whole backlog, and
		// naming the equality columns in ORDER BY (status is an ENUM) also makes it sort.
		sub := `(SELECT id, tenant, rate_key_sha256, queued_at, version FROM jobs FORCE INDEX (claim)
			WHERE status = 'queued' AND tenant = ? AND (not_before IS NULL OR not_before <= ?)` + exclude + `
			ORDER BY queued_at, id LIMIT ?)`
		if q.Len() > 0 && q.Len()+len(sub)+len(" UNION ALL ") > maxStatementBytes {
			if err := flush(); err != nil {
				return nil, err
			}
		}
		if q.Len() > 0 {
			q.WriteString(" UNION ALL ")
		}
		q.WriteString(sub)
		args = append(args, w.tenant, now)
		for _, k := range excluded {
			args = append(args, k)
		}
		args = append(args, w.n)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	for _, cs := range out {
		sort.Slice(cs, func(i, j int) bool { return cs[i].before(cs[j]) })
	}
	return out, nil
}

// readHeads runs one statement of heads and adds its rows to out.
func (d *Drainer) readHeads(ctx context.Context, q string, args []any, out map[string][]candidate) error {
	hr, err := d.cfg.DB.QueryContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("read queue heads: %w", err)
	}
	defer hr.Close()
	for hr.Next() {
		var c candidate
		if err := hr.Scan(&c.id, &c.tenant, &c.rateKey, &c.queuedAt, &c.version); err != nil {
			return fmt.Errorf("read queue heads: %w", err)
		}
		out[c.tenant] = append(out[c.tenant], c)
	}
	if err := hr.Err(); err != nil {
		return fmt.Errorf("read queue heads: %w", err)
	}
	return nil
}

// gateSlack is how many extra heads per tenant a pass reads so that a gated key at the head of
// a tenant's queue usually costs no second read.
const gateSlack = 4

// gateRounds bounds the gate lookups of one pass. A tenant whose heads are all of gated keys is
// read again without those keys, and the keys of the new heads are looked up in turn; each round
// excludes every key found gated so far, so only a tenant with more than about
// gateRounds × (room + gateSlack) distinct gated keys at its head can still wait a pass. The
// keys found gated are remembered for a poll period (gatedSeen), so the next pass starts by
// excluding them and goes deeper: a tenant's ungated job behind many gated keys waits a few
// passes, not until the gates end.
const gateRounds = 4

// gatedSeen remembers the rate keys recent passes found gated, each until its gate ends or a
// poll period has passed, whichever is first: a gate cleared by an operator is noticed within a
// poll period.
type gatedSeen map[string]gatedUntil

type gatedUntil struct{ notBefore, forget time.Time }

// at returns the keys known to be gated at now, with their not-before instants, and forgets
// the rest.
func (g *gatedSeen) at(now time.Time) map[string]time.Time {
	out := map[string]time.Time{}
	for k, u := range *g {
		if !now.Before(u.forget) || !u.notBefore.After(now) {
			delete(*g, k)
			continue
		}
		out[k] = u.notBefore
	}
	return out
}

// learn remembers the keys of nb gated at now, for at most memory.
func (g *gatedSeen) learn(nb map[string]time.Time, now time.Time, memory time.Duration) {
	if *g == nil {
		*g = gatedSeen{}
	}
	for k, t := range nb {
		if t.After(now) {
			(*g)[k] = gatedUntil{notBefore: t, forget: now.Add(memory)}
		}
	}
}

// candidates returns, per tenant below its cap, the tenant's oldest eligible queued jobs whose
// rate key is not gated at now, whether each may have more, and whether tenants with work may
// remain beyond the pages read. The tenants come from page and, while they give fewer eligible
// jobs than there are free slots, from the pages after it (at most maxTenantPages in all). The
// heads come from the headCache or a read of at least room + gateSlack heads per tenant, and one
// GetMulti looks up their keys; only a tenant left with fewer candidates than its room, whose
// read was full (so more may exist), is read again with the gated keys excluded, so a gated key
// never hides the tenant's other keys. A failing gate store fails open: whatever is not known to
// be gated is a candidate. No transaction is open while memcached is asked.
func (d *Drainer) candidates(ctx context.Context, now time.Time, cfg limits.Config, inFlight map[string]int, total int, page tenantPage) (map[string][]candidate, map[string]bool, bool, error) {
	cands, more := map[string][]candidate{}, map[string]bool{}
	free := min(cfg.GlobalInFlight-total, d.cfg.ClaimBatch)
	capped := false
	for pages := 1; ; pages++ {
		ws, c := d.wants(cfg, inFlight, total, page.tenants)
		capped = capped || c
		if len(ws) > 0 {
			pc, pm, err := d.gatedCandidates(ctx, now, ws)
			if err != nil {
				return nil, nil, false, err
			}
			for _, w := range ws {
				cands[w.tenant], more[w.tenant] = pc[w.tenant], pm[w.tenant]
			}
		}
		if !page.full || pages == maxTenantPages || free <= 0 || enough(cfg, cands, inFlight, free) {
			break
		}
		next, err := d.nextTenants(ctx, cfg, page)
		if err != nil {
			return nil, nil, false, err
		}
		page = next
	}
	// A tenant left waiting at a cap, or tenants not read, mean more than one job is queued: no
	// lone-job probe.
	d.setProbe(!capped && !page.full)
	return cands, more, page.full, nil
}

// enough reports whether cands fill free slots with jobs that no unread tenant could go before:
// under fair, only tenants with nothing in flight count (an unread tenant with nothing in flight
// goes before a read one with jobs in flight); under fifo and round_robin, every candidate does
// (pages come in the ordering's own order).
func enough(cfg limits.Config, cands map[string][]candidate, inFlight map[string]int, free int) bool {
	n := 0
	for t, cs := range cands {
		if cfg.Ordering == limits.Fair && inFlight[t] > 0 {
			continue
		}
		n += min(len(cs), max(cfg.TenantCap(t)-inFlight[t], 0))
	}
	return n >= free
}

// firstHeads returns the heads of ws: a tenant's cached ones when it has more than its share of
// this pass (see headCache), else read, headsPerRead at least, and the full reads cached. full
// reports, per tenant, whether more queued jobs exist beyond the heads returned.
func (d *Drainer) firstHeads(ctx context.Context, now time.Time, ws []want) (map[string][]candidate, map[string]bool, error) {
	cands := map[string][]candidate{}
	full := map[string]bool{}
	var miss []want
	for _, w := range ws {
		// More cached heads than the tenant's share: the pass ends at a tenant's last known
		// head (see claim), and that should not happen on a cached one.
		if cs := d.headCache.take(w.tenant); len(cs) > w.room {
			cands[w.tenant], full[w.tenant] = cs, true
			continue
		}
		w.n = max(w.n, headsPerRead)
		miss = append(miss, w)
	}
	read, err := d.heads(ctx, now, miss, nil)
	if err != nil {
		return nil, nil, err
	}
	for _, w := range miss {
		cs := read[w.tenant]
		cands[w.tenant], full[w.tenant] = cs, len(cs) >= w.n
		if full[w.tenant] {
			d.headCache.keep(w.tenant, cs)
		} else {
			d.headCache.invalidate(w.tenant)
		}
	}
	return cands, full, nil
}

// gatedCandidates returns the heads of ws without those of gated rate keys, re-reading tenants
// whose heads were all gated, and whether each tenant may have more eligible jobs than returned.
func (d *Drainer) gatedCandidates(ctx context.Context, now time.Time, ws []want) (map[string][]candidate, map[string]bool, error) {
	cands, full, err := d.firstHeads(ctx, now, ws)
	if err != nil || d.cfg.Gates == nil {
		return cands, full, err
	}
	looked := map[string]bool{}
	var gated []string
	known := d.gatedSeen.at(now)
	for k := range known {
		looked[k] = true
		gated = append(gated, k)
	}
	dropGated(cands, known, now)
	for round := 1; ; round++ {
		var keys []string
		for _, cs := range cands {
			for _, c := range cs {
				if c.rateKey.Valid && !looked[c.rateKey.String] {
					looked[c.rateKey.String] = true
					keys = append(keys, c.rateKey.String)
				}
			}
		}
		if len(keys) > 0 {
			nb, err := d.cfg.Gates.NotBefore(ctx, keys)
			if err != nil && d.cfg.Metrics != nil {
				d.cfg.Metrics.GateUnavailable.Inc()
			}
			for _, k := range keys {
				if t, ok := nb[k]; ok && t.After(now) {
					gated = append(gated, k)
				}
			}
			d.gatedSeen.learn(nb, now, d.cfg.PollInterval)
			dropGated(cands, nb, now)
			if err != nil {
				return cands, full, nil // fail open: no second read on an unreliable answer
			}
		}
		if round == gateRounds || len(gated) == 0 {
			return cands, full, nil
		}
		var again []want
		for _, w := range ws {
			if len(cands[w.tenant]) < w.room && full[w.tenant] {
				again = append(again, w)
			}
		}
		if len(again) == 0 {
			return cands, full, nil
		}
		more, err := d.heads(ctx, now, again, gated)
		if err != nil {
			return nil, nil, err
		}
		for _, w := range again {
			cands[w.tenant] = more[w.tenant]
			full[w.tenant] = len(more[w.tenant]) >= w.n
		}
	}
}

// dropGated removes from cands the jobs whose rate key is gated at now according to gates.
func dropGated(cands map[string][]candidate, gates map[string]time.Time, now time.Time) {
	for t, cs := range cands {
		kept := cs[:0]
		for _, c := range cs {
			if nb, ok := gates[c.rateKey.String]; c.rateKey.Valid && ok && nb.After(now) {
				continue
			}
			kept = append(kept, c)
		}
		cands[t] = kept
	}
}

// claim picks and claims jobs in one transaction, and commits them as dispatched (claim and
// dispatch are one transaction, so "claimed" is never visible and a job still claimed was never
// sent).
//
// Locking: the transaction runs at READ COMMITTED and first locks the single claim_lock row
// FOR UPDATE, so claims from every drainer are serialised. Inside, each statement reads the
// latest committed data: the caps (the newest runtime config row, read in the same statement as
// the lock) and the in-flight counts, which no concurrent claim can raise while the lock is held
// (completions can only lower them). The chosen jobs are moved by one UPDATE fenced on each id,
// version and the queued state, so a job canceled or taken since the candidate read is skipped.
// Hence no claim ever puts more jobs in flight than the caps as read in its own transaction.
// Candidate reads and the gate lookup happen before the transaction, so it never waits on
// memcached or scans a backlog, and the lock is held for four short statements.
func (d *Drainer) claim(ctx context.Context, now time.Time) ([]claimed, bool, error) {
	// Every answer that frees a slot wakes a pass, and answers come in batches, so without this
	// about every other pass of a full drainer would read the in-flight counts only to find no
	// room (half the passes of BenchmarkDrainThroughput did). A raised cap still starts claims:
	// while jobs are held the upkeep re-reads the config and wakes a pass when it changed.
	if n := d.unanswered.Load(); n > 0 && n >= int64(d.lastConfig().GlobalInFlight) {
		return nil, false, nil
	}
	// The caps the last claim saw are good enough to choose candidates (the claim re-reads them
	// under the lock); the in-flight counts are read fresh, since completions elsewhere (other
	// drainers, asynchronous executors) free capacity this process did not see.
	poked := d.poked.Swap(false)
	if d.probing() {
		out, handled, err := d.claimLone(ctx, now, poked)
		if err != nil || handled {
			return out, false, err
		}
	}
	cfg := d.lastConfig()
	inFlight, total, page, err := d.passState(ctx, cfg)
	if err != nil {
		return nil, false, err
	}
	cands, more, unread, err := d.candidates(ctx, now, cfg, inFlight, total, page)
	if err != nil || len(cands) == 0 {
		return nil, false, err
	}

	// Three round trips: one begins the transaction, takes the claim lock (reading the config)
	// and counts in flight; one claims and commits (store.ConnTx); one reads the payloads.
	tx, err := store.BeginConnTx(ctx, d.cfg.DB)
	if err != nil {
		return nil, false, fmt.Errorf("begin claim: %w", err)
	}
	defer tx.Close()
	if cfg, inFlight, total, err = lockAndCount(ctx, tx); err != nil {
		return nil, false, err
	}
	d.remember(cfg)
	var chosen []candidate
	full := false
	for total < cfg.GlobalInFlight {
		if len(chosen) >= d.cfg.ClaimBatch {
			full = true
			break
		}
		t := d.pick(cfg, cands, inFlight)
		if t == "" {
			break
		}
		if len(cands[t]) == 1 && more[t] {
			// The tenant's last read head: it may have more that should go before other
			// tenants' jobs, so after this one the pass ends and the next reads again.
			full = true
			chosen = append(chosen, cands[t][0])
			break
		}
		chosen = append(chosen, cands[t][0])
		cands[t] = cands[t][1:]
		inFlight[t]++
		total++
	}
	if len(chosen) == 0 {
		return nil, false, nil
	}
	out, err := d.claimAndCommit(ctx, tx, now, cfg, chosen)
	if err != nil {
		d.headCache.reset() // the claimed jobs may be queued again
		// If the COMMIT's outcome is unknown the jobs may be dispatched under our id without
		// being sent: their leases expire and recovery requeues them. Nothing is sent here.
		return nil, false, err
	}
	got := make(map[int64]bool, len(out))
	for _, c := range out {
		got[c.row.ID] = true
	}
	d.headCache.claimed(chosen, got)
	if len(out) == 0 || d.handBackIfStopping(ctx, now, out) {
		return nil, false, nil
	}
	if err := d.loadPayloads(ctx, out); err != nil {
		// Committed but unreadable: nothing was sent, so hand the jobs back at once rather than
		// leave them to lease recovery, which (with unconfirmed starts) would call them lost.
		d.releaseUnsent(ctx, now, out, "the claimed job could not be read back; it was never sent")
		return nil, false, err
	}
	// Probing for a lone job is worth its round trip only when this pass left nothing behind
	// (candidates already turned it off if a tenant waits at a cap).
	if full || len(out) < len(chosen) || !drained(cands, more) {
		d.setProbe(false)
	}
	d.own(ctx, now, out)
	// Tenants left unread with slots still free: the next pass goes on at once. Only after a
	// pass that claimed something, so tenants whose work is all gated never spin the loop.
	return out, full || (unread && total < cfg.GlobalInFlight), nil
}

// drained reports whether a pass took every candidate it read and no tenant may have more.
func drained(cands map[string][]candidate, more map[string]bool) bool {
	for t, cs := range cands {
		if len(cs) > 0 || more[t] {
			return false
		}
	}
	return true
}

// own records jobs this drainer committed as dispatched: it holds them (renews their leases)
// until their outcomes are recorded.
func (d *Drainer) own(ctx context.Context, now time.Time, out []claimed) {
	d.mu.Lock()
	for _, c := range out {
		d.held[c.row.ID] = c.row.Version
	}
	d.mu.Unlock()
	for _, c := range out {
		d.store.LogTransition(ctx, store.Row{Job: job.Job{ID: c.row.ID, Tenant: c.row.Tenant, Status: job.Queued, QueuedAt: c.row.QueuedAt}},
			job.Dispatched, c.row.Version, now, "")
		d.store.Metrics.Dispatched(c.row.QueuedAt, *c.row.DispatchedAt)
	}
}

// lockClaimsSQL takes the claim lock and reads the runtime configuration in force.
const lockClaimsSQL = `SELECT (SELECT config FROM config_versions ORDER BY version DESC LIMIT 1)
	FROM claim_lock WHERE id = 1 FOR UPDATE`

func decodeClaimConfig(raw sql.NullString) (limits.Config, error) {
	if !raw.Valid {
		return limits.Default(), nil
	}
	return limits.Decode([]byte(raw.String))
}

// lastConfig returns the runtime configuration the last claim transaction read (the defaults
// before the first).
func (d *Drainer) lastConfig() limits.Config {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.viewed {
		return limits.Default()
	}
	return d.viewCfg
}

func (d *Drainer) remember(cfg limits.Config) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.viewCfg, d.viewed = cfg, true
}

// lockAndCount takes the claim lock of tx, reading the runtime configuration in force, and
// counts the jobs in flight per tenant, in the transaction's first round trip.
func lockAndCount(ctx context.Context, tx *store.ConnTx) (cfg limits.Config, inFlight map[string]int, total int, err error) {
	cfg, inFlight, total, _, err = lockCountAndProbe(ctx, tx, false)
	return cfg, inFlight, total, err
}

// lockCountAndProbe is lockAndCount, and with probe the lone-job probe (loneProbeSQL) in the same
// round trip, read under the claim lock.
func lockCountAndProbe(ctx context.Context, tx *store.ConnTx, probe bool) (cfg limits.Config, inFlight map[string]int, total int, found []loneJob, err error) {
	stmts := []string{lockClaimsSQL, inFlightPerTenant}
	if probe {
		stmts = append(stmts, loneProbeSQL)
	}
	res, err := tx.Query(ctx, stmts)
	if err != nil {
		return cfg, nil, 0, nil, fmt.Errorf("take claim lock: %w", err)
	}
	defer res.Close()
	var raw sql.NullString
	if err := res.ScanOne(&raw); err != nil {
		return cfg, nil, 0, nil, fmt.Errorf("take claim lock: %w", err)
	}
	if cfg, err = decodeClaimConfig(raw); err != nil {
		return cfg, nil, 0, nil, err
	}
	rows, err := res.Next()
	if err != nil {
		return cfg, nil, 0, nil, fmt.Errorf("count in-flight jobs: %w", err)
	}
	if inFlight, total, err = scanInFlight(rows); err != nil {
		return cfg, nil, 0, nil, err
	}
	if probe {
		if rows, err = res.Next(); err != nil {
			return cfg, nil, 0, nil, fmt.Errorf("read the queue's head: %w", err)
		}
		if found, err = scanLone(rows); err != nil {
			return cfg, nil, 0, nil, err
		}
	}
	return cfg, inFlight, total, found, res.Close()
}

// claimUpdate is a claim's UPDATE, with the nonces it gives the chosen jobs and the claim and
// dispatch time it records.
type claimUpdate struct {
	query  string
	args   []any
	nonces []string
	stamp  time.Time
}

func (d *Drainer) claimUpdate(now time.Time, cfg limits.Config, chosen []candidate) (claimUpdate, error) {
	nonces := make([]string, len(chosen))
	var cases, fence strings.Builder
	args := make([]any, 0, 16+4*len(chosen))
	var started any
	if d.cfg.UnconfirmedStarts {
		started = now
	}
	// A pass's clock reading may predate the admission of a job it found (the job committed
	// while the pass was reading candidates), so the recorded claim and dispatch times are never
	// earlier than the newest admission among the chosen: a dispatch never precedes its
	// admission. Lease and nonce expiry count from the pass's own reading, which only makes them
	// a little shorter.
	stamp := now
	for _, c := range chosen {
		if c.queuedAt.After(stamp) {
			stamp = c.queuedAt
		}
	}
	if started != nil {
		started = stamp
	}
	args = append(args, stamp, stamp, started, now.Add(cfg.Lease()), d.cfg.ID, now.Add(cfg.NonceTTL()))
	for i, c := range chosen {
		n, err := newNonce()
		if err != nil {
			return claimUpdate{}, err
		}
		nonces[i] = n
		cases.WriteString(" WHEN ? THEN ?")
		args = append(args, c.id, store.HashNonce(n))
	}
	// The fence is a row-constructor IN over (id, version); OR-ed (id = ? AND version = ?)
	// groups cost the optimizer more than the update itself. The leading id IN (...) keeps it on
	// the primary key: MariaDB 10.11 plans a row-constructor IN of a single tuple as a full
	// index scan (a million-row scan per claim with a backlog).
	for _, c := range chosen {
		args = append(args, c.id)
	}
	for i, c := range chosen {
		if i > 0 {
			fence.WriteString(",")
		}
		fence.WriteString("(?,?)")
		args = append(args, c.id, c.version)
	}
	return claimUpdate{query: `UPDATE jobs SET status = 'dispatched', version = version + 1,
		attempt = attempt + 1, claimed_at = ?, dispatched_at = ?, started_at = ?, lease_until = ?,
		drainer_id = ?, nonce_expires_at = ?, not_before = NULL, nonce_sha256 = CASE id` + cases.String() + ` END
		WHERE id IN (` + store.Placeholders(len(chosen)) + `) AND (id, version) IN (` + fence.String() + `) AND status = 'queued'`,
		args: args, nonces: nonces, stamp: stamp}, nil
}

// claimed returns the chosen jobs the UPDATE got (got), as claimed.
func (u claimUpdate) claimed(chosen []candidate, got map[int64]bool, cfg limits.Config) []claimed {
	stamp := u.stamp
	out := make([]claimed, 0, len(chosen))
	for i, c := range chosen {
		if !got[c.id] {
			continue
		}
		r := store.Row{}
		r.ID, r.Tenant, r.Version, r.Status, r.QueuedAt = c.id, c.tenant, c.version+1, job.Dispatched, c.queuedAt
		if c.rateKey.Valid {
			k := c.rateKey.String
			r.RateKeySHA256 = &k
		}
		r.DispatchedAt = &stamp
		out = append(out, claimed{row: r, nonce: u.nonces[i], wall: cfg.Wall(), budget: cfg.DispatchAttempts})
	}
	return out
}

// claimAndCommit runs the claim's UPDATE (claimUpdate), reads back which chosen jobs carry this
// claim's nonces, and commits, in one round trip. The read sees the transaction's own UPDATE,
// so a job canceled or taken meanwhile is not counted as claimed. Payloads are read after the
// commit (loadPayloads): the claim lock is held until COMMIT, and other drainers wait for it.
func (d *Drainer) claimAndCommit(ctx context.Context, tx *store.ConnTx, now time.Time, cfg limits.Config, chosen []candidate) ([]claimed, error) {
	u, err := d.claimUpdate(now, cfg, chosen)
	if err != nil {
		return nil, err
	}
	ids := make([]int64, len(chosen))
	want := map[int64]string{}
	for i, c := range chosen {
		ids[i] = c.id
		want[c.id] = string(store.HashNonce(u.nonces[i]))
	}
	// A drainer told to stop (its ctx cancelled) while this round trip is under way lets it
	// finish: the driver answers a cancellation by dropping the connection, which would leave
	// the COMMIT's outcome unknown and the jobs, if it happened, to lease recovery. The caller
	// then hands them back (handBackIfStopping).
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimCommitTimeout)
	defer cancel()
	res, err := tx.QueryCommit(cctx, []string{u.query,
		"SELECT id, nonce_sha256 FROM jobs WHERE id IN (" + store.Placeholders(len(ids)) + ")"},
		append(u.args, int64Args(ids)...)...)
	if err != nil {
		return nil, fmt.Errorf("claim %d job(s): %w", len(chosen), err)
	}
	defer res.Close()
	rows, err := res.Next()
	if err != nil {
		return nil, fmt.Errorf("claim %d job(s): %w", len(chosen), err)
	}
	got := map[int64]bool{}
	for rows.Next() {
		var id int64
		var hash []byte
		if err := rows.Scan(&id, &hash); err != nil {
			return nil, fmt.Errorf("claim %d job(s): read back: %w", len(chosen), err)
		}
		got[id] = string(hash) == want[id]
	}
	if err := res.Close(); err != nil {
		return nil, fmt.Errorf("claim %d job(s): %w", len(chosen), err)
	}
	return u.claimed(chosen, got, cfg), nil
}

// loadPayloads reads the payloads and attempt counts of jobs this drainer claimed.
func (d *Drainer) loadPayloads(ctx context.Context, cs []claimed) error {
	ids := make([]int64, len(cs))
	byID := map[int64]int{}
	for i, c := range cs {
		ids[i] = c.row.ID
		byID[c.row.ID] = i
	}
	rows, err := d.cfg.DB.QueryContext(ctx, "SELECT id, payload, attempt, dispatch_failures FROM jobs WHERE id IN ("+store.Placeholders(len(ids))+")", int64Args(ids)...)
	if err != nil {
		return fmt.Errorf("read claimed payloads: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var payload []byte
		var attempt, failures int
		if err := rows.Scan(&id, &payload, &attempt, &failures); err != nil {
			return fmt.Errorf("read claimed payloads: %w", err)
		}
		r := &cs[byID[id]].row
		r.Payload, r.Attempt, r.DispatchFailures = payload, attempt, failures
	}
	return rows.Err()
}

// claimCommitTimeout bounds the claim's last round trip once it no longer follows the
// drainer's context: its UPDATE may wait for row locks up to innodb_lock_wait_timeout (10 s).
const claimCommitTimeout = 15 * time.Second

// handBackIfStopping hands jobs this pass claimed back to the queue, unsent, when ctx was
// cancelled meanwhile (the drainer is stopping: SPEC §11, claimed jobs not yet sent go back to
// queued), and reports whether it did.
func (d *Drainer) handBackIfStopping(ctx context.Context, now time.Time, cs []claimed) bool {
	if ctx.Err() == nil {
		return false
	}
	d.releaseUnsent(ctx, now, cs, "the drainer stopped before sending it")
	return true
}

// releaseUnsent returns claimed jobs that were never sent to queued, fenced on the claim, with
// why as their error message. It runs whether or not ctx was cancelled: a stopping drainer is the
// usual reason to call it. If the database refuses, lease recovery takes the jobs later.
func (d *Drainer) releaseUnsent(ctx context.Context, now time.Time, cs []claimed, why string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimCommitTimeout)
	defer cancel()
	items := make([]store.Finishing, len(cs))
	for i, c := range cs {
		items[i] = store.Finishing{Row: c.row, Outcome: store.Outcome{Status: job.Queued,
			ErrorCode: "dispatch_error", ErrorMessage: why}}
	}
	err := d.inTx(ctx, func(tx *sql.Tx) error {
		_, err := d.store.FinishMany(ctx, tx, now, items)
		return err
	})
	for _, c := range cs {
		d.headCache.invalidate(c.row.Tenant)
	}
	if err != nil {
		d.cfg.Log.Warn("could not hand back claimed jobs that were never sent; lease recovery will", "jobs", len(cs), "error", err)
	}
}

// scanExpired lists, in one round trip, the in-flight jobs whose lease ran out before now, the
// longest expired first; hb, if not nil, is written in the same round trip.
func (d *Drainer) scanExpired(ctx context.Context, now time.Time, hb *heartbeatSQL) ([]store.Row, error) {
	q := "SELECT " + store.LockColumns + ` FROM jobs
		WHERE status IN ('claimed','dispatched','running') AND lease_until < ? ORDER BY lease_until LIMIT 100`
	args := []any{now}
	if hb != nil {
		q = hb.query + ";" + q
		args = append(append([]any{}, hb.args...), now)
	}
	rows, err := d.cfg.DB.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("scan expired leases: %w", err)
	}
	var expired []store.Row
	res := store.ResultsOf(rows)
	err = res.EachRow(func(r store.Row) { expired = append(expired, r) })
	if err = errors.Join(err, res.Close()); err != nil {
		return nil, fmt.Errorf("scan expired leases: %w", err)
	}
	return expired, nil
}

// recover takes back the expired jobs (scanExpired): their drainer died or froze. A job never
// sent goes back to queued; a dispatched job whose start was never confirmed goes back to
// queued with its nonce voided (or is lost when starts are not confirmed); a running job is lost,
// never re-run. Every write is fenced on the version read, so a drainer that comes back finds
// its own writes refused. fresh tells whether this pass's upkeep has read the runtime config; if
// not, it is read before anything is recovered, for the dispatch budget.
func (d *Drainer) recover(ctx context.Context, now time.Time, fresh bool, expired []store.Row) (int, error) {
	if len(expired) == 0 {
		return 0, nil
	}
	if !fresh {
		if err := d.refreshConfig(ctx); err != nil {
			return 0, err
		}
	}
	cfg := d.lastConfig()
	n := 0
	for _, r := range expired {
		var o store.Outcome
		switch {
		case r.Status == job.Claimed:
			o = store.Outcome{Status: job.Queued}
		case r.Status == job.Dispatched && !d.cfg.UnconfirmedStarts:
			o = store.Outcome{Status: job.Queued, CountFailure: true, Budget: cfg.DispatchAttempts,
				ErrorCode: "lease_expired", ErrorMessage: "the drainer's lease expired before the start was confirmed"}
		default:
			o = store.Outcome{Status: job.Lost, ErrorCode: "lease_expired",
				ErrorMessage: "the drainer's lease expired while the job was in flight"}
		}
		var to job.Status
		err := d.inTx(ctx, func(tx *sql.Tx) (err error) {
			to, err = d.store.Finish(ctx, tx, now, r, o)
			return err
		})
		switch {
		case errors.Is(err, store.ErrFenced):
			continue // someone else finished or recovered it first
		case err != nil:
			return n, err
		}
		d.store.Metrics.Finished(to, r.DispatchedAt, now)
		n++
	}
	if n > 0 {
		d.Wake()
	}
	return n, nil
}

// expireBatch bounds the jobs one transaction expires, and expireBatches the transactions of one
// upkeep: a queue put far past its age limit drains into expired over a few seconds instead of
// holding thousands of row locks at once.
const expireBatch, expireBatches = 500, 4

// expire moves the queued jobs older than max_queue_age_seconds (0, the default, is off) to
// expired. It uses the config the last pass read: the claim reads it under the claim lock, and
// the upkeep re-reads it whenever queued work was left behind, which is when anything can expire.
func (d *Drainer) expire(ctx context.Context, now time.Time) (int, error) {
	age := d.lastConfig().MaxQueueAgeSeconds
	if age <= 0 {
		return 0, nil
	}
	cutoff := now.Add(-time.Duration(age) * time.Second)
	n := 0
	for range expireBatches {
		var gone []store.Row
		err := d.inTx(ctx, func(tx *sql.Tx) (err error) {
			gone, err = d.store.Expire(ctx, tx, now, cutoff, expireBatch)
			return err
		})
		if err != nil {
			return n, err
		}
		n += len(gone)
		for _, r := range gone {
			d.store.Metrics.Finished(job.Expired, r.DispatchedAt, now)
		}
		if len(gone) < expireBatch {
			break
		}
	}
	return n, nil
}

func (d *Drainer) inTx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := d.cfg.DB.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

func int64Args(ids []int64) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}

// pick returns the tenant whose head job goes next under cfg.Ordering, or "" if none may.
func (d *Drainer) pick(cfg limits.Config, cands map[string][]candidate, inFlight map[string]int) string {
	var tenants []string
	for t, cs := range cands {
		if len(cs) > 0 && inFlight[t] < cfg.TenantCap(t) {
			tenants = append(tenants, t)
		}
	}
	if len(tenants) == 0 {
		return ""
	}
	switch cfg.Ordering {
	case limits.RoundRobin:
		sort.Strings(tenants) // the other orderings need no sort: job ids break every tie
		for _, t := range tenants {
			if t > d.rrLast {
				d.rrLast = t
				return t
			}
		}
		d.rrLast = tenants[0]
		return tenants[0]
	case limits.FIFO:
		best := tenants[0]
		for _, t := range tenants[1:] {
			if cands[t][0].before(cands[best][0]) {
				best = t
			}
		}
		return best
	default: // fair
		best := tenants[0]
		for _, t := range tenants[1:] {
			switch {
			case inFlight[t] < inFlight[best]:
				best = t
			case inFlight[t] == inFlight[best] && cands[t][0].before(cands[best][0]):
				best = t
			}
		}
		return best
	}
}
