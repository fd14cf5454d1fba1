// Slots: capacity held by work that callers run themselves (GET /v1/slots, SPEC §5a), and
// releasing one whose holder is gone without waiting for its lease to run out.

import {h, replace, table, message, confirm, announce} from './dom.js';
import * as api from './api.js';
import * as fmt from './fmt.js';

// PAGE is how many slots the page lists; past it, it says how to see the rest.
const PAGE = 200;

export async function slots(v) {
  v.title('Slots');
  const errors = h('div');
  const outcome = h('div');
  const list = h('div', {id: 'slot-list'});
  v.main.append(h('h1', null, 'Slots'),
    h('p', {class: 'lead'}, 'Live slots, newest first: capacity taken by callers that run the work themselves. Each one granted within the limits counts against its tenant\'s cap, its tier and its lanes until it is released or its lease runs out; one granted past a limit (shadow-refused) does not count, so it takes nothing from the queue.'),
    v.liveNote(), outcome, errors, list);

  async function release(s) {
    const yes = await confirm(`Release slot ${s.id}?`,
      `Its capacity goes back to ${s.tenant}'s queue at once. If its holder is still working, that work goes on uncounted, and its next renewal is refused (slot_lost).`,
      'Release the slot');
    if (!yes) return;
    try {
      await api.call('DELETE', `slots/${s.id}`);
    } catch (err) {
      replace(outcome, message('error', `Releasing refused: ${err.message}`));
      return;
    }
    replace(outcome, message('ok', `Slot ${s.id} of ${s.tenant} is released.`));
    announce('Slot released.');
    await refresh();
  }

  async function refresh() {
    let body;
    try {
      body = await api.call('GET', `slots?limit=${PAGE}`);
    } catch (err) {
      replace(errors, message('error', `Could not list the slots: ${err.message}`));
      replace(list);
      throw err;
    }
    if (!v.alive()) return;
    replace(errors);
    replace(list,
      table('Live slots',
        [{label: 'Slot', num: true}, {label: 'Tenant'}, {label: 'Lanes'}, {label: 'Interactive'}, {label: 'Counts'}, {label: 'Holder'},
          {label: 'Taken'}, {label: 'Expires'}, {label: 'Action'}],
        body.slots.map((s) => [
          String(s.id),
          h('a', {href: `#/tenants/${encodeURIComponent(s.tenant)}`}, s.tenant),
          s.lanes.length ? s.lanes.join(', ') : '—',
          s.interactive ? 'yes' : 'no',
          s.counted ? 'yes' : 'no: past a limit',
          s.caller || '—',
          fmt.when(s.created_at),
          fmt.when(s.expires_at),
          h('button', {type: 'button', class: 'danger', 'data-key': `release:${s.id}`,
            'aria-label': `Release slot ${s.id} of ${s.tenant}`, on: {click: () => release(s)}}, 'Release…'),
        ]), 'No slot is live.'),
      body.next_cursor ? h('p', null, `Showing the newest ${PAGE}; \`sluice slots list\` pages through the rest.`) : null);
  }

  await refresh();
  v.live(refresh);
}
