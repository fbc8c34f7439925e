// An instance's approval steps (the view's "approvals"): each request with the
// snapshot its approver is asked about, its data version, deadlines and decision;
// an open one is decided here, quoting the request and data version shown
// (POST /v1/instances/{key}/decide). Whether this token may decide is the step's
// to say: the server answers 403 with why, and the reason is shown.

import { api, instancePath } from './api.js';
import { h, show } from './dom.js';
import { stateLabel, time } from './format.js';

function row(label, ...value) { return [h('dt', {}, label), h('dd', {}, ...value)]; }

function fieldsTable(fields) {
  return h('table', { class: 'snapshot' },
    h('caption', {}, 'What is approved (the material fields)'),
    h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'field'), h('th', { scope: 'col' }, 'value'))),
    h('tbody', {}, Object.entries(fields ?? {}).map(([pointer, value]) => h('tr', {},
      h('td', {}, h('code', {}, pointer)), h('td', {}, h('code', {}, JSON.stringify(value)))))));
}

function decideForm(view, me, a) {
  const status = h('p', { class: 'decide-status', role: 'status', 'aria-live': 'polite' });
  const comment = h('textarea', { id: `comment-${a.step}`, rows: 2, maxlength: 2000 });
  const decide = async (decision, button) => {
    button.disabled = true;
    try {
      const result = await api(`${instancePath(view.key)}/decide`, {
        method: 'POST',
        query: { tenant: me.tenant === '*' ? view.tenant : undefined },
        body: { step: a.step, request: a.request, data_version: a.data_version, decision, comment: comment.value },
      });
      show(status, `${decision === 'approve' ? 'Approved' : 'Rejected'}: the step is ${result.step_state}.`);
      window.dispatchEvent(new Event('waystone:refresh'));
    } catch (problem) {
      show(status, h('span', { class: 'error' }, problem.message));
      button.disabled = false;
    }
  };
  const approve = h('button', { type: 'button', class: 'action action-approve' }, 'Approve');
  const reject = h('button', { type: 'button', class: 'action action-reject' }, 'Reject');
  approve.addEventListener('click', () => decide('approve', approve));
  reject.addEventListener('click', () => decide('reject', reject));
  return h('form', { class: 'decide', onsubmit: (event) => event.preventDefault() },
    h('label', { for: comment.id }, 'Comment (kept with the decision)'), comment,
    h('div', { class: 'actions', role: 'group', 'aria-label': `Decide ${a.step}` }, approve, reject),
    status);
}

function approvalCard(view, me, a) {
  const open = a.state === 'waiting';
  const version = (a.data_version ?? '').slice(0, 16);
  return h('article', { class: `approval approval-${a.state}`, 'data-step': a.step },
    h('h3', {}, a.step, ' ', stateLabel(a.state)),
    a.snapshot?.summary ? h('p', { class: 'summary' }, a.snapshot.summary) : null,
    h('dl', { class: 'facts' },
      a.request ? row('request', String(a.request)) : row('next request', String(a.next_request ?? 1)),
      row('data version', h('code', { title: a.data_version }, version)),
      row('decided by', a.approvers?.group ? `group ${a.approvers.group}` : `role ${a.approvers?.role} or above`),
      a.snapshot?.requester ? row('requested by', a.snapshot.requester, ' (may not decide it)') : null,
      a.requested_at ? row('requested', time(a.requested_at)) : null,
      a.next_deadline_in_seconds !== undefined
        ? row('next deadline', `in ${Math.round(a.next_deadline_in_seconds / 60)} min`) : null,
      a.escalated_to ? row('escalated to', `group ${a.escalated_to}`) : null,
      a.decision ? row('decision', `${a.decision.outcome} by ${a.decision.by}`,
        a.decision.comment ? ` — ${a.decision.comment}` : '') : null),
    fieldsTable(a.snapshot?.fields),
    open ? decideForm(view, me, a) : null);
}

// The section, or null when the instance has no approval step.
export function approvalsSection(view, me) {
  if (!view.approvals?.length) return null;
  return h('section', { 'aria-labelledby': 'approvals-title' },
    h('h2', { id: 'approvals-title' }, 'Approvals'),
    view.approvals.map((a) => approvalCard(view, me, a)));
}
