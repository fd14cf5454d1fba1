// Jobs: a filtered list (GET /v1/jobs), and one job's page with its actions.

import {h, replace, table, message, confirm, announce} from './dom.js';
import * as api from './api.js';
import * as fmt from './fmt.js';

const STATES = ['queued', 'claimed', 'dispatched', 'running', 'succeeded', 'failed', 'canceled', 'rejected', 'lost', 'expired', 'replaced'];
const TERMINAL = ['succeeded', 'failed', 'canceled', 'rejected', 'lost', 'expired', 'replaced'];
const PAGE = 50;

function tenantLink(name) {
  return h('a', {href: `#/tenants/${encodeURIComponent(name)}`}, name);
}

export function jobHref(id) {
  return `#/jobs/${id}`;
}

function stateCell(s) {
  return {value: s, class: `state state-${s}`};
}

// jobsList is the list of jobs under a filter form: {el, refresh}. opts: tenant, status and
// cursor (from the page's address), base (the address the form and pager link to) and
// fixedTenant (a tenant's page: no tenant field).
export function jobsList(v, opts) {
  const errors = h('div');
  const list = h('div', {id: 'job-list'});
  const pager = h('div', {class: 'pager'});
  const fields = [];
  let tenantInput = null;
  if (!opts.fixedTenant) {
    const mine = v.who.tenants.filter((t) => t !== '*');
    if (!v.admin && mine.length && !v.who.tenants.includes('*')) {
      tenantInput = h('select', {id: 'filter-tenant', name: 'tenant'},
        h('option', {value: ''}, 'All my tenants'),
        mine.map((t) => h('option', {value: t, selected: t === opts.tenant}, t)));
    } else {
      tenantInput = h('input', {id: 'filter-tenant', name: 'tenant', autocomplete: 'off', value: opts.tenant});
    }
    fields.push(h('div', {class: 'field'}, h('label', {for: 'filter-tenant'}, 'Tenant'), tenantInput));
  }
  const statusSelect = h('select', {id: 'filter-status', name: 'status'},
    h('option', {value: ''}, 'Any state'),
    STATES.map((s) => h('option', {value: s, selected: s === opts.status}, s)));
  fields.push(h('div', {class: 'field'}, h('label', {for: 'filter-status'}, 'State'), statusSelect));
  const form = h('form', {class: 'inline', role: 'search', 'aria-label': 'Filter jobs'}, fields,
    h('button', {type: 'submit', id: 'filter-apply'}, 'Show'));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const q = {status: statusSelect.value};
    if (tenantInput) q.tenant = tenantInput.value.trim();
    location.hash = opts.base + api.query(q);
  });

  async function refresh() {
    let page;
    try {
      page = await api.call('GET', `jobs${api.query({tenant: opts.tenant, status: opts.status, cursor: opts.cursor, limit: PAGE})}`);
    } catch (err) {
      replace(errors, message('error', `Could not list the jobs: ${err.message}`));
      replace(list);
      throw err;
    }
    if (!v.alive()) return;
    replace(errors);
    replace(list, table(opts.cursor ? 'Jobs, newest first (an older page)' : 'Jobs, newest first',
      [{label: 'Job'}, {label: 'Tenant'}, {label: 'State'}, {label: 'Queued at'}, {label: 'Finished at'},
        {label: 'Attempt', num: true}, {label: 'Error'}],
      page.jobs.map((j) => [
        h('a', {href: jobHref(j.id), 'data-key': `j:${j.id}`}, `#${j.id}`),
        tenantLink(j.tenant),
        stateCell(j.status),
        fmt.when(j.queued_at),
        fmt.when(j.finished_at),
        String(j.attempt),
        j.error_code || '',
      ]), 'No job matches.'));
    const keep = {status: opts.status};
    if (!opts.fixedTenant) keep.tenant = opts.tenant;
    replace(pager,
      opts.cursor ? h('a', {href: opts.base + api.query(keep), 'data-key': 'newest'}, 'Newest jobs') : null,
      page.next_cursor ? h('a', {href: opts.base + api.query({...keep, cursor: page.next_cursor}), 'data-key': 'older'}, 'Older jobs') : null);
  }

  return {el: h('div', null, form, errors, list, pager), refresh};
}

export async function jobs(v) {
  v.title('Jobs');
  const part = jobsList(v, {tenant: v.params.get('tenant') || '', status: v.params.get('status') || '',
    cursor: v.params.get('cursor') || '', base: '#/jobs'});
  v.main.append(h('h1', null, 'Jobs'), v.liveNote(), part.el);
  await part.refresh();
  v.live(part.refresh);
}

function field(label, value, id) {
  return [h('dt', null, label), h('dd', {id}, value === null || value === undefined || value === '' ? '—' : value)];
}

export async function jobPage(v) {
  const id = v.args[0];
  v.title(`Job #${id}`);
  const body = h('div', {id: 'job'});
  const actions = h('div', {class: 'actions', id: 'job-actions'});
  const outcome = h('div', {id: 'job-outcome'});
  const events = h('section', {id: 'job-events', 'aria-label': 'Events'});
  v.main.append(h('h1', null, `Job #${id}`), v.liveNote(), outcome, actions, body, events);

  async function act(label, fn) {
    try {
      await fn();
    } catch (err) {
      replace(outcome, message('error', `${label} refused: ${err.message}`));
      return;
    }
    await refresh();
  }

  async function cancel() {
    const yes = await confirm(`Cancel job #${id}?`, 'The job will never run. This cannot be undone.', 'Cancel the job');
    if (!yes) return;
    await act('Cancel', async () => {
      await api.call('DELETE', `jobs/${id}`);
      replace(outcome, message('ok', `Job #${id} is canceled.`));
      announce(`Job ${id} canceled.`);
    });
  }

  async function redrive(status) {
    const yes = await confirm(`Redrive job #${id}?`,
      `A new job with the same tenant, key and payload is queued (retry_of ${id}); this ${status} job stays as it is.`, 'Redrive the job');
    if (!yes) return;
    await act('Redrive', async () => {
      const nj = await api.call('POST', `jobs/${id}/redrive`);
      replace(outcome, h('div', {class: 'message ok', role: 'status'}, 'Queued as a new job: ',
        h('a', {href: jobHref(nj.id), id: 'redriven'}, `job #${nj.id}`)));
      announce(`Job ${id} redriven as job ${nj.id}.`);
    });
  }

  // waitingText says what waiting_on means, the scope's name kept for searching the docs.
  function waitingText(on) {
    const texts = {
      next: 'nothing: the next claim takes it',
      tenant_cap: 'its tenant\'s cap (its jobs in flight, or its earlier queued jobs, take the room)',
      global_cap: 'the global cap',
      tier: 'its tier\'s ceiling',
      reserve: 'the interactive reserve (what is left is kept for interactive work)',
      rate_key: 'its rate key\'s gate',
      not_before: 'its not-before (run_at, delay_seconds or an executor\'s 503)',
      paused: 'a limit set to 0 (paused)',
    };
    const text = on.startsWith('lane:') ? `the lane ${on.slice(5)} is full` : (texts[on] || on);
    return `${text} (${on})`;
  }

  let last = '';
  async function refresh() {
    const j = await api.call('GET', `jobs/${id}`);
    if (!v.alive()) return;
    const shown = JSON.stringify(j);
    if (shown === last) return;
    last = shown;
    replace(body, h('dl', {class: 'fields'},
      field('State', h('span', {class: `state state-${j.status}`}, j.status), 'job-status'),
      field('Tenant', tenantLink(j.tenant)),
      j.position !== undefined ? field('Position in its tenant\'s queue', String(j.position), 'job-position') : null,
      field('Waiting on', j.waiting_on ? waitingText(j.waiting_on) : null, 'job-waiting-on'),
      field('Until', j.waiting_until ? fmt.when(j.waiting_until) : null),
      field('Estimated start', j.status === 'queued' ? (j.estimated_start ? fmt.when(j.estimated_start) : 'unknown') : null, 'job-estimated-start'),
      field('Version', String(j.version)),
      field('Attempt', String(j.attempt)),
      field('Rate key (SHA-256)', j.rate_key_sha256 ? h('span', {class: 'mono'}, j.rate_key_sha256) : null),
      field('Lanes', j.lanes && j.lanes.length ? j.lanes.join(', ') : null),
      field('Interactive', j.interactive === undefined ? null : String(j.interactive)),
      field('Priority', j.priority === undefined ? null : String(j.priority)),
      field('Queued at', fmt.when(j.queued_at), 'job-queued-at'),
      field('Claimed at', fmt.when(j.claimed_at)),
      field('Dispatched at', fmt.when(j.dispatched_at)),
      field('Started at', fmt.when(j.started_at)),
      field('Finished at', fmt.when(j.finished_at), 'job-finished-at'),
      field('Error code', j.error_code, 'job-error-code'),
      field('Error message', j.error_message),
      field('Retry of', j.retry_of ? h('a', {href: jobHref(j.retry_of)}, `job #${j.retry_of}`) : null),
      field('Result', j.result === null || j.result === undefined ? null : h('pre', {id: 'job-result'}, fmt.json(j.result)))));
    const buttons = [];
    if (j.status === 'queued') {
      buttons.push(h('button', {type: 'button', class: 'danger', id: 'cancel', 'data-key': 'cancel', on: {click: cancel}}, 'Cancel job…'));
    }
    if (v.admin && (j.status === 'lost' || j.status === 'failed')) {
      buttons.push(h('button', {type: 'button', id: 'redrive', 'data-key': 'redrive', on: {click: () => redrive(j.status)}}, 'Redrive job…'));
    }
    replace(actions, buttons);
    await refreshEvents();
  }

  // The job's audit trail (GET /v1/jobs/{id}/events), oldest first: who moved it, when, and why.
  async function refreshEvents() {
    const got = await api.call('GET', `jobs/${id}/events`);
    if (!v.alive()) return;
    const rows = (got.events || []).map((e) => [
      fmt.when(e.at),
      {value: e.event, class: 'mono'},
      e.from && e.to ? `${e.from} → ${e.to}` : (e.to || '—'),
      e.actor || '—',
      e.error_code || e.scope || '—',
    ]);
    replace(events, h('h2', null, 'Events'), table('The job\'s events, oldest first',
      [{label: 'When'}, {label: 'Event'}, {label: 'Change'}, {label: 'By'}, {label: 'Code'}], rows, 'No events recorded.'));
  }

  try {
    await refresh();
  } catch (err) {
    if (err.status === 404) {
      replace(body, h('p', null, 'No such job, or not one of this token\'s tenants.'));
      return;
    }
    throw err;
  }
  // Only a job that can still change is refreshed.
  v.live(async () => {
    const before = last;
    if (before && TERMINAL.includes(JSON.parse(before).status)) return;
    await refresh();
  });
}
