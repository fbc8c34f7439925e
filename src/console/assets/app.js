// The console's shell: the login form, the header, and the routes in the URL's
// hash (#/ triage, #/find?filters, #/instance/TENANT/KEY, #/tokens), so a link opens that
// exact view.

import { api, forgetToken, Problem, setToken, token } from './api.js';
import { h, show } from './dom.js';
import { renderFind } from './find.js';
import { renderInstance } from './instance.js';
import { renderTokens } from './tokens.js';
import { renderTriage } from './triage.js';

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const who = document.getElementById('who');
const logout = document.getElementById('logout');

let me = null;  // GET /v1/me: token name, tenant, role

function renderLogin(message) {
  nav.hidden = true;
  logout.hidden = true;
  who.textContent = '';
  const input = h('input', {
    id: 'token', name: 'token', type: 'password', autocomplete: 'off', required: true,
    spellcheck: 'false', 'aria-describedby': 'token-help',
  });
  const error = h('p', { class: 'error', role: 'alert', id: 'login-error' }, message ?? '');
  const form = h('form', { class: 'login', 'aria-labelledby': 'login-title' },
    h('h1', { id: 'login-title' }, 'Log in'),
    h('label', { for: 'token' }, 'API token'),
    input,
    h('p', { id: 'token-help', class: 'muted' },
      'A token from `waystone token create`. It is kept for this tab only and sent with every API call.'),
    h('button', { type: 'submit' }, 'Log in'),
    error);
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    setToken(input.value.trim());
    try {
      await start();
    } catch (problem) {
      forgetToken();
      renderLogin(problem instanceof Problem && problem.status === 401
        ? 'That token is not valid (unknown, revoked or expired).' : String(problem.message));
    }
  });
  show(main, form);
  input.focus();
}

async function start() {
  me = await api('/v1/me');
  nav.hidden = false;
  // Tokens are an admin's: not offered to anyone else (the server refuses them anyway).
  document.getElementById('nav-tokens').hidden = me.role !== 'admin';
  logout.hidden = false;
  show(who, `${me.token} · ${me.role} · tenant ${me.tenant === '*' ? 'all' : me.tenant}`);
  await route();
}

// Splits "#/path?query" into its path and URLSearchParams.
function parseHash() {
  const hash = location.hash.replace(/^#/, '') || '/';
  const cut = hash.indexOf('?');
  const path = cut < 0 ? hash : hash.slice(0, cut);
  const params = new URLSearchParams(cut < 0 ? '' : hash.slice(cut + 1));
  return { path, params };
}

async function route() {
  if (!token()) return renderLogin();
  if (!me) return start();
  const { path, params } = parseHash();
  for (const link of nav.querySelectorAll('a')) {
    const current = link.getAttribute('href') === `#${path}`;
    if (current) link.setAttribute('aria-current', 'page'); else link.removeAttribute('aria-current');
  }
  try {
    if (path.startsWith('/instance/')) {
      const [tenant, ...rest] = path.slice('/instance/'.length).split('/');
      await renderInstance(main, me, decodeURIComponent(tenant), decodeURIComponent(rest.join('/')));
    } else if (path === '/tokens') {
      await renderTokens(main, me);
    } else if (path === '/find') {
      await renderFind(main, me, params);
    } else {
      await renderTriage(main, me, params);
    }
  } catch (problem) {
    if (!token()) return;  // a 401: the login form is shown
    show(main, h('h1', {}, 'Could not load this view'),
      h('p', { class: 'error', role: 'alert' }, problem.message));
  }
}

logout.addEventListener('click', () => {
  forgetToken();
  me = null;
  location.hash = '#/';
  renderLogin('Logged out.');
});
window.addEventListener('waystone:logged-out', () => {
  me = null;
  renderLogin('The server refused the token; log in again.');
});
window.addEventListener('hashchange', () => route());
// A view asks for a fresh render of itself (after an action).
window.addEventListener('waystone:refresh', () => route());

route().catch((problem) => renderLogin(problem.message));
