// Admins only: the tokens of the admin's tenant (every tenant for a '*' admin),
// from GET /v1/tokens; revoking one asks for a reason; a new token's secret is
// shown once, here, and kept nowhere.

import { api, Problem } from './api.js';
import { h, show } from './dom.js';
import { stateLabel, time } from './format.js';

const dialog = () => document.getElementById('action-dialog');

// Opens the revoke dialog for `token`; resolves true once it was revoked.
function revokeDialog(token) {
  const box = dialog();
  const reason = h('textarea', { id: 'revoke-reason', name: 'reason', required: true, rows: 3, maxlength: 2000 });
  const result = h('div', { class: 'result', 'aria-live': 'polite', id: 'revoke-result' });
  const apply = h('button', { type: 'submit', class: 'primary' }, 'Revoke');
  const cancel = h('button', { type: 'button' }, 'Cancel');
  const form = h('form', { method: 'dialog', class: 'action-form' },
    h('h2', { id: 'dialog-title' }, `Revoke token ${token.name}`),
    h('p', { class: 'muted' }, `Tenant ${token.tenant}, role ${token.role}. It is refused from the moment it is revoked.`),
    h('label', { for: 'revoke-reason' }, 'Reason (required, recorded in the audit trail)'),
    reason, result, h('div', { class: 'buttons' }, cancel, apply));
  return new Promise((resolve) => {
    let revoked = false;
    cancel.addEventListener('click', () => box.close());
    form.addEventListener('submit', async (event) => {
      event.preventDefault();
      if (revoked) return box.close();
      if (!reason.value.trim()) return reason.focus();
      try {
        await api(`/v1/tokens/${encodeURIComponent(token.name)}/revoke`, { method: 'POST', body: { reason: reason.value.trim() } });
        revoked = true;
        show(result, h('p', { class: 'ok', role: 'status' }, `Token ${token.name} is revoked.`));
        apply.textContent = 'Done';
        cancel.hidden = true;
        apply.focus();
      } catch (problem) {
        show(result, h('p', { class: 'error', role: 'alert' }, `Refused: ${problem.message}`));
      }
    });
    box.addEventListener('close', () => { box.replaceChildren(); resolve(revoked); }, { once: true });
    show(box, form);
    box.showModal();
    reason.focus();
  });
}

function createForm(me, done) {
  const field = (id, label, input) => h('p', {}, h('label', { for: id }, label), input);
  const name = h('input', { id: 'token-name', name: 'name', required: true, maxlength: 128, autocomplete: 'off' });
  const role = h('select', { id: 'token-role', name: 'role' },
    ['viewer', 'operator', 'admin'].map((r) => h('option', { value: r }, r)));
  const tenant = me.tenant === '*' ? h('input', { id: 'token-tenant', name: 'tenant', required: true, autocomplete: 'off' }) : null;
  const expires = h('input', { id: 'token-expires', name: 'expires', placeholder: 'e.g. 90d; empty: until revoked', autocomplete: 'off' });
  const secret = h('div', { 'aria-live': 'polite', id: 'token-secret' });
  const form = h('form', { class: 'create-token', 'aria-labelledby': 'create-title' },
    h('h2', { id: 'create-title' }, 'Create a token'),
    field('token-name', 'Name', name), field('token-role', 'Role', role),
    tenant ? field('token-tenant', "Tenant ('*' for an admin of every tenant)", tenant)
      : h('p', { class: 'muted' }, `For tenant ${me.tenant}.`),
    field('token-expires', 'Valid for', expires),
    h('button', { type: 'submit' }, 'Create'), secret);
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const body = { name: name.value.trim(), role: role.value };
    if (tenant) body.tenant = tenant.value.trim();
    if (expires.value.trim()) body.expires = expires.value.trim();
    try {
      const made = await api('/v1/tokens', { method: 'POST', body });
      show(secret, h('p', { role: 'status' }, `Token ${made.name}, shown this once: `, h('code', { class: 'secret' }, made.token)));
      done();
    } catch (problem) {
      show(secret, h('p', { class: 'error', role: 'alert' }, problem instanceof Problem ? problem.message : String(problem)));
    }
  });
  return form;
}

export async function renderTokens(main, me) {
  if (me.role !== 'admin') {
    show(main, h('h1', {}, 'Tokens'), h('p', { class: 'muted' }, 'Only an admin manages tokens.'));
    return;
  }
  const list = h('div', { id: 'token-list' });
  const load = async () => {
    const { items } = await api('/v1/tokens');
    show(list, h('table', { class: 'tokens' },
      h('thead', {}, h('tr', {}, ['name', 'tenant', 'role', 'state', 'created', 'expires', 'revoked', ''].map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, items.map((t) => h('tr', { 'data-token': t.name },
        h('td', {}, t.name), h('td', {}, t.tenant), h('td', {}, t.role), h('td', {}, stateLabel(t.state)),
        h('td', {}, t.created_at ? time(t.created_at) : '—'),
        h('td', {}, t.expires_at ? time(t.expires_at) : 'never'),
        h('td', {}, t.revoked_at ? [time(t.revoked_at), t.revoked_by ? ` by ${t.revoked_by}: ${t.revoke_reason}` : ''] : '—'),
        h('td', {}, t.state === 'active' ? h('button', { type: 'button', class: 'small revoke',
          'aria-label': `Revoke ${t.name}`, onclick: async () => { if (await revokeDialog(t)) await load(); } }, 'Revoke') : null))))));
  };
  await load();
  show(main, h('h1', {}, 'Tokens'),
    h('p', { class: 'muted' }, me.tenant === '*' ? 'Every tenant’s tokens.' : `Tenant ${me.tenant}’s tokens.`),
    list, createForm(me, load));
  main.focus();
}
