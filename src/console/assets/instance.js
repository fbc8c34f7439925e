// One instance (GET /v1/instances/{key}): why it stopped and what may follow, its
// header, the step timeline with every request each step sent, every attempt of
// every step (newest first, paged, with the worker and lease epoch it was sent
// under), its approvals (approvals.js), its alerts, the audit trail and event
// deliveries. Operator actions open the dialog.

import { api, instancePath, mayAct, mayDo } from './api.js';
import { approvalsSection } from './approvals.js';
import { h, show } from './dom.js';
import { openActionDialog } from './dialog.js';
import { actionWords, REASON_WORDS, relative, stateLabel, time } from './format.js';
import { nextActionsText } from './triage.js';

function row(label, ...value) { return [h('dt', {}, label), h('dd', {}, ...value)]; }

function copyButton(text, label) {
  return h('button', { type: 'button', class: 'small', 'aria-label': label, onclick: async (event) => {
    try {
      await navigator.clipboard.writeText(text);
      event.target.textContent = 'Copied';
    } catch {
      event.target.textContent = 'Select and copy';
    }
  } }, 'Copy');
}

function requestRow(r, withStep) {
  return h('tr', {},
    withStep ? h('td', {}, r.step) : null,
    h('td', {}, String(r.seq)), h('td', {}, r.phase), h('td', {}, time(r.started_at)),
    h('td', {}, r.latency_ms !== undefined ? `${r.latency_ms} ms` : '—'),
    h('td', {}, r.sent ? 'yes' : 'no'), h('td', {}, r.connection),
    h('td', {}, r.status ? String(r.status) : '—'),
    h('td', {}, r.error_class === 'none' ? 'ok' : `${r.error_class}: ${r.detail}`),
    h('td', {}, r.worker ? h('code', {}, r.worker) : 'not known'),
    h('td', {}, r.lease_epoch ? String(r.lease_epoch) : '—'));
}

// The attempts of one step (or, without `step`, of every step), newest first, a
// page at a time (GET /v1/attempts); "Older attempts" reads the next page.
function attemptsTable(view, step, me) {
  const body = h('tbody', {});
  const status = h('p', { class: 'muted small', 'aria-live': 'polite' });
  const older = h('button', { type: 'button', class: 'small older', hidden: true }, 'Older attempts');
  let cursor = null;
  const load = async () => {
    older.disabled = true;
    try {
      const page = await api('/v1/attempts', { query: {
        key: view.key, step: step?.name, limit: 50, cursor,
        tenant: me.tenant === '*' ? view.tenant : undefined,
      } });
      for (const r of page.items) body.appendChild(requestRow(r, !step));
      cursor = page.next_cursor;
      older.hidden = !cursor;
      const dropped = page.dropped ? ` The ${page.dropped} oldest were dropped (each step keeps its newest).` : '';
      show(status, `${body.children.length} of ${page.total} shown.${dropped}`);
    } catch (problem) {
      show(status, h('span', { class: 'error' }, problem.message));
    }
    older.disabled = false;
  };
  older.addEventListener('click', load);
  const columns = [...(step ? [] : ['step']), '#', 'phase', 'started', 'latency', 'sent', 'connection',
    'HTTP', 'outcome', 'worker', 'lease epoch'];
  const table = h('table', { class: 'requests' },
    h('caption', {}, step ? `Every attempt of ${step.name}, newest first` : 'Every attempt of every step, newest first'),
    h('thead', {}, h('tr', {}, columns.map((c) => h('th', { scope: 'col' }, c)))),
    body);
  return { element: h('div', {}, table, status, older), load };
}

// A table that loads its first page when its details open (kept open, as `keep`,
// when the view is drawn again).
function attemptsDetails(summary, table, className, keep) {
  const details = h('details', { class: className, 'data-keep': keep }, h('summary', {}, summary),
    table.element);
  let loaded = false;
  details.addEventListener('toggle', () => {
    if (details.open && !loaded) {
      loaded = true;
      table.load();
    }
  });
  return details;
}

function stepAttempts(view, step, me) {
  const total = step.requests_total ?? (step.requests ?? []).length;
  if (!total) return h('p', { class: 'muted small' }, 'No request sent yet.');
  return attemptsDetails(`Requests sent: ${total}`, attemptsTable(view, step, me), 'attempts',
    `requests:${step.name}`);
}

function stepsTimeline(view, me) {
  return h('ol', { class: 'timeline' }, view.steps.map((s) => h('li', { class: `step step-${s.state}` },
    h('h3', {}, s.name, ' ', stateLabel(s.state)),
    h('dl', { class: 'facts' },
      row('attempts', String(s.attempts)),
      s.external_id ? row('external id', h('code', {}, s.external_id)) : null,
      s.idempotency_key ? row('idempotency key', h('code', {}, s.idempotency_key)) : null,
      s.error_class !== 'none' ? row('last error', `${s.error_class}: ${s.error_message}`) : null,
      s.next_attempt_at ? row('next attempt', time(s.next_attempt_at), ` (${relative(s.next_attempt_at)})`) : null,
      s.resolution !== 'none' ? row('resolution', s.resolution) : null,
      s.unknown_outcomes ? row('unknown outcomes', String(s.unknown_outcomes)) : null,
      s.compensation_attempts ? row('compensation attempts', String(s.compensation_attempts)) : null,
      s.requests_dropped ? row('oldest requests dropped', String(s.requests_dropped)) : null,
      s.started_at ? row('started', time(s.started_at)) : null,
      s.finished_at ? row('finished', time(s.finished_at)) : null),
    stepAttempts(view, s, me))));
}

// Every attempt of the instance, across its steps.
function allAttempts(view, me) {
  const total = view.steps.reduce((sum, s) => sum + (s.requests_total ?? 0), 0);
  if (!total) return h('p', { class: 'muted' }, 'No request sent yet.');
  return attemptsDetails(`All ${total} attempts, newest first`, attemptsTable(view, null, me), 'all-attempts',
    'attempts:all');
}

export async function renderInstance(main, me, tenant, key) {
  const view = await api(instancePath(key), { watch: true, query: { tenant: me.tenant === '*' ? tenant : undefined } });
  const stopped = view.stopped ?? {};
  const canAct = mayAct(me);
  const act = async (options) => {
    const applied = await openActionDialog({ tenant: view.tenant, key: view.key, ...options });
    if (applied) window.dispatchEvent(new Event('waystone:refresh'));
  };
  const actions = (stopped.next_actions ?? []).map((a) => h('button', {
    type: 'button', class: `action action-${a.action}`, 'data-action': a.action, 'data-step': a.step ?? '',
    onclick: () => act({ action: a.action, step: a.step }),
  }, actionWords(a.action, a.step)));
  const openAlerts = view.alerts.filter((a) => a.state === 'open');
  show(main,
    h('p', {}, h('a', { href: '#/' }, '← Triage')),
    h('h1', {}, view.key, ' ', stateLabel(view.state)),
    h('section', { class: `stopped reason-${stopped.reason}`, 'aria-labelledby': 'why-title' },
      h('h2', { id: 'why-title' }, REASON_WORDS[stopped.reason] ?? stopped.reason),
      h('p', { class: 'why' }, stopped.words),
      h('p', { class: 'actions-text' }, nextActionsText(stopped.next_actions)),
      canAct ? (actions.length ? h('div', { class: 'actions', role: 'group', 'aria-label': 'Operator actions' }, actions) : null)
        : h('p', { class: 'muted' }, `Your token (${me.role}) may read only; an operator acts.`,
          (view.approvals ?? []).some((a) => a.state === 'waiting')
            ? ' An approval below may still be yours to decide.' : '')),
    h('section', { 'aria-labelledby': 'header-title' },
      h('h2', { id: 'header-title' }, 'Instance'),
      h('dl', { class: 'facts' },
        row('business key', h('code', {}, view.key)),
        row('tenant', view.tenant),
        row('workflow', view.workflow, ' · definition ',
          h('a', { href: `#/find?${new URLSearchParams({ workflow: view.workflow, definition: view.definition_hash.slice(0, 12) })}`,
            title: `Every instance on definition ${view.definition_hash}` }, view.definition_hash.slice(0, 12))),
        row('state', stateLabel(view.state)),
        row('reason', view.status_reason || '—'),
        row('trace id', h('code', {}, view.trace_id), ' ', copyButton(view.trace_id, 'Copy the trace id')),
        row('created', time(view.created_at)),
        row('updated', time(view.updated_at))),
      h('details', { 'data-keep': 'input' }, h('summary', {}, 'Input (pinned)'),
        h('pre', { class: 'input' }, JSON.stringify(view.input, null, 2)))),
    approvalsSection(view, me),
    h('section', { 'aria-labelledby': 'steps-title' },
      h('h2', { id: 'steps-title' }, 'Steps'), stepsTimeline(view, me)),
    h('section', { 'aria-labelledby': 'attempts-title' },
      h('h2', { id: 'attempts-title' }, 'Attempts'), allAttempts(view, me)),
    h('section', { 'aria-labelledby': 'alerts-title' },
      h('h2', { id: 'alerts-title' }, `Alerts (${openAlerts.length} open)`),
      view.alerts.length ? h('ul', { class: 'alerts' }, view.alerts.map((a) => h('li', {},
        stateLabel(a.state), ` ${a.kind}`, a.step ? ` at ${a.step}` : '', `: ${a.message} · `, time(a.created_at),
        canAct && a.state === 'open' && mayDo(me, view.tenant, 'acknowledge') ? [' ', h('button', { type: 'button', class: 'small action-acknowledge',
          onclick: () => act({ action: 'acknowledge', alert: a }) }, 'Acknowledge')] : null)))
        : h('p', { class: 'muted' }, 'None.')),
    h('section', { 'aria-labelledby': 'audit-title' },
      h('h2', { id: 'audit-title' }, 'Audit trail'),
      view.audit.length ? h('table', { class: 'audit' },
        h('thead', {}, h('tr', {}, ['at', 'actor', 'action', 'reason'].map((c) => h('th', { scope: 'col' }, c)))),
        h('tbody', {}, view.audit.map((a) => h('tr', {},
          h('td', {}, time(a.at)), h('td', {}, a.actor), h('td', {}, a.action), h('td', {}, a.reason)))))
        : h('p', { class: 'muted' }, 'No operator action yet.')),
    h('section', { 'aria-labelledby': 'deliveries-title' },
      h('h2', { id: 'deliveries-title' }, 'Event deliveries'),
      view.deliveries.length ? h('ul', {}, view.deliveries.map((d) => h('li', {},
        `${d.type} → ${d.sink}: `, stateLabel(d.state), ` after ${d.attempts} attempts`,
        d.last_error ? ` (${d.last_error})` : '')))
        : h('p', { class: 'muted' }, 'None.')));
  main.focus();
}
