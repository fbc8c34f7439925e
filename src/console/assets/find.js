// Find: filters of GET /v1/instances, kept in the URL's hash (#/find?state=…), so a
// link opens exactly this view; server-side pages (next_cursor).

import { api, instancePath, Problem } from './api.js';
import { batchActions, batchFilter, openBatchDialog } from './batches.js';
import { h, show } from './dom.js';
import { instanceHref, stateLabel, time } from './format.js';

const STATES = ['', 'running', 'needs_attention', 'failed', 'compensating', 'compensated',
  'completed', 'closed'];
const ERROR_CLASSES = ['', 'transient', 'rejected', 'unknown'];
const ALERTS = ['', 'any', 'retries_exhausted', 'lookup_contradiction', 'compensation_failed',
  'idempotency_conflict', 'needs_operator', 'delivery_parked', 'sink_disabled',
  'unknown_unresolved', 'inbox_conflict', 'result_missing', 'optional_step_failed',
  'contradicting_decision', 'approval_rejected', 'inconsistency_after_approval'];
const STEP_STATES = ['', 'pending', 'running', 'waiting', 'completed', 'failed', 'unknown',
  'compensating', 'compensated', 'compensation_failed', 'skipped'];
const FILTERS = ['state', 'workflow', 'definition', 'step', 'step_state', 'error_class',
  'http_status', 'alert', 'key', 'match', 'external_id', 'created_after', 'created_before',
  'updated_after', 'updated_before', 'tenant'];
const TIMES = new Set(['created_after', 'created_before', 'updated_after', 'updated_before']);

function select(name, label, options, value) {
  return h('div', { class: 'field' }, h('label', { for: `f-${name}` }, label),
    h('select', { id: `f-${name}`, name }, options.map((o) =>
      h('option', { value: o, selected: o === value }, o === '' ? 'any' : o))));
}

// A time in the browser's zone, kept in the URL as UTC (RFC 3339), as the API takes it.
function when(name, label, value) {
  const local = value ? toLocalInput(value) : '';
  return h('div', { class: 'field' }, h('label', { for: `f-${name}` }, label),
    h('input', { id: `f-${name}`, name, type: 'datetime-local', value: local, step: 1 }));
}

function toLocalInput(rfc3339) {
  const at = new Date(rfc3339);
  if (Number.isNaN(at.getTime())) return '';
  const shifted = new Date(at.getTime() - at.getTimezoneOffset() * 60000);
  return shifted.toISOString().slice(0, 19);
}

function text(name, label, value, help) {
  return h('div', { class: 'field' }, h('label', { for: `f-${name}` }, label),
    h('input', { id: `f-${name}`, name, type: 'text', value: value ?? '', autocomplete: 'off',
      'aria-describedby': help ? `f-${name}-help` : null }),
    help ? h('span', { id: `f-${name}-help`, class: 'muted small' }, help) : null);
}

export async function renderFind(main, me, params) {
  const form = h('form', { class: 'filters', 'aria-label': 'Filters' },
    select('state', 'State', STATES, params.get('state') ?? ''),
    text('workflow', 'Workflow', params.get('workflow')),
    text('definition', 'Definition version', params.get('definition'), 'its hash, or the first 12 digits'),
    text('step', 'Step', params.get('step'), 'a step of this name…'),
    select('step_state', 'Step state', STEP_STATES, params.get('step_state') ?? ''),
    select('error_class', 'Error class', ERROR_CLASSES, params.get('error_class') ?? ''),
    text('http_status', 'HTTP status', params.get('http_status'), 'some request got it, e.g. 503'),
    select('alert', 'Open alert', ALERTS, params.get('alert') ?? ''),
    text('key', 'Business key', params.get('key'), 'exact: opens that one instance'),
    select('match', 'Key match', ['exact', 'prefix'], params.get('match') ?? 'exact'),
    text('external_id', 'External id', params.get('external_id'), 'e.g. an ERP order number'),
    when('created_after', 'Created from', params.get('created_after')),
    when('created_before', 'Created before', params.get('created_before')),
    when('updated_after', 'Updated from', params.get('updated_after')),
    when('updated_before', 'Updated before', params.get('updated_before')),
    me.tenant === '*' ? text('tenant', 'Tenant', params.get('tenant')) : null,
    h('div', { class: 'field submit' }, h('button', { type: 'submit', class: 'primary' }, 'Find')));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    for (const name of FILTERS) {
      let value = form.elements[name]?.value?.trim();
      // datetime-local is the browser's zone: the API takes UTC.
      if (value && TIMES.has(name)) value = new Date(value).toISOString();
      if (value) next.set(name, value);
    }
    location.hash = `#/find?${next}`;
  });
  const results = h('div', { class: 'results', 'aria-live': 'polite' });
  show(main, h('h1', {}, 'Find instances'), form, results);

  const key = params.get('key');
  const prefix = params.get('match') === 'prefix';
  let items = [];
  let nextCursor = null;
  try {
    if (key && !prefix && !params.get('external_id')) {
      // A business key names one instance (per tenant).
      const one = await api(instancePath(key), { watch: true, query: { tenant: params.get('tenant') } });
      items = [one];
    } else {
      const page = await api('/v1/instances', { watch: true, query: {
        state: params.get('state'), workflow: params.get('workflow'),
        error_class: params.get('error_class'), alert: params.get('alert'),
        created_after: params.get('created_after'), created_before: params.get('created_before'),
        updated_after: params.get('updated_after'), updated_before: params.get('updated_before'),
        definition: params.get('definition'), step: params.get('step'),
        step_state: params.get('step_state'), http_status: params.get('http_status'),
        tenant: params.get('tenant'), cursor: params.get('cursor'), limit: 50,
        // An exact key with an external id: searched by prefix, kept when exact.
        key_prefix: key ? key : undefined, external_id: params.get('external_id'),
      } });
      items = key && !prefix ? page.items.filter((i) => i.key === key) : page.items;
      nextCursor = page.next_cursor;
    }
  } catch (problem) {
    if (problem instanceof Problem && problem.status === 404) items = [];
    else return show(results, h('p', { class: 'error', role: 'alert' }, problem.message));
  }
  // A filter (not one exact key) may be acted on as a whole, as a batch.
  const filter = batchFilter(params);
  const bulk = batchActions(me, params.get('tenant')).length && filter && (items.length > 0 || nextCursor)
    ? h('p', {}, h('button', { type: 'button', id: 'act-on-these',
      onclick: () => openBatchDialog(me, filter, params.get('tenant')) },
      `Act on ${nextCursor ? 'all' : `these ${items.length}`} that match…`)) : null;
  const more = new URLSearchParams(params);
  if (nextCursor) more.set('cursor', nextCursor);
  show(results,
    h('p', {}, `${items.length} instance${items.length === 1 ? '' : 's'}${nextCursor ? ' on this page' : ''}.`),
    items.length ? h('table', { class: 'found' },
      h('thead', {}, h('tr', {}, ['business key', 'state', 'workflow', 'tenant', 'reason', 'updated']
        .map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, items.map((i) => h('tr', {},
        h('td', {}, h('a', { href: instanceHref(i.tenant, i.key) }, i.key)),
        h('td', {}, stateLabel(i.state)), h('td', {}, i.workflow), h('td', {}, i.tenant),
        h('td', {}, i.status_reason), h('td', {}, time(i.updated_at)))))) : null,
    bulk,
    nextCursor ? h('p', {}, h('a', { href: `#/find?${more}` }, 'Next page →')) : null);
}
