// Tenants: the deepest first, paged (GET /v1/tenants?order=depth), and one tenant's page.

import {h, replace, table, message} from './dom.js';
import * as api from './api.js';
import * as fmt from './fmt.js';
import {jobsList} from './jobs.js';

export function tenantHref(name) {
  return `#/tenants/${encodeURIComponent(name)}`;
}

const PAGE = 50;

function inFlightCell(t) {
  return h('span', null,
    h('meter', {min: 0, max: Math.max(t.cap, t.in_flight, 1), value: t.in_flight,
      'aria-label': `${t.tenant}: ${t.in_flight} in flight of ${t.cap}`}),
    `${t.in_flight} / ${t.cap}`);
}

function gatedCell(t) {
  if (!t.gated_keys.length) return '0';
  return h('a', {href: '#/gates', title: t.gated_keys.join('\n')}, String(t.gated_keys.length));
}

// openForm goes to a tenant's page by name: with 100,000 tenants, paging is not how one finds one.
function openForm() {
  const input = h('input', {id: 'open-tenant', name: 'tenant', required: true, autocomplete: 'off'});
  const form = h('form', {class: 'inline', role: 'search', 'aria-label': 'Open a tenant'},
    h('div', {class: 'field'}, h('label', {for: 'open-tenant'}, 'Open a tenant by name'), input),
    h('button', {type: 'submit'}, 'Open'));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    if (input.value) location.hash = tenantHref(input.value);
  });
  return form;
}

export async function tenants(v) {
  v.title('Tenants');
  v.main.append(h('h1', null, 'Tenants'));
  if (!v.admin) {
    const mine = v.who.tenants.filter((t) => t !== '*');
    v.main.append(h('p', {class: 'lead'}, 'The tenants this token may act for.'));
    if (mine.length) {
      v.main.append(h('ul', {id: 'my-tenants'}, mine.map((t) => h('li', null, h('a', {href: tenantHref(t)}, t)))));
    }
    if (v.who.tenants.includes('*')) v.main.append(h('p', null, 'This token may act for every tenant.'), openForm());
    return;
  }
  const cursor = v.params.get('cursor') || '';
  const errors = h('div');
  const list = h('div', {id: 'tenant-list'});
  const pager = h('div', {class: 'pager'});
  v.main.append(
    h('p', {class: 'lead'}, 'Every tenant with queued work, the deepest first.'),
    openForm(), v.liveNote(), errors, list, pager);

  async function refresh() {
    let page;
    try {
      page = await api.call('GET', `tenants${api.query({order: 'depth', limit: PAGE, cursor})}`);
    } catch (err) {
      replace(errors, message('error', `Could not list the tenants: ${err.message}`));
      throw err;
    }
    if (!v.alive()) return;
    replace(errors);
    replace(list, table(cursor ? 'Tenants with queued work, deepest first (a later page)' : 'Tenants with queued work, deepest first',
      [{label: 'Tenant'}, {label: 'Queued', num: true}, {label: 'Oldest queued', num: true},
        {label: 'In flight / cap'}, {label: 'Gated keys', num: true}],
      page.tenants.map((t) => [
        h('a', {href: tenantHref(t.tenant), 'data-key': `t:${t.tenant}`}, t.tenant),
        {value: fmt.count(t.depth), class: 'depth'},
        fmt.age(t.oldest_age_seconds),
        inFlightCell(t),
        gatedCell(t),
      ]), 'No tenant has queued work.'));
    replace(pager,
      cursor ? h('a', {href: '#/tenants', 'data-key': 'first'}, 'First page') : null,
      page.next_cursor ? h('a', {href: `#/tenants${api.query({cursor: page.next_cursor})}`, 'data-key': 'next'}, 'Next page') : null);
  }

  await refresh();
  v.live(refresh);
}

export async function tenant(v) {
  const name = v.args[0];
  v.title(`Tenant ${name}`);
  const figures = h('div', {id: 'tenant-figures'});
  const errors = h('div');
  v.main.append(h('h1', null, 'Tenant ', h('span', {id: 'tenant-name'}, name)), v.liveNote(), errors, figures);
  const jobsPart = jobsList(v, {tenant: name, status: v.params.get('status') || '', cursor: v.params.get('cursor') || '',
    base: tenantHref(name), fixedTenant: true});
  v.main.append(h('h2', null, 'Its jobs'), jobsPart.el);

  async function refresh() {
    if (v.admin) {
      let page;
      try {
        page = await api.call('GET', `tenants${api.query({tenant: name})}`);
      } catch (err) {
        replace(errors, message('error', `Could not read the tenant: ${err.message}`));
        throw err;
      }
      if (!v.alive()) return;
      replace(errors);
      const t = page.tenants[0];
      if (!t) {
        replace(figures, h('p', null, 'sluice has never had a job of this tenant.'));
      } else {
        replace(figures, h('dl', {class: 'fields'},
          h('dt', null, 'Queued'), h('dd', {id: 'tenant-depth'}, fmt.count(t.depth)),
          h('dt', null, 'Oldest queued'), h('dd', null, t.depth ? fmt.age(t.oldest_age_seconds) : '—'),
          h('dt', null, 'In flight / cap'), h('dd', null, inFlightCell(t)),
          h('dt', null, 'Tier'), h('dd', null, t.tier),
          h('dt', null, 'Weight'), h('dd', null, String(t.weight)),
          h('dt', null, 'Gated keys at the head of its queue'),
          h('dd', null, t.gated_keys.length ? h('ul', null, t.gated_keys.map((k) => h('li', {class: 'mono'}, k))) : 'none')));
      }
    }
    await jobsPart.refresh();
  }

  await refresh();
  v.live(refresh);
}
