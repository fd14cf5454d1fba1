// The console's shell: sign-in, the navigation, the hash router and the live refresh. Pages
// are modules that build their content from the API; see view() for what they are given.

import {h, replace, message, announce} from './dom.js';
import * as api from './api.js';
import {overview} from './overview.js';
import {tenants, tenant} from './tenants.js';
import {jobs, jobPage} from './jobs.js';
import {gates} from './gates.js';
import {slots} from './slots.js';
import {config} from './config.js';

// LIVE_EVERY is the pause between the end of one refresh and the start of the next: a page
// refreshes at most every 2 s, and not at all while its tab is hidden.
const LIVE_EVERY = 2000;

const routes = [
  {re: /^\/overview$/, page: overview, admin: true, nav: 'overview'},
  {re: /^\/tenants$/, page: tenants, nav: 'tenants'},
  {re: /^\/tenants\/([^/]+)$/, page: tenant, nav: 'tenants'},
  {re: /^\/jobs$/, page: jobs, nav: 'jobs'},
  {re: /^\/jobs\/([0-9]+)$/, page: jobPage, nav: 'jobs'},
  {re: /^\/gates$/, page: gates, admin: true, nav: 'gates'},
  {re: /^\/slots$/, page: slots, admin: true, nav: 'slots'},
  {re: /^\/config$/, page: config, admin: true, nav: 'config'},
];

const navItems = [
  {id: 'overview', label: 'Overview', admin: true},
  {id: 'tenants', label: 'Tenants'},
  {id: 'jobs', label: 'Jobs'},
  {id: 'gates', label: 'Gates', admin: true},
  {id: 'slots', label: 'Slots', admin: true},
  {id: 'config', label: 'Config', admin: true},
];

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const whoEl = document.getElementById('who');

let who = null; // {name, role, tenants} of the signed-in token
let generation = 0; // bumped on every route change: a page's late answers see they are stale
const live = {fn: null, gen: 0, timer: 0, last: 0, note: null};

function isAdmin() {
  return who && who.role === 'admin';
}

function home() {
  return isAdmin() ? '#/overview' : '#/jobs';
}

// ---- sign-in -------------------------------------------------------------------------------

function signInPage(notice) {
  stopLive();
  who = null;
  nav.hidden = true;
  whoEl.replaceChildren();
  document.title = 'Sign in · sluice';
  const input = h('input', {id: 'token', name: 'token', type: 'password', autocomplete: 'off', required: true,
    spellcheck: 'false', 'aria-describedby': 'token-hint'});
  const status = h('div');
  if (notice) status.append(message('error', notice));
  const form = h('form', {class: 'stack signin', id: 'signin'},
    h('div', {class: 'field'},
      h('label', {for: 'token'}, 'API token'),
      h('span', {class: 'hint', id: 'token-hint'},
        'The bearer token sluice was configured with (SLUICE_TOKENS). It is kept in this tab only, until you sign out or close it.'),
      input),
    h('div', null, h('button', {type: 'submit'}, 'Sign in')),
    status);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const tok = input.value.trim();
    try {
      const me = await api.call('GET', 'whoami', undefined, tok);
      if (me.role === 'executor') {
        replace(status, message('error', 'This is an executor token: the console is for admin and producer tokens.'));
        return;
      }
      api.setToken(tok);
      signedIn(me);
    } catch (err) {
      const text = err.status === 401 ? 'sluice does not accept this token.' : err.message;
      replace(status, message('error', text));
      input.focus();
    }
  });
  replace(main, h('h1', null, 'Sign in'), form);
  input.focus();
}

function signedIn(me) {
  who = me;
  nav.hidden = false;
  replace(nav, h('ul', null, navItems.filter((n) => !n.admin || isAdmin()).map((n) =>
    h('li', null, h('a', {href: `#/${n.id}`, 'data-nav': n.id}, n.label)))));
  const scope = me.role === 'producer' ? ` for ${me.tenants.join(', ')}` : '';
  replace(whoEl,
    h('span', {id: 'whoami'}, `${me.name} (${me.role}${scope})`),
    h('button', {type: 'button', class: 'secondary', id: 'signout', on: {click: signOut}}, 'Sign out'));
  announce(`Signed in as ${me.name}, ${me.role}.`);
  if (!location.hash || location.hash === '#/' || location.hash === '#') location.hash = home();
  else route();
}

function signOut() {
  api.setToken(null);
  history.replaceState(null, '', location.pathname);
  signInPage();
  announce('Signed out.');
}

api.onUnauthorized(() => {
  api.setToken(null);
  signInPage('sluice no longer accepts this token: sign in again.');
});

// ---- routing -------------------------------------------------------------------------------

function parseHash() {
  const raw = location.hash.replace(/^#/, '') || '/';
  const [path, q] = raw.split('?');
  return {path, params: new URLSearchParams(q || '')};
}

async function route() {
  if (!who) return;
  const my = ++generation;
  stopLive();
  const {path, params} = parseHash();
  if (path === '/' || path === '') {
    location.hash = home();
    return;
  }
  let match = null;
  const r = routes.find((x) => (match = path.match(x.re)));
  for (const a of nav.querySelectorAll('a[data-nav]')) {
    if (r && a.getAttribute('data-nav') === r.nav) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  main.replaceChildren();
  if (!r) {
    document.title = 'Not found · sluice';
    main.append(h('h1', null, 'Not found'), h('p', null, 'No such page. ', h('a', {href: home()}, 'Go to the start.')));
    main.focus();
    return;
  }
  if (r.admin && !isAdmin()) {
    document.title = 'Not available · sluice';
    main.append(h('h1', null, 'Not available'), h('p', null, 'This page is for admin tokens.'));
    main.focus();
    return;
  }
  let args;
  try {
    args = match.slice(1).map(decodeURIComponent);
  } catch (e) {
    args = match.slice(1);
  }
  const v = view(my, params, args);
  try {
    await r.page(v);
  } catch (err) {
    if (my === generation) main.append(message('error', err.message));
  }
  if (my !== generation) return;
  // A page that did not go live (its first answer was a refusal) is not still loading.
  if (live.note && !live.fn) live.note.remove();
  main.focus();
}

// view is what a page is given: where to draw, its parameters, who is signed in, and live().
function view(my, params, args) {
  return {
    main,
    params,
    args,
    who,
    admin: isAdmin(),
    alive: () => my === generation,
    title: (t) => { document.title = `${t} · sluice`; },
    // liveNote returns the element that says when the page was last refreshed. It holds its
    // line from the start, so nothing under it moves when the page goes live.
    liveNote: () => {
      live.note = h('p', {class: 'updated', id: 'updated'}, 'Loading…');
      return live.note;
    },
    // live makes fn (which must not throw for a refusal it can show) run again every 2 s at
    // most while the page is shown and its tab visible.
    live: (fn) => {
      if (my !== generation) return;
      live.fn = fn;
      live.gen = my;
      live.last = Date.now();
      noteUpdated();
      schedule();
    },
  };
}

// ---- live refresh --------------------------------------------------------------------------

function stopLive() {
  clearTimeout(live.timer);
  live.fn = null;
  live.note = null;
}

function noteUpdated() {
  if (!live.note) return;
  live.note.textContent = document.hidden
    ? 'Live updates paused while this tab is hidden.'
    : `Live: updated ${new Date(live.last).toLocaleTimeString('en-GB')}, every 2 s.`;
}

function schedule() {
  clearTimeout(live.timer);
  if (!live.fn || document.hidden) return;
  const wait = Math.max(0, LIVE_EVERY - (Date.now() - live.last));
  live.timer = setTimeout(tick, wait);
}

async function tick() {
  const {fn, gen} = live;
  if (!fn || document.hidden || gen !== generation) return;
  // An open confirmation must not see the page change under it.
  if (document.getElementById('confirm').open) {
    live.last = Date.now();
    schedule();
    return;
  }
  try {
    await fn();
  } catch (err) {
    // The page keeps its last figures; the next tick tries again.
  }
  if (live.fn !== fn) return;
  live.last = Date.now();
  noteUpdated();
  schedule();
}

document.addEventListener('visibilitychange', () => {
  noteUpdated();
  if (document.hidden) clearTimeout(live.timer);
  else schedule();
});

// ---- start ---------------------------------------------------------------------------------

document.getElementById('skip').addEventListener('click', (e) => {
  e.preventDefault();
  main.focus();
});
window.addEventListener('hashchange', route);

async function start() {
  const tok = api.token();
  if (!tok) {
    signInPage();
    return;
  }
  try {
    signedIn(await api.call('GET', 'whoami', undefined, tok));
  } catch (err) {
    if (err.status === 401) {
      api.setToken(null);
      signInPage('sluice no longer accepts this token: sign in again.');
    } else {
      signInPage(err.message);
    }
  }
}

start();
