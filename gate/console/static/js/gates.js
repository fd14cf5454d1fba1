// Gates: the gated rate keys among queued jobs (GET /v1/gates), and clearing one.

import {h, replace, table, message, confirm, announce} from './dom.js';
import * as api from './api.js';
import * as fmt from './fmt.js';

export async function gates(v) {
  v.title('Gates');
  const errors = h('div');
  const outcome = h('div');
  const list = h('div', {id: 'gate-list'});
  v.main.append(h('h1', null, 'Gates'),
    h('p', {class: 'lead'}, 'Rate keys whose jobs wait for a cooldown (an executor\'s 429). Their jobs stay queued; clearing a gate lets them go at once.'),
    v.liveNote(), outcome, errors, list);

  async function clear(hash) {
    const yes = await confirm('Clear this gate?', `The jobs of rate key ${hash} may be dispatched at once, even if its upstream quota is still exhausted.`, 'Clear the gate');
    if (!yes) return;
    try {
      await api.call('DELETE', `gates/${hash}`);
    } catch (err) {
      replace(outcome, message('error', `Clearing refused: ${err.message}`));
      return;
    }
    replace(outcome, message('ok', `The gate of ${fmt.short(hash)} is cleared.`));
    announce('Gate cleared.');
    await refresh();
  }

  async function refresh() {
    let body;
    try {
      body = await api.call('GET', 'gates');
    } catch (err) {
      replace(errors, message('error', `Could not list the gates: ${err.message}`));
      replace(list);
      throw err;
    }
    if (!v.alive()) return;
    replace(errors);
    replace(list, table('Gated rate keys',
      [{label: 'Rate key (SHA-256)'}, {label: 'Gated until'}, {label: 'Queued jobs', num: true}, {label: 'Action'}],
      body.gates.map((g) => [
        {value: g.rate_key_sha256, class: 'hash'},
        fmt.when(g.not_before),
        fmt.count(g.queued || 0),
        h('button', {type: 'button', class: 'danger', 'data-key': `clear:${g.rate_key_sha256}`,
          'aria-label': `Clear the gate of ${g.rate_key_sha256}`, on: {click: () => clear(g.rate_key_sha256)}}, 'Clear…'),
      ]), 'No rate key of a queued job is gated.'));
  }

  await refresh();
  v.live(refresh);
}
