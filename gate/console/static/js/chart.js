// Small line charts in inline SVG: no library, no style attribute (the page's Content-Security-
// Policy allows none), a text alternative for screen readers.

import {h, s} from './dom.js';

const W = 300;
const H = 80;

// lineChart draws series ([{name, values (numbers or null), key: 'a'|'b'}]) over the same steps.
// id names the figure, label the chart; format prints a value for the text alternative and the legend.
export function lineChart(id, label, series, format) {
  const all = series.flatMap((x) => x.values).filter((v) => v !== null && v !== undefined);
  const max = Math.max(...all, 0) || 1;
  const n = Math.max(...series.map((x) => x.values.length), 2);
  const x = (i) => (i * W) / (n - 1);
  const y = (v) => H - 2 - (v * (H - 4)) / max;
  const paths = series.map((ser) => {
    let d = '';
    let pen = false;
    ser.values.forEach((v, i) => {
      if (v === null || v === undefined) {
        pen = false;
        return;
      }
      const alone = !pen && (i + 1 >= ser.values.length || ser.values[i + 1] === null || ser.values[i + 1] === undefined);
      d += `${pen ? 'L' : 'M'}${x(i).toFixed(1)},${y(v).toFixed(1)} `;
      // A point with no neighbour gets a short dash, so that a lone step still shows.
      if (alone) d += `h${i === 0 ? 3 : -3} `;
      pen = true;
    });
    return s('path', {d: d.trim() || 'M0,0', class: `line line-${ser.key}`});
  });
  const latest = (ser) => {
    for (let i = ser.values.length - 1; i >= 0; i--) {
      if (ser.values[i] !== null && ser.values[i] !== undefined) return format(ser.values[i]);
    }
    return 'none';
  };
  const peak = (ser) => {
    const vs = ser.values.filter((v) => v !== null && v !== undefined);
    return vs.length ? format(Math.max(...vs)) : 'none';
  };
  const summary = series.map((ser) => `${ser.name}: latest ${latest(ser)}, peak ${peak(ser)}`).join('; ');
  return h('figure', {class: 'chart', id},
    s('svg', {viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none', role: 'img', 'aria-label': `${label}. ${summary}`},
      s('title', null, label),
      s('line', {x1: 0, y1: H - 1, x2: W, y2: H - 1, class: 'axis', stroke: '#c9d1d9'}),
      paths),
    h('figcaption', null,
      h('span', null, label),
      series.map((ser) => h('span', null, h('span', {class: `key key-${ser.key}`, 'aria-hidden': 'true'}),
        `${ser.name} ${latest(ser)} (peak ${peak(ser)})`))));
}
