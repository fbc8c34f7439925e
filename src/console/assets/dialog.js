// One dialog for every operator action: it shows the server's dry run first
// (?dry_run=true), requires a reason, then applies the action and shows the
// result. Nothing is sent for real until the operator presses Apply.

import { api, instancePath } from './api.js';
import { h, show } from './dom.js';
import { actionWords, stateLabel } from './format.js';

const dialog = () => document.getElementById('action-dialog');

// A dry run's plan: the state it moves to, the steps it changes, the calls that follow.
export function planView(plan) {
  const execute = plan.would_execute ?? [];
  const skip = plan.would_skip ?? [];
  const changed = plan.changed_steps ?? [];
  return h('div', { class: 'plan' },
    h('p', {}, 'Instance: ', stateLabel(plan.state_before), ' → ', stateLabel(plan.state_after)),
    changed.length ? h('p', {}, 'Steps changed now: ',
      changed.map((s, i) => [i ? ', ' : '', `${s.name} → `, stateLabel(s.state)])) : null,
    h('h4', {}, 'Calls the engine would make next'),
    execute.length ? h('ol', { class: 'calls' }, execute.map((c) => h('li', {},
      h('strong', {}, c.step), ` ${c.phase}`, c.method ? ` ${c.method} ${c.rendered_url ?? c.url}` : '',
      c.event ? ` event ${c.event}` : '',
      c.idempotency_key ? h('span', { class: 'muted' }, ` · Idempotency-Key ${c.idempotency_key}`) : '')))
      : h('p', { class: 'muted' }, 'None.'),
    skip.length ? [h('h4', {}, 'Steps skipped'),
      h('ul', {}, skip.map((s) => h('li', {}, h('strong', {}, s.step), ` — ${s.why}`)))] : null);
}

function alertView(result) {
  return h('p', {}, `Alert ${result.id} (${result.kind}): `, stateLabel(result.state),
    result.state_after ? [' → ', stateLabel(result.state_after)] : null);
}

// Opens the dialog for `action` ('retry', 'confirm', 'compensate', 'skip', 'close' on
// an instance; 'acknowledge' on an alert). Resolves once it is closed.
export function openActionDialog({ tenant, key, action, step, alert }) {
  const box = dialog();
  const isAlert = action === 'acknowledge';
  const path = isAlert ? `/v1/alerts/${encodeURIComponent(alert.id)}/acknowledge`
    : `${instancePath(key)}/${action}`;
  const title = isAlert ? `Acknowledge alert ${alert.kind}` : actionWords(action, step);
  const reason = h('textarea', { id: 'action-reason', name: 'reason', required: true, rows: 3,
    maxlength: 2000, 'aria-describedby': 'reason-help' });
  const happened = h('fieldset', { class: 'happened' },
    h('legend', {}, 'What happened on the other side?'),
    h('label', {}, h('input', { type: 'radio', name: 'happened', value: 'false', checked: true }),
      ' It did not happen (resubmit under the same idempotency key)'),
    h('label', {}, h('input', { type: 'radio', name: 'happened', value: 'true' }),
      ' It happened'));
  const externalId = h('input', { id: 'action-external-id', name: 'external_id', type: 'text',
    autocomplete: 'off' });
  const externalRow = h('p', { class: 'external', hidden: true },
    h('label', { for: 'action-external-id' }, 'External id (e.g. the ERP order number)'), externalId);
  const preview = h('div', { class: 'preview', 'aria-live': 'polite', id: 'action-preview' },
    h('p', { class: 'muted' }, 'Asking the server for a dry run…'));
  const result = h('div', { class: 'result', 'aria-live': 'polite', id: 'action-result' });
  const apply = h('button', { type: 'submit', class: 'primary', disabled: true }, 'Apply');
  const cancel = h('button', { type: 'button', value: 'cancel' }, 'Cancel');
  const form = h('form', { method: 'dialog', class: 'action-form' },
    h('h2', { id: 'dialog-title' }, title),
    h('p', { class: 'muted' }, isAlert ? `On instance ${alert.instance}` : `Instance ${key}, tenant ${tenant}`),
    action === 'confirm' ? [happened, externalRow] : null,
    h('h3', {}, 'Dry run'),
    preview,
    h('label', { for: 'action-reason' }, 'Reason (required, recorded in the audit trail)'),
    reason,
    h('p', { id: 'reason-help', class: 'muted small' }, 'Say why, for the next person on call.'),
    result,
    h('div', { class: 'buttons' }, cancel, apply));

  const body = (why) => {
    const out = { reason: why };
    if (!isAlert && step) out.step = step;
    if (action === 'confirm') {
      out.happened = form.querySelector('input[name=happened]:checked').value === 'true';
      if (out.happened && externalId.value.trim()) out.external_id = externalId.value.trim();
    }
    return out;
  };
  const query = (dryRun) => ({ dry_run: dryRun ? 'true' : 'false', tenant: isAlert ? undefined : tenant });

  let previewed = false;
  const refreshApply = () => { apply.disabled = !previewed || reason.value.trim() === ''; };
  const runPreview = async () => {
    previewed = false;
    refreshApply();
    show(preview, h('p', { class: 'muted' }, 'Asking the server for a dry run…'));
    try {
      // The dry run plans with the reason typed so far; nothing is recorded.
      const plan = await api(path, { method: 'POST', body: body(reason.value.trim() || 'dry run'),
        query: query(true) });
      show(preview, isAlert ? alertView(plan) : planView(plan));
      previewed = true;
    } catch (problem) {
      show(preview, h('p', { class: 'error', role: 'alert' }, `The server refuses it: ${problem.message}`));
    }
    refreshApply();
  };
  for (const radio of form.querySelectorAll('input[name=happened]')) {
    radio.addEventListener('change', () => {
      externalRow.hidden = form.querySelector('input[name=happened]:checked').value !== 'true';
      runPreview();
    });
  }
  externalId.addEventListener('change', runPreview);
  reason.addEventListener('input', refreshApply);

  return new Promise((resolve) => {
    let applied = false;
    cancel.addEventListener('click', () => box.close());
    form.addEventListener('submit', async (event) => {
      event.preventDefault();
      if (applied) return box.close();
      if (!reason.value.trim()) return reason.focus();
      apply.disabled = true;
      try {
        const done = await api(path, { method: 'POST', body: body(reason.value.trim()), query: query(false) });
        applied = true;
        show(result, h('h3', {}, 'Result'), isAlert ? alertView(done)
          : h('p', { class: 'ok', role: 'status' }, done.applied ? 'Applied. ' : 'Not applied. ',
            'The instance is now ', stateLabel(done.instance.state), `: ${done.instance.status_reason}`));
        apply.textContent = 'Done';
        apply.disabled = false;
        cancel.hidden = true;
        apply.focus();
      } catch (problem) {
        show(result, h('p', { class: 'error', role: 'alert' }, `Refused: ${problem.message}`));
        apply.disabled = false;
      }
    });
    box.addEventListener('close', () => {
      box.replaceChildren();  // a closed dialog leaves no form behind
      resolve(applied);
    }, { once: true });
    show(box, form);
    box.showModal();
    reason.focus();
    runPreview();
  });
}
