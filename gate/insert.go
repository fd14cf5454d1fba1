package gate

import (
	"context"
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
	"github.com/sluicehq/sluice/outbox"
)

// insertChunk bounds the rows of one INSERT, well under max_allowed_packet for any payloads a
// batch body may carry.
const insertChunk = 250

// insert writes, in one round trip, the rows of the items to insert (queued and rejected) and
// the enqueue pokes of the queued ones: a poke's body carries its job's id, which the server
// fills in (outbox.InsertPokes). With commit, it commits in the same round trip (see
// commitWithInsert).
//
// A request's jobs share pokes when perTenant is set (a batch): one poke per tenant, on its last
// queued job. A poke only says "look at this tenant's queue now" (SPEC §2, §7), and the drainer
// coalesces the pokes of one tenant into one pass anyway, so a thousand pokes for one batch
// would be a thousand outbox rows and publishes that wake nothing more. A combiner group is
// several requests: each of its admissions keeps its own poke.
func (a *Admitter) insert(ctx context.Context, tx txConn, items []*item, st *state, perTenant, commit bool) error {
	w := a.insertStatements(items, st, perTenant)
	if len(w.chunks) == 0 {
		if commit {
			return tx.commit(ctx)
		}
		return nil
	}
	ids, err := tx.exec(ctx, w.stmts, w.args, commit)
	if err != nil {
		return fmt.Errorf("insert jobs: %w", err)
	}
	if len(ids) != len(w.stmts) {
		return fmt.Errorf("insert jobs: %d insert ids for %d statements", len(ids), len(w.stmts))
	}
	// A multi-row INSERT of known size gets consecutive ids (a "simple insert" reserves its
	// whole range at once under every InnoDB auto-increment lock mode).
	for _, c := range w.chunks {
		for i, it := range c.jobs {
			it.id = ids[c.stmt] + int64(i)
		}
		for i, it := range c.pokes {
			it.outboxID = ids[c.stmt+2] + int64(i)
		}
	}
	return nil
}

// writes are insert's statements: stmts[i] with arguments args[i].
type writes struct {
	stmts  []string
	args   [][]any
	chunks []written
}

// written is one chunk of insert's rows.
type written struct {
	jobs  []*item // the rows of a jobs INSERT, in order
	pokes []*item // the rows of the outbox INSERT after it, if any
	stmt  int     // index of the jobs INSERT among stmts
}

// insertStatements builds the INSERTs of the items to insert, insertChunk rows each, every one
// followed by the INSERT of its chunk's pokes, if any.
func (a *Admitter) insertStatements(items []*item, st *state, perTenant bool) writes {
	var ins []*item
	lastOf := map[string]int{} // tenant → index in ins of its last queued job, when perTenant
	for _, it := range items {
		if it.insert {
			if perTenant && it.scope == "" {
				lastOf[it.req.Tenant] = len(ins)
			}
			ins = append(ins, it)
		}
	}
	var w writes
	for start := 0; start < len(ins); start += insertChunk {
		chunk := ins[start:min(len(ins), start+insertChunk)]
		var q strings.Builder
		q.WriteString(`INSERT INTO jobs (tenant, rate_key_sha256, payload, status, caller, idempotency_key,
			request_sha256, queued_at, finished_at, error_code, error_message, retry_of) VALUES `)
		c := written{jobs: chunk, stmt: len(w.stmts)}
		var pokes []outbox.NewPoke
		rowArgs := make([]any, 0, 12*len(chunk))
		for i, it := range chunk {
			if i > 0 {
				q.WriteString(",")
			}
			q.WriteString("(?,?,?,?,?,?,?,?,?,?,?,?)")
			rowArgs = appendJobRow(rowArgs, it, st)
			if it.scope == "" && (!perTenant || lastOf[it.req.Tenant] == start+i) {
				pokes = append(pokes, outbox.NewPoke{Kind: outbox.Enqueue, Tenant: it.req.Tenant, Offset: i})
				c.pokes = append(c.pokes, it)
			}
		}
		// The chunk's first job id is kept for its audit rows (auditChunk), which follow the pokes
		// whose INSERT moves LAST_INSERT_ID() on.
		w.stmts = append(w.stmts, q.String(), firstJobSQL)
		w.args = append(w.args, rowArgs, nil)
		if len(pokes) > 0 {
			pq, pargs := outbox.InsertPokes(a.cfg.Prefix, st.now, pokes)
			w.stmts = append(w.stmts, pq)
			w.args = append(w.args, pargs)
		}
		aq, aargs := auditChunk(chunk)
		w.stmts = append(w.stmts, aq)
		w.args = append(w.args, aargs)
		w.chunks = append(w.chunks, c)
	}
	if q, args := queueCountSQL(ins, st); q != "" {
		// Last, so that the insert ids of the statements before it keep their indexes.
		w.stmts = append(w.stmts, q)
		w.args = append(w.args, args)
	}
	return w
}

// queueCountSQL is the UPDATE that adds the queued jobs among ins to their tenants' queue state
// (migration 0010: queued count, oldest queued job), or "" if none is queued: one statement per
// transaction, where an insert trigger cost every row (migration 0011). Admission is the only
// code that inserts queued jobs. The tenants' rows are locked already (read locks them first). Every job of a transaction is queued at st.now, so the head changes only
// for a tenant that had none, or whose head is newer than st.now (the database clock stepped
// back); then it is read again from the claim index.
func queueCountSQL(ins []*item, st *state) (string, []any) {
	counts := map[string]int{}
	var tenants []string
	for _, it := range ins {
		if it.scope != "" {
			continue // rejected: never queued
		}
		if counts[it.req.Tenant] == 0 {
			tenants = append(tenants, it.req.Tenant)
		}
		counts[it.req.Tenant]++
	}
	if len(tenants) == 0 {
		return "", nil
	}
	var q strings.Builder
	args := make([]any, 0, 3*len(tenants)+2)
	q.WriteString("UPDATE tenants SET queued = queued + CASE tenant")
	for _, t := range tenants {
		q.WriteString(" WHEN ? THEN ?")
		args = append(args, t, counts[t])
	}
	// MariaDB assigns left to right: head_at's condition still sees the old head_at, so it
	// holds exactly when head_id's did, and its lookup sees the new head_id.
	q.WriteString(` END,
		head_id = IF(head_id IS NULL OR head_at > ?, (SELECT j.id FROM jobs j FORCE INDEX (claim)
			WHERE j.status = 'queued' AND j.tenant = tenants.tenant ORDER BY j.queued_at, j.id LIMIT 1), head_id),
		head_at = IF(head_at IS NULL OR head_at > ?, (SELECT j.queued_at FROM jobs j WHERE j.id = tenants.head_id), head_at)
		WHERE tenant IN (` + store.Placeholders(len(tenants)) + ")")
	args = append(args, st.now, st.now)
	for _, t := range tenants {
		args = append(args, t)
	}
	return q.String(), args
}

// appendJobRow appends the values of it's jobs row to args: queued, or rejected by a depth cap.
func appendJobRow(args []any, it *item, st *state) []any {
	var rateKey, payload, idem, fp, finished, code, msg, retryOf any
	if it.hash != nil {
		rateKey = *it.hash
	}
	if it.retryOf != nil {
		retryOf = *it.retryOf
	}
	status := job.Queued
	if it.scope != "" {
		// A rejected row does not consume the idempotency key (the caller may retry with it)
		// and keeps no payload.
		status, finished, code = job.Rejected, st.now, string(job.CodeQueueFull)
		msg = "queue full (" + it.scope + " depth cap)"
	} else {
		if len(it.req.Payload) > 0 {
			payload = []byte(it.req.Payload)
		}
		if it.req.IdempotencyKey != nil {
			idem, fp = *it.req.IdempotencyKey, it.fp
		}
	}
	return append(args, it.req.Tenant, rateKey, payload, string(status), it.caller, idem, fp,
		st.now, finished, code, msg, retryOf)
}
