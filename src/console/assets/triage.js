// The home view: what is not finished, grouped by why it stopped (GET /v1/triage),
// each instance saying in words why and what may follow.

import { api } from './api.js';
import { h, show } from './dom.js';
import { actionWords, instanceHref, REASON_WORDS, relative, stateLabel, time } from './format.js';

export function nextActionsText(actions) {
  if (!actions?.length) return 'No operator action applies now.';
  return `Allowed next: ${actions.map((a) => actionWords(a.action, a.step)).join(', ')}.`;
}

export function instanceItem(item) {
  const stopped = item.stopped ?? {};
  const detail = [];
  if (stopped.step) detail.push(`step ${stopped.step}`);
  if (stopped.attempt) detail.push(`attempt ${stopped.attempt}`);
  return h('li', { class: `instance reason-${stopped.reason}` },
    h('div', { class: 'line' },
      h('a', { href: instanceHref(item.tenant, item.key), class: 'key' }, item.key),
      ' ', stateLabel(item.state),
      h('span', { class: 'muted' }, ` ${item.workflow} · tenant ${item.tenant}`),
      detail.length ? h('span', { class: 'muted' }, ` · ${detail.join(', ')}`) : null),
    h('p', { class: 'why' }, stopped.words ?? item.status_reason),
    stopped.next_attempt_at ? h('p', { class: 'next' },
      stopped.reason === 'waiting_for_event' ? (stopped.overdue ? 'Overdue since ' : 'Deadline ')
        : 'Next attempt ',
      time(stopped.next_attempt_at), ` (${relative(stopped.next_attempt_at)})`) : null,
    h('p', { class: 'actions-text' }, nextActionsText(stopped.next_actions)),
    h('p', { class: 'muted small' }, 'Updated ', time(item.updated_at)));
}

export async function renderTriage(main, me, params) {
  const triage = await api('/v1/triage', { watch: true,
    query: { workflow: params.get('workflow'), stuck_after: params.get('stuck_after') },
  });
  const groups = triage.groups.filter((g) => g.reason !== 'in_progress');
  const inProgress = triage.groups.find((g) => g.reason === 'in_progress');
  const stoppedTotal = groups.reduce((sum, g) => sum + g.count, 0);
  const summary = h('ul', { class: 'counts', 'aria-label': 'Counts by reason' },
    groups.map((g) => h('li', { class: g.count ? `count reason-${g.reason}` : 'count zero' },
      h('a', { href: `#/?${params}`, 'data-target': `group-${g.reason}`, onclick: (event) => {
        event.preventDefault();
        document.getElementById(`group-${g.reason}`)?.focus();
      } }, h('span', { class: 'n', 'data-reason': g.reason }, String(g.count)),
        ' ', REASON_WORDS[g.reason] ?? g.reason))));
  const sections = groups.filter((g) => g.count > 0).map((g) => h('section',
    { id: `group-${g.reason}`, class: 'group', tabindex: '-1', 'aria-labelledby': `title-${g.reason}` },
    h('h2', { id: `title-${g.reason}` }, `${REASON_WORDS[g.reason] ?? g.reason} `,
      h('span', { class: 'badge' }, String(g.count))),
    g.count > g.items.length
      ? h('p', { class: 'muted' }, `Showing ${g.items.length} of ${g.count}.`) : null,
    h('ul', { class: 'instances' }, g.items.map(instanceItem))));
  show(main,
    h('h1', {}, 'Why instances stopped'),
    h('p', { class: 'muted' },
      `${stoppedTotal} stopped, ${inProgress?.count ?? 0} in progress, as of `, time(triage.at),
      `. Stuck means no change for ${Math.round(triage.stuck_after_seconds / 60)} min.`,
      triage.truncated ? ' Only the first 1,000 instances of each state were read.' : ''),
    summary,
    stoppedTotal === 0 ? h('p', { class: 'calm' }, 'Nothing is waiting for an operator.') : sections,
    h('button', { type: 'button', onclick: () => window.dispatchEvent(new Event('waystone:refresh')) },
      'Refresh'));
  main.focus();
}
