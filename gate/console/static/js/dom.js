// Building the page from data. Everything that comes from the API goes in as text (text nodes,
// textContent, attribute values): never as HTML, so a tenant name or an error message can never
// become markup or code.

const SVG = 'http://www.w3.org/2000/svg';

// h builds an element: h('a', {href: '#/x', class: 'c', on: {click: f}}, 'text', child, [more]).
// Attributes set to null, undefined or false are left out; true sets an empty attribute.
export function h(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

// s builds an SVG element the same way.
export function s(tag, attrs, ...children) {
  return build(document.createElementNS(SVG, tag), attrs, children);
}

function build(el, attrs, children) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'on') {
      for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
    } else if (k === 'props') {
      Object.assign(el, v);
    } else if (v === true) {
      el.setAttribute(k, '');
    } else if (v !== null && v !== undefined && v !== false) {
      el.setAttribute(k, String(v));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

// replace puts children in place of el's, keeping the keyboard focus on the element with the
// same data-key if the focus was inside el: a live refresh must not throw a keyboard user back
// to the top of the page.
export function replace(el, ...children) {
  const active = document.activeElement;
  const key = active && el.contains(active) ? active.getAttribute('data-key') : null;
  el.replaceChildren();
  append(el, children);
  if (key !== null) {
    const again = [...el.querySelectorAll('[data-key]')].find((n) => n.getAttribute('data-key') === key);
    if (again) again.focus();
  }
}

// table builds a table in a horizontally scrolling wrapper: columns are [{label, num}], rows
// arrays of cells (a cell is a node, text, or {value, num, class}).
export function table(caption, columns, rows, empty) {
  if (rows.length === 0) return h('p', {class: 'empty'}, empty || 'Nothing to show.');
  return h('div', {class: 'table-wrap', tabindex: '0', role: 'region', 'aria-label': caption},
    h('table', null,
      h('caption', null, caption),
      h('thead', null, h('tr', null, columns.map((c) => h('th', {scope: 'col', class: c.num ? 'num' : null}, c.label)))),
      h('tbody', null, rows.map((r) => h('tr', null, r.map((cell, i) => {
        const num = columns[i] && columns[i].num;
        if (cell && typeof cell === 'object' && !(cell instanceof Node) && !Array.isArray(cell)) {
          return h('td', {class: [num ? 'num' : '', cell.class || ''].join(' ').trim() || null}, cell.value);
        }
        return h('td', {class: num ? 'num' : null}, cell);
      }))))));
}

// message is a notice: kind 'error' is announced at once (role alert), 'ok' politely.
export function message(kind, text) {
  return h('div', {class: `message ${kind}`, role: kind === 'error' ? 'alert' : 'status'}, text);
}

// announce tells screen-reader users what just happened, without moving the focus.
export function announce(text) {
  const el = document.getElementById('announce');
  el.textContent = '';
  // A change after a tick is announced even when the text repeats.
  setTimeout(() => { el.textContent = text; }, 50);
}

// confirm asks in a modal dialog and resolves to true only if the operator confirms. The dialog
// traps the focus, Escape cancels, and the focus returns where it was.
export function confirm(title, text, action) {
  const dlg = document.getElementById('confirm');
  document.getElementById('confirm-title').textContent = title;
  document.getElementById('confirm-text').textContent = text;
  document.getElementById('confirm-ok').textContent = action;
  const back = document.activeElement;
  dlg.returnValue = '';
  return new Promise((resolve) => {
    const closed = () => {
      // A dialog closed and at once opened again still has the first closing's event queued:
      // it arrives while this opening is on screen, and must not answer it.
      if (dlg.open) {
        dlg.addEventListener('close', closed, {once: true});
        return;
      }
      if (back && back.isConnected) back.focus();
      resolve(dlg.returnValue === 'ok');
    };
    dlg.addEventListener('close', closed, {once: true});
    dlg.showModal();
    document.getElementById('confirm-cancel').focus();
  });
}
