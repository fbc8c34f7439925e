// The public HTTP API, and nothing else. The token lives in this tab's
// sessionStorage only: never in a URL, never in localStorage, gone with the tab.

const TOKEN = 'waystone.token';

export class Problem extends Error {
  constructor(status, body) {
    super(body?.detail || body?.title || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

export function token() { return sessionStorage.getItem(TOKEN); }
export function setToken(value) { sessionStorage.setItem(TOKEN, value); }
export function forgetToken() { sessionStorage.removeItem(TOKEN); }

// The GET answers the view on screen is made of (URL -> ETag), marked `watch` by
// the view: app.js asks the server every second whether one changed
// (If-None-Match; an unchanged one is a 304 without a body) and renders the view
// again when one has.
const watched = new Map();
export function watchedAnswers() { return watched; }

function loggedOut() {
  forgetToken();
  window.dispatchEvent(new Event('waystone:logged-out'));
}

// True when the answer at `url` is no longer the one tagged `etag`: a 200 with
// another tag, or a 404 (it is gone: the view says so once rendered again).
// Throws on other answers (a 503 while the server is busy): the view stays.
export async function changedSince(url, etag) {
  const headers = { Authorization: `Bearer ${token()}`, Accept: 'application/json' };
  if (etag) headers['If-None-Match'] = etag;
  const response = await fetch(url, { headers, cache: 'no-store' });
  if (response.status === 304) return false;
  if (response.status === 401) loggedOut();
  if (response.status === 404) return true;
  if (!response.ok) throw new Error(`the server answered ${response.status}`);
  // Without a tag (a proxy dropped it) every answer looks new: compare nothing.
  const fresh = response.headers.get('ETag');
  return Boolean(fresh && fresh !== etag);
}

// Calls the API with the token; answers the parsed JSON or throws a Problem (the
// server's problem+json). A 401 forgets the token: the login form comes back.
export async function api(path, { method = 'GET', body, query, watch = false } = {}) {
  const url = new URL(path, location.origin);
  for (const [name, value] of Object.entries(query ?? {})) {
    if (value !== undefined && value !== null && value !== '') url.searchParams.set(name, value);
  }
  const headers = { Authorization: `Bearer ${token()}`, Accept: 'application/json' };
  const init = { method, headers, cache: 'no-store' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    // A retried click must not act twice: the server replays the first answer.
    if (method === 'POST') headers['Idempotency-Key'] = crypto.randomUUID();
    init.body = JSON.stringify(body);
  }
  const response = await fetch(url, init);
  const text = await response.text();
  let parsed = null;
  try { parsed = text ? JSON.parse(text) : null; } catch { parsed = { detail: text }; }
  if (!response.ok) {
    if (response.status === 401) loggedOut();
    throw new Problem(response.status, parsed);
  }
  if (watch) watched.set(url.href, response.headers.get('ETag'));
  return parsed;
}

const RANK = { viewer: 1, operator: 2, admin: 3 };

// True when `me` (GET /v1/me) may run operator actions; the server checks again.
export function mayAct(me) { return (RANK[me?.role] ?? 0) >= RANK.operator; }

// True when `me` may take `action` (or hold `see_redacted`) in `tenant`: what
// GET /v1/me lists for it. The server checks again.
export function mayDo(me, tenant, action) {
  const actions = me?.actions_by_tenant?.[tenant] ?? me?.actions ?? [];
  return actions.includes(action);
}

// The whole key in one encoded segment: a key may hold '/' and '..', and the browser
// would resolve a literal '/../' into another path (another instance). The server
// decodes %2F back into the key.
export function instancePath(key) {
  return `/v1/instances/${encodeURIComponent(key)}`;
}
