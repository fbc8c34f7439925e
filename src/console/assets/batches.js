// Batches: one operator action over every instance a filter matches. The dialog
// shows the server's preview (the count and the first dry runs), requires a reason
// and starts the batch; the batches view lists them, and one batch shows its
// progress and each item's result (judged by where its instance came to rest),
// live while it runs.

import { api, mayDo } from './api.js';
import { planView } from './dialog.js';
import { h, show } from './dom.js';
import { actionWords, instanceHref, stateLabel, time } from './format.js';

const ACTIONS = ['retry', 'skip', 'compensate', 'close'];
const STEP_ACTIONS = new Set(['retry', 'skip']);
const FILTER_FIELDS = ['state', 'workflow', 'error_class', 'alert', 'created_after',
  'created_before', 'updated_after', 'updated_before', 'definition', 'step', 'step_state',
  'http_status', 'external_id'];
const OPEN_ITEMS = ['pending', 'applying', 'applied'];

// The batch actions `me` may take in `tenant` (its own when not named): what
// GET /v1/me lists. None for an all-tenants token until a tenant is chosen (a batch
// is within one tenant). The server checks again.
export function batchActions(me, tenant) {
  if (!tenant && me.tenant === '*') return [];
  return ACTIONS.filter((a) => mayDo(me, tenant || me.tenant, a));
}

const dialog = () => document.getElementById('action-dialog');

// The batch filter of the find view's parameters; null when they name one exact key
// or nothing at all (a batch needs a filter).
export function batchFilter(params) {
  const filter = {};
  for (const name of FILTER_FIELDS) {
    if (params.get(name)) filter[name] = params.get(name);
  }
  const key = params.get('key');
  if (key) {
    if (params.get('match') !== 'prefix') return null;
    filter.key_prefix = key;
  }
  return Object.keys(filter).length ? filter : null;
}

function filterWords(filter) {
  return Object.entries(filter).map(([name, value]) => `${name} = ${value}`).join(', ');
}

// Opens the dialog that previews and starts a batch over `filter`. Resolves once closed.
export function openBatchDialog(me, filter, tenant) {
  const box = dialog();
  const action = h('select', { id: 'batch-action', name: 'action' },
    batchActions(me, tenant).map((a) => h('option', { value: a }, actionWords(a))));
  const step = h('input', { id: 'batch-step', name: 'step', type: 'text', autocomplete: 'off',
    'aria-describedby': 'batch-step-help' });
  const reason = h('textarea', { id: 'batch-reason', name: 'reason', required: true, rows: 3,
    maxlength: 2000, 'aria-describedby': 'batch-reason-help' });
  const preview = h('div', { class: 'preview', 'aria-live': 'polite', id: 'batch-preview' });
  const result = h('div', { class: 'result', 'aria-live': 'polite', id: 'batch-result' });
  const start = h('button', { type: 'submit', class: 'primary', disabled: true }, 'Start batch');
  const cancel = h('button', { type: 'button' }, 'Cancel');
  const form = h('form', { method: 'dialog', class: 'action-form' },
    h('h2', { id: 'dialog-title' }, 'Act on every instance that matches'),
    h('p', { class: 'muted' }, `Filter: ${filterWords(filter)}${tenant ? `; tenant ${tenant}` : ''}`),
    h('p', {}, h('label', { for: 'batch-action' }, 'Action'), action),
    h('p', {}, h('label', { for: 'batch-step' }, 'Step'), step,
      h('span', { id: 'batch-step-help', class: 'muted small' },
        ' For retry and skip: the step to act on; the batch then takes only instances stopped at it.')),
    h('h3', {}, 'Preview'),
    preview,
    h('label', { for: 'batch-reason' }, 'Reason (required, recorded with the batch and on every instance)'),
    reason,
    h('p', { id: 'batch-reason-help', class: 'muted small' }, 'Say why, for the next person on call.'),
    result,
    h('div', { class: 'buttons' }, cancel, start));

  const body = (why) => {
    const out = { action: action.value, reason: why, filter: { ...filter } };
    if (tenant) out.tenant = tenant;
    const named = step.value.trim();
    if (STEP_ACTIONS.has(action.value) && named) {
      out.step = named;
      out.filter.stopped_at = named;
    }
    return out;
  };

  let matched = 0;
  const refreshStart = () => { start.disabled = matched === 0 || reason.value.trim() === ''; };
  const runPreview = async () => {
    matched = 0;
    refreshStart();
    show(preview, h('p', { class: 'muted' }, 'Asking the server for a preview…'));
    try {
      const seen = await api('/v1/batches', { method: 'POST', query: { dry_run: 'true' },
        body: body(reason.value.trim() || 'preview') });
      matched = seen.count;
      show(preview,
        h('p', { id: 'batch-count' }, `${seen.count} instance${seen.count === 1 ? '' : 's'} match`,
          ` (a batch takes at most ${seen.max_items}).`),
        seen.keys.length ? h('p', { class: 'muted small' }, 'First: ', seen.keys.join(', '),
          seen.count > seen.keys.length ? ' …' : '') : null,
        seen.dry_runs.length ? h('h4', {}, `Dry runs of the first ${seen.dry_runs.length}`) : null,
        seen.dry_runs.map((run) => h('details', { class: 'dry-run' },
          h('summary', {}, run.key, run.refused ? ' — refused' : ''),
          run.refused ? h('p', { class: 'error' }, run.refused.detail) : planView(run.plan))));
    } catch (problem) {
      show(preview, h('p', { class: 'error', role: 'alert' }, `The server refuses it: ${problem.message}`));
    }
    refreshStart();
  };
  action.addEventListener('change', runPreview);
  step.addEventListener('change', runPreview);
  reason.addEventListener('input', refreshStart);

  return new Promise((resolve) => {
    let created = null;
    cancel.addEventListener('click', () => box.close());
    form.addEventListener('submit', async (event) => {
      event.preventDefault();
      if (created) return box.close();
      if (!reason.value.trim()) return reason.focus();
      start.disabled = true;
      try {
        created = await api('/v1/batches', { method: 'POST', body: body(reason.value.trim()) });
        show(result, h('h3', {}, 'Result'),
          h('p', { class: 'ok', role: 'status' }, `Batch ${created.id} started over ${created.total} instances. `,
            h('a', { href: `#/batch/${encodeURIComponent(created.id)}`, id: 'batch-link',
              onclick: () => box.close() }, 'Follow it →')));
        start.textContent = 'Done';
        start.disabled = false;
        cancel.hidden = true;
        start.focus();
      } catch (problem) {
        show(result, h('p', { class: 'error', role: 'alert' }, `Refused: ${problem.message}`));
        start.disabled = false;
      }
    });
    box.addEventListener('close', () => {
      box.replaceChildren();
      resolve(created);
    }, { once: true });
    show(box, form);
    box.showModal();
    action.focus();
    runPreview();
  });
}

const openCount = (batch) => OPEN_ITEMS.reduce((n, s) => n + (batch.counts[s] ?? 0), 0);

function progress(batch) {
  const done = batch.total - openCount(batch);
  return h('p', {}, h('label', { for: 'batch-progress' }, `${done} of ${batch.total} done `),
    h('progress', { id: 'batch-progress', class: 'batch-progress', max: batch.total, value: done }, `${done}/${batch.total}`));
}

export async function renderBatches(main, me, params) {
  const page = await api('/v1/batches', { watch: true,
    query: { cursor: params.get('cursor'), limit: 50 } });
  const more = page.next_cursor ? `#/batches?cursor=${encodeURIComponent(page.next_cursor)}` : null;
  show(main, h('h1', {}, 'Batches'),
    h('p', { class: 'muted' }, 'One operator action over every instance a filter matched. Start one from Find.'),
    page.items.length ? h('table', { class: 'found' },
      h('thead', {}, h('tr', {}, ['batch', 'action', 'state', 'done', 'actor', 'reason', 'created']
        .map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, page.items.map((b) => h('tr', {},
        h('td', {}, h('a', { href: `#/batch/${encodeURIComponent(b.id)}` }, b.id)),
        h('td', {}, actionWords(b.action, b.fields.step)), h('td', {}, stateLabel(b.state)),
        h('td', {}, `${b.total - openCount(b)} / ${b.total}`), h('td', {}, b.actor),
        h('td', {}, b.reason), h('td', {}, time(b.created_at))))))
      : h('p', {}, 'No batches yet.'),
    more ? h('p', {}, h('a', { href: more }, 'Older batches →')) : null);
}

export async function renderBatch(main, me, id, params) {
  // Watched: the view follows the batch's progress live (app.js polls with ETags).
  const batch = await api(`/v1/batches/${encodeURIComponent(id)}`,
    { watch: true, query: { limit: 100, cursor: params.get('cursor') } });
  const status = h('p', { role: 'status', id: 'batch-status' });
  const change = (verb) => async () => {
    try {
      await api(`/v1/batches/${encodeURIComponent(id)}/${verb}`, { method: 'POST', body: {} });
      window.dispatchEvent(new Event('waystone:refresh'));
    } catch (problem) {
      show(status, h('span', { class: 'error' }, `Refused: ${problem.message}`));
    }
  };
  // Offered only to roles that may; the server checks again.
  const live = batch.state === 'running' || batch.state === 'paused';
  const buttons = mayDo(me, batch.tenant, batch.action) && live ? h('div', { class: 'batch-actions' },
    batch.state === 'running' ? h('button', { type: 'button', id: 'batch-pause', onclick: change('pause') }, 'Pause') : null,
    batch.state === 'paused' ? h('button', { type: 'button', id: 'batch-resume', onclick: change('resume') }, 'Resume') : null,
    h('button', { type: 'button', id: 'batch-cancel', onclick: change('cancel') }, 'Cancel the rest')) : null;
  const counts = Object.entries(batch.counts).filter(([, n]) => n > 0);
  const next = new URLSearchParams(params);
  if (batch.next_cursor) next.set('cursor', batch.next_cursor);
  show(main,
    h('h1', {}, `Batch ${batch.id}`),
    h('p', { class: 'batch-head' }, actionWords(batch.action, batch.fields.step), ' · ', stateLabel(batch.state)),
    h('dl', { class: 'facts' },
      h('dt', {}, 'Actor'), h('dd', {}, batch.actor),
      h('dt', {}, 'Reason'), h('dd', {}, batch.reason),
      h('dt', {}, 'Tenant'), h('dd', {}, batch.tenant),
      h('dt', {}, 'Filter'), h('dd', {}, filterWords(batch.filter)),
      h('dt', {}, 'Created'), h('dd', {}, time(batch.created_at)),
      h('dt', {}, 'Updated'), h('dd', {}, time(batch.updated_at))),
    progress(batch),
    h('ul', { class: 'counts', 'aria-label': 'Items by result' },
      counts.map(([state, n]) => h('li', {}, stateLabel(state), ` ${n}`))),
    buttons, status,
    h('h2', {}, 'Items'),
    h('table', { class: 'found', id: 'batch-items' },
      h('thead', {}, h('tr', {}, ['instance', 'result', 'instance state', 'message', 'tries', 'updated']
        .map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, batch.items.map((i) => h('tr', {},
        h('td', {}, h('a', { href: instanceHref(batch.tenant, i.key) }, i.key)),
        h('td', {}, stateLabel(i.state)),
        h('td', {}, i.result_state ? stateLabel(i.result_state) : h('span', { class: 'muted' }, '—')),
        h('td', {}, i.message ?? ''), h('td', {}, String(i.tries)), h('td', {}, time(i.updated_at)))))),
    batch.next_cursor ? h('p', {}, h('a', { href: `#/batch/${encodeURIComponent(id)}?${next}` }, 'More items →')) : null);
}
