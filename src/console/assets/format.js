// How values read: states with colour and words, times in the browser's zone with
// UTC on hover, actions in words.

import { h } from './dom.js';

const STATE_WORDS = {
  running: 'running', completed: 'completed', compensating: 'compensating',
  compensated: 'compensated', failed: 'failed', needs_attention: 'needs attention',
  closed: 'closed', pending: 'pending', unknown: 'outcome unknown',
  compensation_failed: 'compensation failed', skipped: 'skipped', waiting: 'waiting',
  open: 'open', acknowledged: 'acknowledged', resolved: 'resolved',
  delivered: 'delivered', parked: 'parked',
  // batches and their items
  paused: 'paused', finished: 'finished', cancelled: 'cancelled', applying: 'applying',
  applied: 'applied, settling', succeeded: 'succeeded', stopped: 'stopped again',
  unsettled: 'not settled', refused: 'refused',
};

// A state as a label: its colour never stands alone, the words are always there.
export function stateLabel(state) {
  const words = STATE_WORDS[state] ?? state;
  return h('span', { class: `state state-${state}` }, words);
}

export const REASON_WORDS = {
  compensation_failed: 'Compensation failed',
  conflict: 'Idempotency or inbox conflict',
  outcome_unknown: 'Outcome unknown',
  retries_exhausted: 'Retries exhausted',
  needs_operator: 'Needs an operator',
  waiting_for_event: 'Waiting for an event',
  retrying: 'Retrying',
  stuck: 'Stuck',
  in_progress: 'In progress',
  finished: 'Finished',
};

const ACTION_WORDS = {
  retry: 'Retry', confirm: 'Confirm outcome', compensate: 'Compensate', skip: 'Skip',
  close: 'Close the case', acknowledge: 'Acknowledge',
};

export function actionWords(action, step) {
  return step ? `${ACTION_WORDS[action] ?? action} ‘${step}’` : ACTION_WORDS[action] ?? action;
}

const local = new Intl.DateTimeFormat(undefined, {
  year: 'numeric', month: 'short', day: '2-digit',
  hour: '2-digit', minute: '2-digit', second: '2-digit', timeZoneName: 'short',
});

// A time: local in the text, UTC (as the API sent it) on hover and in datetime.
export function time(rfc3339) {
  if (!rfc3339) return h('span', { class: 'muted' }, '—');
  const at = new Date(rfc3339);
  if (Number.isNaN(at.getTime())) return h('span', {}, rfc3339);
  return h('time', { datetime: rfc3339, title: `UTC ${at.toISOString()}` }, local.format(at));
}

// "in 3 min" / "5 min ago", beside a time.
export function relative(rfc3339, now = Date.now()) {
  if (!rfc3339) return '';
  const seconds = Math.round((new Date(rfc3339).getTime() - now) / 1000);
  const magnitude = Math.abs(seconds);
  const text = magnitude < 60 ? `${magnitude} s` : magnitude < 3600 ? `${Math.round(magnitude / 60)} min`
    : magnitude < 86400 ? `${Math.round(magnitude / 3600)} h` : `${Math.round(magnitude / 86400)} d`;
  return seconds >= 0 ? `in ${text}` : `${text} ago`;
}

// The route of one instance (its key may hold '/', '#' or '?').
export function instanceHref(tenant, key) {
  return `#/instance/${encodeURIComponent(tenant)}/${encodeURIComponent(key)}`;
}
