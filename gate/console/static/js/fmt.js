// Formatting figures for people.

export function age(seconds) {
  if (seconds === null || seconds === undefined) return '—';
  if (seconds < 10) return `${seconds.toFixed(1)} s`;
  if (seconds < 120) return `${Math.round(seconds)} s`;
  const m = Math.floor(seconds / 60);
  if (m < 120) return `${m} min ${Math.round(seconds - m * 60)} s`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return `${hours} h ${m % 60} min`;
  return `${Math.floor(hours / 24)} d ${hours % 24} h`;
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined) return '—';
  if (seconds < 1) return `${(seconds * 1000).toPrecision(3)} ms`;
  return age(seconds);
}

export function count(n) {
  return Number(n).toLocaleString('en');
}

export function rate(n) {
  if (n === 0) return '0';
  return n < 10 ? n.toFixed(2) : n.toFixed(1);
}

// when shows an API timestamp (RFC 3339 UTC) as written, or a dash.
export function when(t) {
  return t ? t.replace('T', ' ') : '—';
}

export function json(v) {
  return JSON.stringify(v, null, 2);
}

export function short(hash) {
  return hash ? `${hash.slice(0, 12)}…` : '—';
}
