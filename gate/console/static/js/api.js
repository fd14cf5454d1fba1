// The JSON API, called with the operator's bearer token. The token is kept in this tab's
// sessionStorage only: it is sent in the Authorization header, never in a URL or a cookie, and
// it is gone when the tab closes.

const KEY = 'sluice.token';

export function token() {
  return sessionStorage.getItem(KEY);
}

export function setToken(t) {
  if (t) sessionStorage.setItem(KEY, t);
  else sessionStorage.removeItem(KEY);
}

// APIError is a refusal or failure: the HTTP status and the API's error body
// ({error_code, message, field, ...}).
export class APIError extends Error {
  constructor(status, body) {
    const msg = body && body.message ? body.message : `HTTP ${status}`;
    super(msg);
    this.status = status;
    this.code = body && body.error_code;
    this.field = body && body.field;
    this.body = body;
  }
}

// unauthorized is called when the API refuses the token (401), so the console can ask for
// another.
let unauthorized = () => {};
export function onUnauthorized(fn) {
  unauthorized = fn;
}

// call sends method path (below /v1, relative to the console, so a proxy that mounts sluice
// under a prefix keeps working) with body as JSON, and returns the decoded answer.
export async function call(method, path, body, tok) {
  const headers = {Accept: 'application/json', Authorization: `Bearer ${tok || token() || ''}`};
  const init = {method, headers, cache: 'no-store', credentials: 'omit', redirect: 'error'};
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(new URL(`../v1/${path}`, document.baseURI), init);
  } catch (e) {
    throw new APIError(0, {error_code: 'unreachable', message: `sluice did not answer: ${e.message}`});
  }
  let data = null;
  try {
    data = await res.json();
  } catch (e) {
    data = null;
  }
  if (!res.ok) {
    const err = new APIError(res.status, data);
    if (res.status === 401 && !tok) unauthorized(err);
    throw err;
  }
  return data;
}

// query builds a query string from the set values of params.
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== '') q.set(k, v);
  }
  const s = q.toString();
  return s ? `?${s}` : '';
}
