// The console's shell: the login form, the header, and the routes in the URL's
// hash (#/ triage, #/find?filters, #/instance/TENANT/KEY, #/batches, #/batch/ID, #/tokens),
// so a link opens that exact view.

import { api, changedSince, forgetToken, Problem, setToken, token, watchedAnswers } from './api.js';
import { renderBatch, renderBatches } from './batches.js';
import { h, show } from './dom.js';
import { renderFind } from './find.js';
import { renderInstance } from './instance.js';
import { renderTokens } from './tokens.js';
import { renderTriage } from './triage.js';

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const who = document.getElementById('who');
const logout = document.getElementById('logout');
const live = document.getElementById('live');

// Live: the view's answers are asked for again (If-None-Match; a 304 when
// unchanged) and a change renders the view again in place. Not while a dialog is
// open, the tab is hidden, or the reader is editing a field of the view. Renders
// run one at a time, in order: a poll's render never lands over a view the reader
// has moved on to. The next poll waits at least a second, and five times as long
// as the last one took, so a busy server is asked less often.
const POLL_MS = 1000;
let renders = Promise.resolve();
let queued = 0;      // renders waiting or running
let polling = false;
let nextPollAt = 0;

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
      return refused(problem);
    }
    await route();
  });
  show(main, form);
  input.focus();
}

// The login form again, saying why the token was not taken.
function refused(problem) {
  forgetToken();
  me = null;
  renderLogin(problem instanceof Problem && problem.status === 401
    ? 'That token is not valid (unknown, revoked or expired).' : String(problem.message));
}

async function start() {
  me = await api('/v1/me');
  nav.hidden = false;
  // Tokens are an admin's: not offered to anyone else (the server refuses them anyway).
  document.getElementById('nav-tokens').hidden = me.role !== 'admin';
  logout.hidden = false;
  show(who, `${me.token} · ${me.role} · tenant ${me.tenant === '*' ? 'all' : me.tenant}`);
}

// Splits "#/path?query" into its path and URLSearchParams.
function parseHash() {
  const hash = location.hash.replace(/^#/, '') || '/';
  const cut = hash.indexOf('?');
  const path = cut < 0 ? hash : hash.slice(0, cut);
  const params = new URLSearchParams(cut < 0 ? '' : hash.slice(cut + 1));
  return { path, params };
}

// Renders the view the URL names. `again` (a poll's): only if the URL is still
// `hash`, keeping the reader's place.
function route({ again = false, hash = null } = {}) {
  queued += 1;
  renders = renders.then(async () => {
    try {
      if (!token()) return renderLogin();
      if (!me) await start();
      if (again && location.hash !== hash) return;  // moved on: that render follows
      await render(again);
    } catch (problem) {
      refused(problem);  // start(): the token was not taken (render catches its own)
    } finally {
      queued -= 1;
    }
  });
  return renders;
}

async function render(again) {
  // Rendering again keeps the reader where they were: the scroll and the focus.
  const scroll = window.scrollY;
  const focused = again ? document.activeElement?.id : null;
  // And what they had opened (marked data-keep by the view).
  const opened = again ? [...main.querySelectorAll('details[open][data-keep]')].map((d) => d.dataset.keep) : [];
  // Every render lists the answers it is made of anew: a view that failed to load
  // watches nothing.
  watchedAnswers().clear();
  const { path, params } = parseHash();
  for (const link of nav.querySelectorAll('a')) {
    const current = (link.getAttribute('href') === '#/' && path === '/') ||
      (link.getAttribute('href') === '#/find' && path === '/find') ||
      (link.getAttribute('href') === '#/tokens' && path === '/tokens') ||
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

// True while the reader is typing in the view (a filter not submitted yet).
function editing() {
  const active = document.activeElement;
  return Boolean(active && main.contains(active) && active.matches('input, select, textarea'));
}

async function poll() {
  if (polling || queued || !me || document.hidden || Date.now() < nextPollAt ||
      document.querySelector('dialog[open]') || editing()) {
    return;
  }
  polling = true;
  const started = Date.now();
  const hash = location.hash;
  try {
    for (const [url, etag] of [...watchedAnswers()]) {
      if (await changedSince(url, etag)) {
        if (!queued && !document.querySelector('dialog[open]') && !editing()) {
          await route({ again: true, hash });
        }
        break;
      }
    }
    if (live.textContent.startsWith('Not live')) show(live, 'Live');
  } catch (problem) {
    show(live, `Not live: ${problem.message}`);
  } finally {
    polling = false;
    nextPollAt = Date.now() + Math.max(POLL_MS, 5 * (Date.now() - started));
  }
}
setInterval(poll, 250);

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

route();
