// Overview: the whole queue at a glance, live (GET /v1/status).

import {h, replace, table, message} from './dom.js';
import * as api from './api.js';
import * as fmt from './fmt.js';
import {lineChart} from './chart.js';

function card(id, title, ...body) {
  return h('section', {class: 'card', id, 'aria-labelledby': `${id}-h`}, h('h2', {id: `${id}-h`}, title), body);
}

function meter(value, max, label) {
  return h('meter', {min: 0, max: Math.max(max, value, 1), value, 'aria-label': label});
}

function ok(good, yes, no) {
  return h('span', {class: `state ${good ? 'state-ok' : 'state-bad'}`}, good ? yes : no);
}

// slotsCard shows the live slots (SPEC §5a) and, when lanes are configured, each lane's use:
// jobs and slots together, against its limit.
function slotsCard(st) {
  const lanes = Object.entries(st.lanes || {}).sort(([a], [b]) => a.localeCompare(b));
  const tiers = Object.entries(st.slots.by_tier || {}).sort(([a], [b]) => a.localeCompare(b));
  return card('slots', 'Slots and lanes',
    h('p', {class: 'figure'}, h('a', {href: '#/slots', id: 'slot-total'}, fmt.count(st.slots.total)), h('small', null, st.slots.total === 1 ? ' live slot' : ' live slots')),
    tiers.length ? h('p', null, `By tier: ${tiers.map(([t, n]) => `${t} ${fmt.count(n)}`).join(', ')}.`) : null,
    lanes.length ?
      h('ul', {class: 'lanes', id: 'lane-use'}, lanes.map(([name, l]) => h('li', null,
        `${name}: ${fmt.count(l.in_flight)} of ${fmt.count(l.limit)} `,
        meter(l.in_flight, l.limit, `Lane ${name}: jobs and slots in flight against its limit`)))) :
      h('p', null, 'No lanes are configured.'));
}

export async function overview(v) {
  v.title('Overview');
  const errors = h('div');
  const figures = h('div', {class: 'cards', id: 'figures'});
  const charts = h('div', {class: 'cards', id: 'charts'});
  const drainers = h('div', {id: 'drainers'});
  v.main.append(
    h('h1', null, 'Overview'),
    v.liveNote(),
    errors,
    figures,
    h('h2', null, 'The last minutes'),
    h('p', {class: 'lead'}, 'As the process serving this console saw them: its drainer\'s outcomes and its API\'s completions and cancels.'),
    charts,
    h('h2', {id: 'drainers-h'}, 'Drainers'),
    drainers);

  async function refresh() {
    let st;
    try {
      st = await api.call('GET', 'status');
    } catch (err) {
      replace(errors, message('error', `Could not read the status: ${err.message}`));
      throw err;
    }
    if (!v.alive()) return;
    replace(errors);
    const caps = st.caps;
    replace(figures,
      card('inflight', 'In flight',
        h('p', {class: 'figure'}, fmt.count(st.in_flight), h('small', null, ` of ${fmt.count(caps.global_in_flight)} (global cap)`)),
        meter(st.in_flight, caps.global_in_flight, 'Jobs in flight against the global cap'),
        caps.global_in_flight === 0 ? h('p', {class: 'state state-bad'}, 'Dispatch is paused (global_in_flight is 0).') : null,
        h('p', null, `Per tenant: ${caps.tenant_in_flight} unless overridden.`)),
      card('queued', 'Queued',
        h('p', {class: 'figure'}, h('span', {id: 'queue-depth'}, fmt.count(st.queue.depth)),
          h('small', null, ` of ${fmt.count(caps.global_queue_depth)} (global depth cap)`)),
        meter(st.queue.depth, caps.global_queue_depth, 'Queued jobs against the global depth cap'),
        h('p', null, `${fmt.count(st.tenants_with_work)} tenant${st.tenants_with_work === 1 ? '' : 's'} with work; each refused past ${fmt.count(caps.tenant_queue_depth)} queued.`),
        h('p', null, `Oldest queued: ${st.queue.depth ? fmt.age(st.queue.oldest_age_seconds) : '—'}`)),
      card('outbox', 'Outbox',
        h('p', {class: 'figure'}, fmt.count(st.outbox.unpublished), h('small', null, ' unpublished')),
        h('p', null, `Oldest unpublished: ${st.outbox.unpublished ? fmt.age(st.outbox.oldest_unpublished_age_seconds) : '—'}`)),
      slotsCard(st),
      card('deps', 'Services',
        h('p', null, 'Broker (NATS): ', ok(st.broker.connected, 'connected', 'disconnected')),
        h('p', null, 'Memcached: ', ok(st.memcached.reachable, 'reachable', 'unreachable')),
        h('p', null, `Runtime config: version ${st.config.version}`, st.config.stale ? ' (stale: re-reads fail)' : ''),
        h('p', null, h('a', {href: '#/gates'}, `${st.gates.length} gated rate key${st.gates.length === 1 ? '' : 's'}`))));

    const step = st.recent.step_seconds;
    const pts = st.recent.points;
    const minutes = Math.round((pts.length * step) / 60);
    replace(charts,
      h('div', {class: 'card'}, lineChart('chart-finished', `Jobs finished per second, last ${minutes} min`,
        [{name: 'finished/s', key: 'a', values: pts.map((p) => p.finished / step)}], fmt.rate)),
      h('div', {class: 'card'}, lineChart('chart-wait', `Dispatch wait (admission to dispatch), last ${minutes} min`,
        [{name: 'p50', key: 'a', values: pts.map((p) => p.dispatch_wait_p50_seconds)},
          {name: 'p99', key: 'b', values: pts.map((p) => p.dispatch_wait_p99_seconds)}], fmt.duration)));

    replace(drainers, table('Drainers and their last heartbeat',
      [{label: 'Drainer'}, {label: 'Host'}, {label: 'State'}, {label: 'Heartbeat age', num: true},
        {label: 'In flight', num: true}, {label: 'Last claim', num: true}, {label: 'Why'}],
      st.drainers.map((d) => [
        d.id, d.host,
        {value: d.state, class: `state state-${d.state}`},
        fmt.age(d.heartbeat_age_seconds),
        fmt.count(d.in_flight),
        d.last_claim_age_seconds === null || d.last_claim_age_seconds === undefined ? '—' : `${fmt.age(d.last_claim_age_seconds)} ago`,
        d.reason || '',
      ]), 'No drainer has sent a heartbeat in the last 10 minutes.'));
  }

  await refresh();
  v.live(refresh);
}
