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

// Calls the API with the token; answers the parsed JSON or throws a Problem (the
// server's problem+json). A 401 forgets the token: the login form comes back.
export async function api(path, { method = 'GET', body, query } = {}) {
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
    if (response.status === 401) {
      forgetToken();
      window.dispatchEvent(new Event('waystone:logged-out'));
    }
    throw new Problem(response.status, parsed);
  }
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
