// Config: the runtime configuration in force, a change with a note, a simulation of the change
// before it is made, and the history of changes (GET/PATCH /v1/config, POST /v1/config/simulate,
// GET /v1/config/history).

import {h, replace, table, message, announce} from './dom.js';
import * as api from './api.js';
import * as fmt from './fmt.js';

function compact(v) {
  return JSON.stringify(v);
}

// parseValue reads what the operator typed: JSON when it is JSON (7, "fifo", {"acme": 3}),
// else the text as a string (fifo).
function parseValue(text) {
  try {
    return JSON.parse(text);
  } catch (e) {
    return text;
  }
}

// WINDOWS are the stretches of the audit trail a change can be simulated over (the API takes at
// most 24 h).
const WINDOWS = [
  {since: '15m', label: 'the last 15 minutes'},
  {since: '1h', label: 'the last hour'},
  {since: '24h', label: 'the last 24 hours'},
];

export async function config(v) {
  v.title('Config');
  const current = h('div', {id: 'config-current'});
  const history = h('div', {id: 'config-history'});
  const outcome = h('div', {id: 'config-outcome'});
  const keySelect = h('select', {id: 'config-key', name: 'key', required: true});
  const valueInput = h('input', {id: 'config-value', name: 'value', required: true, autocomplete: 'off',
    'aria-describedby': 'config-value-hint'});
  const noteInput = h('input', {id: 'config-note', name: 'note', required: true, autocomplete: 'off',
    'aria-describedby': 'config-note-hint'});
  const windowSelect = h('select', {id: 'config-window', name: 'window', 'aria-describedby': 'config-window-hint'},
    WINDOWS.map((w) => h('option', {value: w.since, selected: w.since === '1h'}, w.label)));
  const simulateButton = h('button', {type: 'button', id: 'config-simulate', class: 'secondary'}, 'Simulate this change');
  const simulation = h('div', {id: 'config-simulation'});
  const form = h('form', {class: 'stack', id: 'config-form', 'aria-labelledby': 'change-h'},
    h('div', {class: 'field'}, h('label', {for: 'config-key'}, 'Setting'), keySelect),
    h('div', {class: 'field'}, h('label', {for: 'config-value'}, 'New value'),
      h('span', {class: 'hint', id: 'config-value-hint'}, 'JSON: 7, "fifo", {"acme": 3}. Plain text is taken as a string.'),
      valueInput),
    h('div', {class: 'field'}, h('label', {for: 'config-note'}, 'Note'),
      h('span', {class: 'hint', id: 'config-note-hint'}, 'Why: it is kept in the history with your token\'s name.'),
      noteInput),
    h('div', {class: 'field'}, h('label', {for: 'config-window'}, 'Simulate over'),
      h('span', {class: 'hint', id: 'config-window-hint'},
        'Simulate replays what arrived in this window under the values in force and with the new value, side by side. It changes nothing, and needs no note.'),
      windowSelect),
    h('div', {class: 'actions'}, h('button', {type: 'submit', id: 'config-submit'}, 'Change'), simulateButton),
    outcome);
  v.main.append(h('h1', null, 'Config'),
    h('p', {class: 'lead'}, 'The runtime configuration, versioned. Every process applies a change within 5 s.'),
    h('h2', {id: 'change-h'}, 'Change a value'), form, simulation,
    h('h2', null, 'In force'), current,
    h('h2', null, 'History'), history);

  let values = {};
  keySelect.addEventListener('change', () => {
    if (keySelect.value in values) valueInput.value = compact(values[keySelect.value]);
  });
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const key = keySelect.value;
    const value = parseValue(valueInput.value.trim());
    const button = document.getElementById('config-submit');
    button.disabled = true;
    try {
      const res = await api.call('PATCH', 'config', {changes: {[key]: value}, note: noteInput.value});
      if (res.change) {
        replace(outcome, message('ok', `Changed ${key} to ${compact(value)}: version ${res.version}.`));
        announce(`Changed ${key}.`);
        noteInput.value = '';
      } else {
        replace(outcome, message('ok', `${key} already was ${compact(value)}: nothing changed.`));
      }
      await load();
    } catch (err) {
      replace(outcome, message('error', `sluice refused the change: ${err.message}`));
      (err.field === 'note' ? noteInput : valueInput).focus();
    } finally {
      button.disabled = false;
    }
  });

  // simulate asks sluice what the change would have done to the window's arrivals and shows its
  // table; nothing is changed.
  simulateButton.addEventListener('click', async () => {
    if (valueInput.value.trim() === '') {
      valueInput.focus();
      replace(simulation, message('error', 'Type the new value to simulate.'));
      return;
    }
    const key = keySelect.value;
    const value = parseValue(valueInput.value.trim());
    const w = WINDOWS.find((x) => x.since === windowSelect.value) || WINDOWS[1];
    simulateButton.disabled = true;
    replace(simulation, message('ok', `Simulating ${key} = ${compact(value)} over ${w.label}…`));
    try {
      const res = await api.call('POST', 'config/simulate', {changes: {[key]: value}, since: w.since});
      if (!v.alive()) return;
      const caption = `${key} = ${compact(value)} over ${w.label} (${fmt.when(res.since)} to ${fmt.when(res.until)}): in force, then with the change`;
      replace(simulation,
        h('h2', {id: 'config-simulation-h'}, 'Simulation'),
        h('p', {class: 'hint'}, caption),
        h('pre', {id: 'config-simulation-table', class: 'table-text', tabindex: '0', role: 'region',
          'aria-labelledby': 'config-simulation-h'}, res.table));
      announce(`Simulated ${key}.`);
    } catch (err) {
      if (!v.alive()) return;
      replace(simulation, message('error', `sluice could not simulate the change: ${err.message}`));
      if (err.field && err.field !== 'since') valueInput.focus();
    } finally {
      simulateButton.disabled = false;
    }
  });

  async function load() {
    const [cfg, hist] = await Promise.all([api.call('GET', 'config'), api.call('GET', 'config/history?limit=100')]);
    if (!v.alive()) return;
    values = cfg.config;
    const chosen = keySelect.value;
    replace(keySelect, Object.keys(values).sort().map((k) => h('option', {value: k, selected: k === chosen}, k)));
    if (!chosen || !valueInput.value) valueInput.value = compact(values[keySelect.value]);
    replace(current, table(`Version ${cfg.version}`, [{label: 'Setting'}, {label: 'Value'}],
      Object.keys(values).sort().map((k) => [k, {value: compact(values[k]), class: 'mono'}])));
    replace(history, table('Changes, newest first (the last 100)',
      [{label: 'Version', num: true}, {label: 'When'}, {label: 'Who'}, {label: 'Old → new'}, {label: 'Note'}],
      hist.history.map((c) => [
        String(c.version),
        fmt.when(c.when),
        c.who,
        h('ul', {class: 'changes'}, Object.keys(c.new || {}).sort().map((k) =>
          h('li', null, h('span', {class: 'mono'}, `${k}: ${c.old && k in c.old ? compact(c.old[k]) : '—'} → ${compact(c.new[k])}`)))),
        c.note || '',
      ]), 'No change yet: every value is its default.'));
  }

  await load();
}
