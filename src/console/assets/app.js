// The console's shell: the login form, the header, and the routes in the URL's
// hash (#/ triage, #/find?filters, #/instance/TENANT/KEY, #/batches, #/batch/ID), so a
// link opens that exact view.

import { api, changedSince, forgetToken, Problem, setToken, token, watchedAnswers } from './api.js';
import { renderBatch, renderBatches } from './batches.js';
import { h, show } from './dom.js';
import { renderFind } from './find.js';
import { renderInstance } from './instance.js';
import { renderTriage } from './triage.js';

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const who = document.getElementById('who');
const logout = document.getElementById('logout');
const live = document.getElementById('live');

// Live: the view's answers are asked for again every second (a 304 when unchanged);
// a change renders the view again in place. Not while a dialog is open, the tab is
// hidden, or another render is under way.
const POLL_MS = 1000;
let rendering = 0;   // renders started; a poll's render waits for none to run
let polling = false;

let me = null;  // GET /v1/me: token name, tenant, role

function renderLogin(message) {
  nav.hidden = true;
  logout.hidden = true;
  who.textContent = '';
  live.textContent = '';
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

async function route({ again = false } = {}) {
  if (!token()) return renderLogin();
  if (!me) return start();
  rendering += 1;
  try {
    await render(again);
  } finally {
    rendering -= 1;
  }
}

async function render(again) {
  // Rendering again keeps the reader where they were: the scroll and the focus.
  const scroll = window.scrollY;
  const focused = again ? document.activeElement?.id : null;
  // And what they had opened (marked data-keep by the view).
  const opened = again ? [...main.querySelectorAll('details[open][data-keep]')].map((d) => d.dataset.keep) : [];
  if (!again) watchedAnswers().clear();
  const { path, params } = parseHash();
  for (const link of nav.querySelectorAll('a')) {
    const current = (link.getAttribute('href') === '#/' && path === '/') ||
      (link.getAttribute('href') === '#/find' && path === '/find') ||
      (link.getAttribute('href') === '#/batches' && (path === '/batches' || path.startsWith('/batch/')));
    if (current) link.setAttribute('aria-current', 'page'); else link.removeAttribute('aria-current');
  }
  try {
    if (path.startsWith('/instance/')) {
      const [tenant, ...rest] = path.slice('/instance/'.length).split('/');
      await renderInstance(main, me, decodeURIComponent(tenant), decodeURIComponent(rest.join('/')));
    } else if (path.startsWith('/batch/')) {
      await renderBatch(main, me, decodeURIComponent(path.slice('/batch/'.length)), params);
    } else if (path === '/batches') {
      await renderBatches(main, me, params);
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
  if (again) {
    for (const details of main.querySelectorAll('details[data-keep]')) {
      if (opened.includes(details.dataset.keep)) details.open = true;
    }
    window.scrollTo(0, scroll);
    if (focused) document.getElementById(focused)?.focus();
    show(live, `Updated ${new Date().toLocaleTimeString()}`);
  } else {
    show(live, 'Live');
  }
}

async function poll() {
  if (polling || rendering || !me || document.hidden || document.querySelector('dialog[open]')) {
    return;
  }
  polling = true;
  try {
    for (const [url, etag] of [...watchedAnswers()]) {
      if (await changedSince(url, etag)) {
        if (!rendering && me && !document.querySelector('dialog[open]')) await route({ again: true });
        break;
      }
    }
  } catch {
    show(live, 'Not live: the server did not answer');
  } finally {
    polling = false;
  }
}
setInterval(poll, POLL_MS);

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
