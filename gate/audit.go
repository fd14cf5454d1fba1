package gate

import (
	"encoding/json"
	"errors"
	"strconv"

	"github.com/sluicehq/sluice/gate/job"
	"github.com/sluicehq/sluice/gate/store"
)

// auditEvents are the admission decisions of ins, the items of one transaction's jobs rows
// (SPEC §10): admitted, shadow_refused, or refused by a depth cap (a rejected row). They go in the
// admission's transaction (store.NewJobs.Audit), so a rollback leaves no event.
func auditEvents(ins []*item) []store.AuditEvent {
	events := make([]store.AuditEvent, len(ins))
	zero, none := int64(0), 0
	for i, it := range ins {
		actor := it.caller
		if it.actor != "" {
			actor = it.actor
		}
		e := store.AuditEvent{Event: store.EventAdmitted, Tenant: it.req.Tenant, Actor: actor,
			To: string(job.Queued), Version: &zero, Attempt: &none}
		if it.scope == "" && it.res.Decision != ShadowRefused && it.res.Job.Position != nil && it.retryOf == nil {
			// The common case, without a map: the bytes json.Marshal of the map below gives.
			e.Detail = admittedDetail(it.res.Limit, it.res.InFlight, *it.res.Job.Position)
			events[i] = e
			continue
		}
		detail := map[string]any{"cap": it.res.Limit, "in_flight": it.res.InFlight}
		switch {
		case it.scope != "":
			e.Event, e.To, e.ErrorCode, e.Scope = store.EventRefused, string(job.Rejected), string(job.CodeQueueFull), it.scope
			detail = map[string]any{"scope": it.scope}
		case it.res.Decision == ShadowRefused:
			e.Event = store.EventShadowRefused
			detail["rate_limited"], detail["immediate"] = it.shadow.rate, it.shadow.immediate
			if it.shadow.scope != "" {
				detail["depth_scope"] = it.shadow.scope
			}
		}
		if it.res.Job.Position != nil {
			detail["position"] = *it.res.Job.Position
		}
		if it.retryOf != nil {
			detail["retry_of"] = *it.retryOf
		}
		e.Detail, _ = json.Marshal(detail)
		events[i] = e
	}
	return events
}

// admittedDetail is the detail of a plain admission, {"cap":..,"in_flight":..,"position":..}.
func admittedDetail(limit, inFlight int, position int64) json.RawMessage {
	b := make([]byte, 0, 48)
	b = append(b, `{"cap":`...)
	b = strconv.AppendInt(b, int64(limit), 10)
	b = append(b, `,"in_flight":`...)
	b = strconv.AppendInt(b, int64(inFlight), 10)
	b = append(b, `,"position":`...)
	b = strconv.AppendInt(b, position, 10)
	return append(b, '}')
}

// auditOutcome queues the audit event of an admission decision that wrote nothing else (SPEC
// §10): a refusal by the rate limit or by immediate-or-refuse, or a replay. The rows admission
// writes carry their own events (auditChunk); validation failures are not audited.
func (a *Admitter) auditOutcome(it *item, res Result, err error) {
	if a.cfg.Audit == nil || a.cfg.AuditOff {
		return
	}
	e := store.AuditEvent{Tenant: it.req.Tenant, Actor: it.caller}
	var je *job.Error
	switch {
	case err != nil && errors.As(err, &je) && (je.Code == job.CodeRateLimited || je.Code == job.CodeCapacityExceeded):
		e.Event, e.ErrorCode, e.At = store.EventRefused, string(je.Code), it.at
		if scope, ok := je.Detail["scope"].(string); ok {
			e.Scope = scope
		}
		e.Detail, _ = json.Marshal(je.Detail)
	case err == nil && res.Replayed:
		id := res.Job.ID
		e.Event, e.JobID, e.To = store.EventReplayed, &id, string(res.Job.Status)
	default:
		return
	}
	a.cfg.Audit.Add(e)
}
