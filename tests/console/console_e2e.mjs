// The operations console end to end: Debian's Chromium, driven by playwright-core,
// against a real `waystone serve` on SQLite with its workers and the simulator
// (`waystone sim`). What the browser shows is checked against what the test set up;
// what an action did is checked afterwards through the API, the audit trail and the
// simulated ERP's own records, never through the page alone.
//
//   node console_e2e.mjs --waystone PATH --out DIR
//
// Exits 77 (ctest: skipped, loudly) only when /usr/bin/chromium is missing.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const source = path.resolve(here, '../..');
const CHROMIUM = process.env.WAYSTONE_CHROMIUM ?? '/usr/bin/chromium';

function flag(name, fallback) {
  const at = process.argv.indexOf(name);
  return at >= 0 ? process.argv[at + 1] : fallback;
}
const waystone = flag('--waystone', path.join(source, 'build/apps/waystone'));
const out = path.resolve(flag('--out', path.join(os.tmpdir(), 'waystone-console-e2e')));

if (!fs.existsSync(CHROMIUM)) {
  console.error(`SKIPPED: ${CHROMIUM} is missing; scripts/setup.sh installs Debian's chromium`);
  process.exit(77);
}
const { chromium } = await import('playwright-core');
const axeSource = fs.readFileSync(path.join(here, 'node_modules/axe-core/axe.min.js'), 'utf8');

fs.rmSync(out, { recursive: true, force: true });
fs.mkdirSync(out, { recursive: true });
const work = fs.mkdtempSync(path.join(os.tmpdir(), 'waystone-console-'));
const children = [];
let failures = 0;
let passes = 0;

function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

function start(name, args, env) {
  const log = fs.openSync(path.join(out, `${name}.log`), 'w');
  const child = spawn(waystone, args, { env: { ...process.env, ...env }, stdio: ['ignore', log, log] });
  children.push(child);
  return child;
}

async function stopAll() {
  for (const child of children.reverse()) {
    if (child.exitCode !== null) continue;
    child.kill('SIGTERM');
    await new Promise((resolve) => {
      const timer = setTimeout(() => { child.kill('SIGKILL'); resolve(); }, 10000);
      child.once('exit', () => { clearTimeout(timer); resolve(); });
    });
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function until(what, probe, seconds = 30) {
  const deadline = Date.now() + seconds * 1000;
  let last;
  while (Date.now() < deadline) {
    try {
      last = await probe();
      if (last) return last;
    } catch (error) {
      last = error;
    }
    await sleep(150);
  }
  throw new Error(`timed out waiting for ${what} (last: ${last instanceof Error ? last.message : JSON.stringify(last)})`);
}

async function check(name, body) {
  const started = performance.now();
  const took = () => `(${((performance.now() - started) / 1000).toFixed(1)} s)`;
  try {
    await body();
    passes += 1;
    console.log(`ok - ${name} ${took()}`);
  } catch (error) {
    failures += 1;
    console.log(`not ok - ${name} ${took()}\n  ${String(error.stack ?? error).split('\n').join('\n  ')}`);
  }
}

const simPort = await freePort();
const apiPort = await freePort();
const sim = `http://127.0.0.1:${simPort}`;
const base = `http://127.0.0.1:${apiPort}`;
const db = path.join(work, 'waystone.db');
const env = {
  CRM_URL: sim, ERP_URL: sim, LINE_URL: sim, EMAIL_URL: sim,
  WAYSTONE_SECRET_ERP_TOKEN: randomBytes(8).toString('hex'),
  WAYSTONE_SECRET_LINE_TOKEN: randomBytes(8).toString('hex'),
};

// Runs a program to its end without blocking the event loop. (spawnSync did: under a
// loaded CI machine the console test's event loop stood still past the server's 10 s
// idle deadline, and the next fetch went out on a kept-alive connection the server had
// just closed: "fetch failed".)
function run(file, args, { input } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (data) => { stdout += data; });
    child.stderr.on('data', (data) => { stderr += data; });
    child.on('error', reject);
    child.on('close', (status) => resolve({ status, stdout, stderr }));
    child.stdin.end(input ?? '');
  });
}

async function token(role, name) {
  const printed = await run(waystone, ['token', 'create', '--db', db, '--tenant', 'default',
    '--role', role, '--name', name]);
  assert.equal(printed.status, 0, printed.stderr);
  const found = printed.stdout.match(/wst_[0-9a-f]{64}/);
  assert.ok(found, `no token in: ${printed.stdout}`);
  return found[0];
}

async function call(method, url, { bearer, body, ok = true } = {}) {
  const headers = {};
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const response = await fetch(url, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await response.text();
  const parsed = text && /json/.test(response.headers.get('content-type') ?? '') ? JSON.parse(text) : text;
  if (ok && !response.ok) throw new Error(`${method} ${url}: ${response.status} ${text}`);
  return { status: response.status, body: parsed, headers: response.headers };
}

const instanceUrl = (key) => `${base}/v1/instances/${encodeURIComponent(key)}`;

let browser;
try {
  // The server's definitions: the console's own test workflow and the README's order-to-erp.
  const definitions = path.join(work, 'definitions');
  fs.mkdirSync(definitions);
  fs.copyFileSync(path.join(here, 'definitions/console-order.yaml'), path.join(definitions, 'console-order.yaml'));
  fs.copyFileSync(path.join(here, 'definitions/console-retries.yaml'), path.join(definitions, 'console-retries.yaml'));
  fs.copyFileSync(path.join(source, 'examples/server/definitions/order-to-erp.yaml'),
    path.join(definitions, 'order-to-erp.yaml'));
  fs.copyFileSync(path.join(source, 'examples/server/definitions/order-approval.yaml'),
    path.join(definitions, 'order-approval.yaml'));
  fs.writeFileSync(path.join(work, 'waystone.yaml'),
    `database: ${db}\nlisten: 127.0.0.1:${apiPort}\nworkers: 4\ndefinitions: definitions\n` +
    'groups:\n  - { tenant: default, name: finance, tokens: [victor] }\n');

  start('sim', ['sim', '--port', String(simPort)], env);
  await until('the simulator', async () => (await fetch(`${sim}/_sim/stats`)).ok);
  // Tokens first: the store is created by the first command that opens it.
  const alice = await token('operator', 'alice');
  const victor = await token('viewer', 'victor');
  start('serve', ['serve', '--config', path.join(work, 'waystone.yaml')], env);
  await until('waystone serve', async () => (await fetch(`${base}/readyz`)).ok);

  const faults = (document) => call('POST', `${sim}/_sim/faults`, { body: document });
  const startOrder = (workflow, input) => call('POST', `${base}/v1/instances`,
    { bearer: alice, body: { workflow, input } });
  const show = async (key) => (await call('GET', instanceUrl(key), { bearer: alice })).body;
  const settles = (key, predicate, seconds) => until(`${key} to settle`, async () => {
    const view = await show(key);
    return predicate(view) ? view : false;
  }, seconds);
  const step = (view, name) => view.steps.find((s) => s.name === name);

  // Two orders whose ERP answer is lost after the ERP created the order: outcome unknown.
  await faults({ 'erp.create_order': { next: ['close_before_bytes', 'close_before_bytes'] } });
  await startOrder('console-order', { order_id: '1', customer_id: 'C-1', amount: 5 });
  await settles('console:1', (v) => v.state === 'needs_attention');
  await startOrder('console-order', { order_id: '2', customer_id: 'C-2', amount: 7 });
  await settles('console:2', (v) => v.state === 'needs_attention');
  // One the ERP turns away for ten minutes: retrying, attempt 1.
  await faults({ 'erp.create_order': { next: ['unavailable'], retry_after_s: 600 } });
  await startOrder('console-order', { order_id: '3', customer_id: 'C-3', amount: 9 });
  await settles('console:3', (v) => step(v, 'create-order').attempts === 1 &&
    step(v, 'create-order').next_attempt_at);
  await faults({});
  // One whose shipment is refused and whose cancellation always fails.
  await startOrder('order-to-erp', { source: 'crm', order_id: '7', customer_id: 'C-BLOCKED-STUCK-7', amount: 5 });
  await settles('crm:7', (v) => v.state === 'needs_attention' &&
    v.steps.some((s) => s.state === 'compensation_failed'), 60);
  // And one that simply completes: it is in no group.
  await startOrder('console-order', { order_id: '4', customer_id: 'C-4', amount: 3 });
  await settles('console:4', (v) => v.state === 'completed');

  // The order the ERP really made for console:1, from the ERP's own records.
  const erp = await call('GET', `${sim}/erp/orders?ref=${encodeURIComponent('default:console:1')}`);
  assert.equal(erp.body.items.length, 1, 'the lost answer left exactly one order at the ERP');
  const orderNumber = erp.body.items[0].id;

  await check('every module of the console parses (node --check)', async () => {
    const assets = path.join(source, 'src/console/assets');
    for (const file of fs.readdirSync(assets).filter((f) => f.endsWith('.js'))) {
      const parsed = await run(process.execPath, ['--input-type=module', '--check'],
        { input: fs.readFileSync(path.join(assets, file)) });
      assert.equal(parsed.status, 0, `${file}: ${parsed.stderr}`);
    }
  });

  await check('the console is served from the binary: redirect, types, ETag, 304, no token needed', async () => {
    const redirect = await fetch(`${base}/console`, { redirect: 'manual' });
    assert.equal(redirect.status, 301);
    assert.equal(redirect.headers.get('location'), '/console/');
    const index = await fetch(`${base}/console/`);
    assert.equal(index.status, 200);
    assert.match(index.headers.get('content-type'), /^text\/html/);
    const etag = index.headers.get('etag');
    assert.match(etag, /^"[0-9a-f]{16}"$/);
    assert.equal(index.headers.get('cache-control'), 'no-cache');
    const again = await fetch(`${base}/console/`, { headers: { 'If-None-Match': etag } });
    assert.equal(again.status, 304);
    const script = await fetch(`${base}/console/app.js`);
    assert.match(script.headers.get('content-type'), /^text\/javascript/);
    assert.equal((await fetch(`${base}/console/nothing.js`)).status, 404);
    // The data behind it is not public.
    assert.equal((await fetch(`${base}/v1/triage`)).status, 401);
  });

  browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox'] });
  const context = await browser.newContext({ viewport: { width: 1366, height: 900 }, timezoneId: 'Asia/Tokyo' });
  context.setDefaultTimeout(10000);
  const page = await context.newPage();
  const consoleErrors = [];
  page.on('console', (message) => { if (message.type() === 'error') consoleErrors.push(message.text()); });
  page.on('pageerror', (error) => consoleErrors.push(String(error)));
  const refusals = [];  // every answer >= 400 the page received
  let notModified = 0;  // 304s: a poll whose view had not changed
  page.on('response', (response) => {
    if (response.status() === 304 && new URL(response.url()).pathname.startsWith('/v1/')) notModified += 1;
    if (response.status() >= 400) refusals.push(`${response.status()} ${new URL(response.url()).pathname}${new URL(response.url()).search}`);
  });
  const requests = [];
  page.on('request', (request) => requests.push({ url: request.url(), auth: request.headers().authorization }));
  // A full-page screenshot of a long view can take seconds on a loaded 2-core machine
  // (it timed out at the default 10 s under ctest -j2): it proves nothing about timing.
  const shot = (name) => page.screenshot({ path: path.join(out, `${name}.png`), fullPage: true, timeout: 60000 });
  const axe = async (name) => {
    // Through DevTools, not a <script>: the console's CSP refuses inline scripts.
    await page.evaluate(axeSource);
    const result = await page.evaluate(async () => window.axe.run(document, {
      runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa'] },
    }));
    const found = result.violations.map((v) => `${v.id} (${v.impact}): ${v.nodes.length} × ${v.help}`);
    fs.writeFileSync(path.join(out, `axe-${name}.json`), JSON.stringify(result.violations, null, 2));
    assert.deepEqual(found, [], `axe on ${name}`);
  };

  await check('login: a bad token is refused on the form, a good one opens triage; the token stays out of URLs and localStorage', async () => {
    await page.goto(`${base}/console/`);
    await page.getByLabel('API token').fill('wst_not-a-token');
    await page.getByRole('button', { name: 'Log in' }).click();
    await page.getByText('That token is not valid').waitFor();
    // The browser logs the refused login's 401 as an error; that one is expected.
    assert.ok(consoleErrors.length === 1 && /401/.test(consoleErrors[0]), String(consoleErrors));
    consoleErrors.length = 0;
    await shot('login');
    await axe('login');
    await page.getByLabel('API token').fill(alice);
    await page.keyboard.press('Enter');  // the keyboard alone logs in
    await page.getByRole('heading', { name: 'Why instances stopped' }).waitFor();
    assert.equal(await page.evaluate(() => localStorage.length), 0);
    assert.equal(await page.evaluate(() => sessionStorage.getItem('waystone.token')), alice);
    assert.ok(requests.every((r) => !r.url.includes(alice)), 'the token appeared in a URL');
    const apiCalls = requests.filter((r) => new URL(r.url).pathname.startsWith('/v1/'));
    assert.ok(apiCalls.length >= 2);
    // Only the failed login itself went without the good token.
    assert.ok(apiCalls.filter((r) => r.auth !== `Bearer ${alice}`).length === 1);
  });

  await check('triage: the counts are the cases the test made, each in its group, in words with its next actions', async () => {
    const count = (reason) => page.locator(`.counts [data-reason="${reason}"]`).textContent();
    assert.equal(await count('outcome_unknown'), '2');
    assert.equal(await count('retrying'), '1');
    assert.equal(await count('compensation_failed'), '1');
    for (const zero of ['conflict', 'retries_exhausted', 'needs_operator', 'waiting_for_event', 'stuck']) {
      assert.equal(await count(zero), '0', zero);
    }
    const unknown = page.locator('#group-outcome_unknown');
    assert.equal(await unknown.locator('li.instance').count(), 2);
    for (const key of ['console:1', 'console:2']) {
      assert.equal(await unknown.getByRole('link', { name: key, exact: true }).count(), 1, key);
    }
    const first = unknown.locator('li.instance', { has: page.getByRole('link', { name: 'console:1', exact: true }) });
    assert.match(await first.locator('.why').textContent(), /create-order.*not known/);
    assert.match(await first.locator('.actions-text').textContent(), /Confirm outcome ‘create-order’/);
    const retrying = page.locator('#group-retrying li.instance');
    assert.match(await retrying.textContent(), /attempt 1/);
    assert.match(await retrying.locator('.next').textContent(), /Next attempt .*in (9|10) min/);
    // A time shows the browser's zone, with UTC on hover.
    const hover = await retrying.locator('.next time').getAttribute('title');
    assert.match(hover, /^UTC \d{4}-\d\d-\d\dT.*Z$/);
    assert.match(await retrying.locator('.next time').textContent(), /GMT\+9|JST/);
    assert.match(await page.locator('#group-compensation_failed').textContent(), /crm:7/);
    assert.equal(await page.locator('body').getByText('console:4').count(), 0, 'a completed instance is listed');
    await shot('triage');
    await axe('triage');
  });

  await check('instance: header, steps, every request, alerts and audit of an unknown outcome', async () => {
    await page.locator('#group-outcome_unknown').getByRole('link', { name: 'console:1', exact: true }).click();
    await page.getByRole('heading', { name: /console:1/, level: 1 }).waitFor();
    const text = await page.locator('main').textContent();
    for (const expected of ['default', 'console-order', 'needs attention', 'create-order', 'outcome unknown',
      'Server returned nothing', 'needs_operator', 'No operator action yet.']) {
      assert.ok(text.includes(expected), `missing ${expected}`);
    }
    const view = await show('console:1');
    assert.ok(text.includes(view.trace_id), 'trace id');
    assert.ok(text.includes(step(view, 'create-order').idempotency_key), 'idempotency key');
    // create-order's requests, a page from GET /v1/attempts once opened.
    const details = page.locator('details.attempts', { has: page.locator('caption', { hasText: 'create-order' }) });
    await details.locator('summary').click();
    const request = details.locator('table.requests tbody tr');
    await request.first().waitFor();
    assert.equal(await request.count(), 1);
    assert.match(await details.textContent(), /1 of 1 shown/);
    assert.match(await request.textContent(), /call.*yes.*unknown/);
    assert.equal(await page.getByRole('button', { name: 'Confirm outcome ‘create-order’' }).count(), 1);
    await shot('instance');
    await axe('instance');
  });

  await check('confirm through the dialog: dry run first, reason required, result shown; the API, the audit trail and the ERP agree', async () => {
    await page.getByRole('button', { name: 'Confirm outcome ‘create-order’' }).click();
    const dialog = page.locator('dialog[open]');
    await dialog.getByRole('heading', { name: 'Confirm outcome ‘create-order’' }).waitFor();
    // The dry run of "did not happen" comes first: it would resubmit under the same key.
    await dialog.locator('.plan').waitFor();
    assert.match(await dialog.locator('.plan').textContent(), /create-order call POST .*Idempotency-Key/);
    await dialog.getByLabel('It happened').check();
    await dialog.getByLabel(/External id/).fill(orderNumber);
    await dialog.getByLabel(/External id/).press('Tab');
    await until('the dry run of "happened"', async () =>
      /notify-email/.test(await dialog.locator('.plan').textContent()) &&
      !/create-order call/.test(await dialog.locator('.plan').textContent()));
    const apply = dialog.getByRole('button', { name: 'Apply' });
    assert.equal(await apply.isDisabled(), true, 'Apply is offered without a reason');
    await dialog.screenshot({ path: path.join(out, 'dialog-dry-run.png') });
    await axe('dialog');
    // Nothing changed yet: a dry run is not an action.
    assert.equal((await show('console:1')).state, 'needs_attention');
    const reason = `ERP shows ${orderNumber}, ticket 4711`;
    await dialog.getByLabel(/Reason/).fill(reason);
    assert.equal(await apply.isDisabled(), false);
    await apply.click();
    await dialog.getByRole('status').waitFor();
    assert.match(await dialog.getByRole('status').textContent(), /Applied/);
    await dialog.screenshot({ path: path.join(out, 'dialog-result.png') });
    await dialog.getByRole('button', { name: 'Done' }).click();

    const view = await settles('console:1', (v) => v.state === 'completed');
    const created = step(view, 'create-order');
    assert.equal(created.state, 'completed');
    assert.equal(created.external_id, orderNumber);
    assert.equal(created.resolution, 'operator');
    assert.equal(created.requests.length, 1, 'confirming resent the order');
    const audit = view.audit.filter((a) => a.action === 'confirm');
    assert.equal(audit.length, 1);
    assert.equal(audit[0].actor, 'alice');
    assert.equal(audit[0].reason, reason);
    // The ERP still holds one order for it, and the e-mail went out with its number.
    const after = await call('GET', `${sim}/erp/orders?ref=${encodeURIComponent('default:console:1')}`);
    assert.equal(after.body.items.length, 1);
    assert.equal(step(view, 'notify-email').state, 'completed');
    // The page shows the action in its audit trail once re-rendered.
    await page.locator('table.audit').getByText(reason).waitFor();
    await shot('instance-after-confirm');
  });

  await check('find: filters live in the URL; a link opens that exact view', async () => {
    await page.goto(`${base}/console/#/find?state=needs_attention&workflow=console-order`);
    await page.getByRole('heading', { name: 'Find instances' }).waitFor();
    await page.locator('table.found').waitFor();
    const keys = await page.locator('table.found tbody tr td:first-child').allTextContents();
    assert.deepEqual(keys.sort(), ['console:2']);
    assert.equal(await page.getByLabel('State', { exact: true }).inputValue(), 'needs_attention');
    await page.getByLabel('Business key').fill('crm:7');
    await page.getByRole('button', { name: 'Find' }).click();
    await page.waitForURL(/key=crm%3A7/);
    await page.locator('table.found').getByRole('link', { name: 'crm:7' }).waitFor();
    await shot('find');
    await axe('find');
    // The order that failed by its ERP number: the server searches every step's external id.
    await page.getByLabel('Business key').fill('');
    await page.getByLabel('State', { exact: true }).selectOption('');
    await page.getByLabel('Workflow').fill('');
    await page.getByLabel('External id').fill(orderNumber);
    await page.getByLabel('External id').press('Enter');
    await page.waitForURL(new RegExp(`external_id=${orderNumber}`));
    await until('the external id search', async () =>
      (await page.locator('table.found tbody tr td:first-child').allTextContents()).join() === 'console:1');
    await shot('find-external-id');
    // A created range, from a link: nothing was created in 2999, everything before it.
    await page.goto(`${base}/console/#/find?created_after=2999-01-01T00%3A00%3A00.000Z`);
    await until('the empty range', async () => /^0 instances/.test(await page.locator('.results').textContent()));
    assert.match(await page.getByLabel('Created from').inputValue(), /^2999-01-01T|^2998-12-31T/);
    await page.goto(`${base}/console/#/find?created_before=2999-01-01T00%3A00%3A00.000Z&workflow=console-order`);
    await until('the full range', async () => /^4 instances/.test(await page.locator('.results').textContent()));
    // A key prefix, from a link.
    await page.goto(`${base}/console/#/find?key=console%3A&match=prefix&state=running`);
    await until('the prefix search', async () =>
      (await page.locator('table.found tbody tr td:first-child').allTextContents()).join() === 'console:3');
  });

  await check('acknowledge an alert through its dialog: dry run, reason, result; the API and the audit trail agree', async () => {
    await page.goto(`${base}/console/#/instance/default/crm%3A7`);
    await page.getByRole('heading', { name: /crm:7/, level: 1 }).waitFor();
    const before = (await show('crm:7')).alerts.filter((a) => a.state === 'open');
    assert.equal(before.length, 1, JSON.stringify(before));
    await page.locator('.alerts').getByRole('button', { name: 'Acknowledge' }).click();
    const dialog = page.locator('dialog[open]');
    await dialog.locator('.preview', { hasText: 'acknowledged' }).waitFor();
    assert.match(await dialog.locator('.preview').textContent(), /compensation_failed.*open.*→.*acknowledged/);
    assert.equal((await show('crm:7')).alerts[0].state, 'open', 'the dry run acknowledged');
    const apply = dialog.getByRole('button', { name: 'Apply' });
    assert.equal(await apply.isDisabled(), true);
    await dialog.getByLabel(/Reason/).fill('cancellation desk called, ticket 88');
    await apply.click();
    await dialog.locator('.result', { hasText: 'acknowledged' }).waitFor();
    await dialog.screenshot({ path: path.join(out, 'dialog-acknowledge.png') });
    await dialog.getByRole('button', { name: 'Done' }).click();
    const view = await show('crm:7');
    const alert = view.alerts.find((a) => a.id === before[0].id);
    assert.equal(alert.state, 'acknowledged');
    const audit = view.audit.filter((a) => a.action === 'acknowledge');
    assert.equal(audit.length, 1);
    assert.equal(audit[0].actor, 'alice');
    assert.equal(audit[0].reason, 'cancellation desk called, ticket 88');
    // Acknowledged is not resolved: the case still needs a decision.
    assert.equal(view.state, 'needs_attention');
    await page.locator('table.audit').getByText('cancellation desk called, ticket 88').waitFor();
  });

  await check('keyboard: Tab reaches an instance, Enter opens it, a dialog opens and Escape closes it', async () => {
    await page.goto(`${base}/console/#/`);
    await page.getByRole('heading', { name: 'Why instances stopped' }).waitFor();
    let reached = false;
    for (let i = 0; i < 60 && !reached; i += 1) {
      await page.keyboard.press('Tab');
      reached = await page.evaluate(() => document.activeElement?.textContent === 'console:2');
    }
    assert.ok(reached, 'Tab never reached console:2');
    await page.keyboard.press('Enter');
    await page.getByRole('heading', { name: /console:2/, level: 1 }).waitFor();
    const confirm = page.getByRole('button', { name: 'Confirm outcome ‘create-order’' });
    await confirm.focus();
    await page.keyboard.press('Enter');
    await page.locator('dialog[open] .plan').waitFor();
    // Focus starts in the reason field, inside the dialog.
    assert.equal(await page.evaluate(() => document.activeElement?.id), 'action-reason');
    await page.keyboard.press('Escape');
    await until('the dialog to close', async () => (await page.locator('dialog[open]').count()) === 0);
    assert.equal((await show('console:2')).state, 'needs_attention', 'Escape acted');
  });

  await check('a viewer is not offered actions, and the server refuses them anyway', async () => {
    const viewer = await browser.newContext({ viewport: { width: 1366, height: 900 } });
    const vpage = await viewer.newPage();
    await vpage.goto(`${base}/console/#/instance/default/console%3A2`);
    await vpage.getByLabel('API token').fill(victor);
    await vpage.getByRole('button', { name: 'Log in' }).click();
    await vpage.getByRole('heading', { name: /console:2/, level: 1 }).waitFor();
    assert.match(await vpage.locator('.stopped').textContent(), /may read only/);
    assert.equal(await vpage.locator('button.action').count(), 0);
    assert.equal(await vpage.getByRole('button', { name: /Acknowledge/ }).count(), 0);
    await vpage.screenshot({ path: path.join(out, 'instance-viewer.png'), fullPage: true });
    const refused = await call('POST', `${instanceUrl('console:2')}/confirm`,
      { bearer: victor, body: { step: 'create-order', happened: false, reason: 'viewer tries' }, ok: false });
    assert.equal(refused.status, 403);
    assert.match(refused.headers.get('content-type'), /problem\+json/);
    const view = await show('console:2');
    assert.equal(view.state, 'needs_attention');
    assert.equal(view.audit.length, 0);
    await viewer.close();
  });

  await check('live: the open instance follows a change made elsewhere within about a second, without a reload', async () => {
    await page.goto(`${base}/console/#/instance/default/console%3A2`);
    await page.getByRole('heading', { name: /console:2/, level: 1 }).waitFor();
    await page.evaluate(() => { window.notReloaded = true; });
    // While nothing changes, each poll is a 304 and the view stays as it is.
    const quiet = notModified;
    await until('a poll answered 304', async () => notModified >= quiet + 2, 10);
    assert.equal(await page.evaluate(() => window.notReloaded), true);
    // Another operator settles it over the API, with the order the ERP shows.
    const made = (await call('GET', `${sim}/erp/orders?ref=${encodeURIComponent('default:console:2')}`)).body.items;
    assert.equal(made.length, 1);
    await call('POST', `${instanceUrl('console:2')}/confirm`, { bearer: alice,
      body: { step: 'create-order', happened: true, external_id: made[0].id, reason: 'ERP desk: order seen, ticket 12' } });
    await settles('console:2', (v) => v.state === 'completed');
    const changedAt = Date.now();
    await page.getByRole('heading', { name: /console:2.*completed/, level: 1 }).waitFor({ timeout: 5000 });
    const seconds = (Date.now() - changedAt) / 1000;
    assert.ok(seconds < 3, `the page took ${seconds} s to follow`);
    assert.equal(await page.evaluate(() => window.notReloaded), true, 'the page was reloaded');
    assert.match(await page.locator('#live').textContent(), /Updated/);
    await page.locator('table.audit').getByText('ERP desk: order seen, ticket 12').waitFor();
    const erp = await call('GET', `${sim}/erp/orders?ref=${encodeURIComponent('default:console:2')}`);
    assert.equal(erp.body.items.length, 1, 'confirming made a second order');
  });

  // Runs `action` on `key` through its dialog: the dry run first, a reason, Apply, the
  // result; answers the dry run's text.
  const actThroughDialog = async (key, button, reason) => {
    await page.goto(`${base}/console/#/instance/default/${encodeURIComponent(key)}`);
    await page.getByRole('heading', { name: new RegExp(key), level: 1 }).waitFor();
    await page.getByRole('button', { name: button, exact: true }).click();
    const dialog = page.locator('dialog[open]');
    await dialog.locator('.plan').waitFor();
    const plan = await dialog.locator('.plan').textContent();
    const apply = dialog.getByRole('button', { name: 'Apply' });
    assert.equal(await apply.isDisabled(), true, 'Apply is offered without a reason');
    await dialog.getByLabel(/Reason/).fill(reason);
    await apply.click();
    await dialog.getByRole('status').waitFor();
    assert.match(await dialog.getByRole('status').textContent(), /Applied/);
    await dialog.getByRole('button', { name: 'Done' }).click();
    return plan;
  };
  const auditOf = (view, action) => view.audit.filter((a) => a.action === action);
  const ordersOf = async (key) =>
    (await call('GET', `${sim}/erp/orders?ref=${encodeURIComponent(`default:${key}`)}`)).body.items;
  // Orders the ERP refuses three times (503): retries exhausted, create-order failed.
  const refusedOrder = async (id) => {
    await faults({ 'erp.create_order': { next: ['fail', 'fail', 'fail'] } });
    await startOrder('console-order', { order_id: id, customer_id: `C-${id}`, amount: 4 });
    const view = await settles(`console:${id}`, (v) => v.state === 'needs_attention');
    await faults({});
    assert.equal(step(view, 'create-order').state, 'failed');
    return view;
  };

  await check('retry through its dialog once the ERP is back: one order, completed, audited', async () => {
    await refusedOrder('5');
    const plan = await actThroughDialog('console:5', 'Retry ‘create-order’', 'ERP back after INC-31');
    assert.match(plan, /create-order call POST .*Idempotency-Key/);
    const view = await settles('console:5', (v) => v.state === 'completed');
    assert.equal((await ordersOf('console:5')).length, 1);
    const audit = auditOf(view, 'retry');
    assert.equal(audit.length, 1);
    assert.equal(audit[0].actor, 'alice');
    assert.equal(audit[0].reason, 'ERP back after INC-31');
    await page.getByRole('heading', { name: /console:5.*completed/, level: 1 }).waitFor();
  });

  await check('skip a manual step through its dialog: nothing sent for it, the next step runs, audited', async () => {
    await refusedOrder('6');
    const plan = await actThroughDialog('console:6', 'Skip ‘create-order’', 'order keyed in by hand, ERP 5521');
    assert.doesNotMatch(plan, /create-order call/);
    assert.match(plan, /notify-email/);
    // The e-mail names the order's number, which a skipped step does not have: it
    // stops there, and says so, rather than send an e-mail without it.
    const view = await settles('console:6', (v) => v.state !== 'running' &&
      step(v, 'notify-email').state !== 'pending');
    assert.equal(step(view, 'create-order').state, 'skipped');
    assert.equal(step(view, 'create-order').resolution, 'operator');
    assert.equal((await ordersOf('console:6')).length, 0, 'a skipped step sent its order');
    assert.equal(auditOf(view, 'skip')[0]?.reason, 'order keyed in by hand, ERP 5521');
  });

  await check('close the case through its dialog: closed with its reason, nothing more sent', async () => {
    await refusedOrder('8');
    await actThroughDialog('console:8', 'Close the case', 'customer withdrew the order');
    const view = await settles('console:8', (v) => v.state === 'closed');
    assert.equal(auditOf(view, 'close')[0]?.reason, 'customer withdrew the order');
    await sleep(500);
    const after = await show('console:8');
    assert.equal(step(after, 'create-order').attempts, 3, 'closing sent the order again');
    assert.equal(step(after, 'notify-email').state, 'pending');
    assert.equal((await ordersOf('console:8')).length, 0);
    await page.getByRole('heading', { name: /console:8.*closed/, level: 1 }).waitFor();
  });

  await check('compensate a completed order through its dialog: the ERP order is cancelled, the instance compensated, audited', async () => {
    // console:5 completed after its retry; the customer cancels.
    const [order] = await ordersOf('console:5');
    assert.equal(order.status, 'open');
    const plan = await actThroughDialog('console:5', 'Compensate', 'customer cancelled by phone');
    // The dry run names the call as it will be sent, with the key it will carry.
    assert.match(plan, new RegExp(`create-order compensate POST ${sim}/erp/orders/${order.id}/cancel · ` +
      'Idempotency-Key default:console:5:create-order:compensate'));
    const view = await settles('console:5', (v) => v.state === 'compensated');
    assert.equal(step(view, 'create-order').state, 'compensated');
    const after = await ordersOf('console:5');
    assert.equal(after.length, 1);
    assert.equal(after[0].status, 'cancelled');
    assert.equal(auditOf(view, 'compensate')[0]?.reason, 'customer cancelled by phone');
    await page.getByRole('heading', { name: /console:5.*compensated/, level: 1 }).waitFor();
    await shot('instance-compensated');
  });

  await check('find by step, step state, HTTP status and definition version, from links', async () => {
    const hash = (await show('console:5')).definition_hash;
    const found = async (query) => {
      await page.goto(`${base}/console/#/find?${query}`);
      await page.getByRole('heading', { name: 'Find instances' }).waitFor();
      return until(`the search ${query}`, async () => {
        const text = await page.locator('.results').textContent();
        if (!/instances?\./.test(text)) return false;
        return (await page.locator('table.found tbody tr td:first-child').allTextContents()).sort();
      });
    };
    assert.deepEqual(await found('step=create-order&step_state=skipped'), ['console:6']);
    // console:3 was turned away once (503, Retry-After) at the start.
    assert.deepEqual(await found('http_status=503&workflow=console-order'),
      ['console:3', 'console:5', 'console:6', 'console:8']);
    assert.equal(await page.getByLabel('HTTP status').inputValue(), '503');
    assert.deepEqual(await found(`definition=${hash.slice(0, 12)}&state=closed`), ['console:8']);
    await shot('find-by-step');
    await axe('find-filters');
  });

  // (Before the last check, which reviews every page of the session.)
  await check('attempts: the instance view pages newest first through "Older attempts", with worker and lease epoch', async () => {
    // 54 refusals, then the answer: 55 attempts of one step, more than a page of 50.
    // Retry-After: 0, or each refusal would hold the next attempt back a second.
    await faults({ 'crm.get_customer': { next: Array(54).fill('unavailable'), retry_after_s: 0 } });
    await startOrder('console-retries', { order_id: '60', customer_id: 'C-60' });
    const view = await settles('retries:60', (v) => v.state === 'completed', 60);
    await faults({});
    assert.equal(step(view, 'fetch-customer').requests_total, 55);
    assert.equal(step(view, 'fetch-customer').requests.length, 10, 'the view carries only the newest few');
    // What the API pages, the truth the table must show in the same order.
    const truth = [];
    let cursor = null;
    do {
      const query = new URLSearchParams({ key: 'retries:60', limit: '20', ...(cursor ? { cursor } : {}) });
      const pageOf = (await call('GET', `${base}/v1/attempts?${query}`, { bearer: alice })).body;
      truth.push(...pageOf.items);
      cursor = pageOf.next_cursor;
    } while (cursor);
    assert.equal(truth.length, 55);
    assert.deepEqual(truth.map((a) => a.seq), Array.from({ length: 55 }, (_, i) => 55 - i), 'newest first, no gap');
    await page.goto(`${base}/console/#/instance/default/${encodeURIComponent('retries:60')}`);
    await page.getByRole('heading', { name: /retries:60/, level: 1 }).waitFor();
    const details = page.locator('details.attempts', { has: page.locator('caption', { hasText: 'fetch-customer' }) });
    await details.locator('summary').click();
    const rows = details.locator('table.requests tbody tr');
    await until('the first page', async () => (await rows.count()) === 50);
    assert.match(await details.textContent(), /50 of 55 shown/);
    const older = details.getByRole('button', { name: 'Older attempts' });
    await older.click();
    await until('the second page', async () => (await rows.count()) === 55);
    assert.equal(await older.isHidden(), true, 'a next page after the last');
    const seqs = await rows.evaluateAll((trs) => trs.map((tr) => Number(tr.children[0].textContent)));
    assert.deepEqual(seqs, truth.map((a) => a.seq));
    // The newest row names the worker (the server's lease owner) and its epoch.
    const newest = rows.first();
    const cells = await newest.locator('td').allTextContents();
    assert.equal(cells[8], truth[0].worker);
    assert.equal(cells[9], String(truth[0].lease_epoch));
    assert.match(truth[0].worker, /\/\d+\//, 'a worker named <host>/<pid>/<nonce>');
    assert.match(cells[7], /^ok$/);
    assert.match(await rows.nth(1).locator('td').nth(7).textContent(), /transient/);
    // Every step's attempts together: the same 55, newest first, with their step.
    const all = page.locator('details.all-attempts');
    await all.locator('summary').click();
    await until('the all-steps page', async () => (await all.locator('tbody tr').count()) === 50);
    assert.match(await all.locator('tbody tr').first().textContent(), /^fetch-customer55/);
    await shot('attempts');
    await axe('attempts');
  });

  await check('no script error in the browser; the only refusals are the ones the test asked for', async () => {
    // The browser logs each refused request as an error: those are checked below.
    assert.deepEqual(consoleErrors.filter((e) => !/^Failed to load resource: .* (400|401)/.test(e)), []);
    assert.deepEqual(refusals, [
      '401 /v1/me',  // the bad token
      // "It happened" without the external id yet: the server's dry run says to give it.
      '400 /v1/instances/console%3A1/confirm?dry_run=true&tenant=default',
    ]);
  });
  // ---- Bulk actions (issue 13 item 6): its own setup, after everything above. ----
  await check('bulk retry of 20 orders through the dialog after the ERP recovers: preview, batch, each item judged; the API, the audit trail and the ERP agree', async () => {
    const keys = Array.from({ length: 20 }, (_, i) => `bulk:${i + 1}`);
    // Twenty orders the ERP refuses until their retries run out: stopped at create-order.
    await faults({ 'erp.create_order': { fail: 1 } });
    for (let i = 1; i <= 20; i += 1) {
      await startOrder('order-to-erp', { source: 'bulk', order_id: String(i), customer_id: `C-${i}`, amount: i });
    }
    for (const key of keys) await settles(key, (v) => v.state === 'failed', 90);
    await faults({});  // the ERP came back
    const ordersBefore = (await call('GET', `${sim}/_sim/stats`)).body.orders;

    await page.goto(`${base}/console/#/find?state=failed&workflow=order-to-erp`);
    await until('the 20 stopped orders', async () => /^20 instances/.test(await page.locator('.results').textContent()));
    await page.getByRole('button', { name: 'Act on these 20 that match…' }).click();
    const dialog = page.locator('dialog[open]');
    await dialog.getByLabel('Action').selectOption('retry');
    await dialog.getByLabel('Step').fill('create-order');
    await dialog.getByLabel('Step').press('Tab');  // a change: the preview is asked again
    // The preview asked before the step was given (each item "retry needs a step") also
    // counts 20 with 5 details: wait for the one asked with the step.
    await until('the preview of 20 for create-order', async () =>
      /^20 instances match/.test(await dialog.locator('#batch-count').textContent()) &&
      (await dialog.locator('details.dry-run').count()) === 5 &&
      /create-order/.test(await dialog.locator('details.dry-run').first().textContent()));
    await dialog.locator('details.dry-run').first().locator('summary').click();
    assert.match(await dialog.locator('details.dry-run').first().textContent(),
      /create-order.*Idempotency-Key default:bulk:1:create-order/s);
    const start = dialog.getByRole('button', { name: 'Start batch' });
    assert.equal(await start.isDisabled(), true, 'a batch without a reason');
    assert.equal((await call('GET', `${base}/v1/batches`, { bearer: alice })).body.items.length, 0,
      'the preview made a batch');
    await dialog.getByLabel(/Reason/).fill('ERP back after INC-5120');
    await dialog.screenshot({ path: path.join(out, 'dialog-batch.png') });
    await axe('dialog-batch');
    await start.click();
    await dialog.locator('#batch-link').click();
    await page.getByRole('heading', { name: /^Batch [0-9a-f]{16}$/ }).waitFor();
    const id = (await page.getByRole('heading', { level: 1 }).textContent()).replace('Batch ', '');
    // The view follows the batch until every item has its result.
    await until('the batch to finish in the view', async () =>
      /finished/.test(await page.locator('.batch-head').textContent()), 90);
    await shot('batch');
    await axe('batch');

    const batch = (await call('GET', `${base}/v1/batches/${id}`, { bearer: alice })).body;
    assert.equal(batch.state, 'finished');
    assert.equal(batch.total, 20);
    assert.equal(batch.actor, 'alice');
    assert.equal(batch.reason, 'ERP back after INC-5120');
    assert.deepEqual(batch.filter, { state: 'failed', workflow: 'order-to-erp', stopped_at: 'create-order' });
    assert.deepEqual(batch.items.map((i) => i.key).sort(), [...keys].sort());
    for (const item of batch.items) {
      assert.equal(item.state, 'succeeded', JSON.stringify(item));
      assert.equal(item.result_state, 'completed', JSON.stringify(item));
    }
    for (const key of keys) {
      const view = await show(key);
      assert.equal(view.state, 'completed', key);
      const retries = view.audit.filter((a) => a.action === 'retry');
      assert.equal(retries.length, 1, `${key}: ${JSON.stringify(view.audit)}`);
      assert.equal(retries[0].detail.batch, id);
      assert.equal(retries[0].actor, 'alice');
      // The ERP's own records: exactly one order under this instance's reference.
      const erp = await call('GET', `${sim}/erp/orders?ref=${encodeURIComponent(`default:${key}`)}`);
      assert.equal(erp.body.items.length, 1, `${key}: ${JSON.stringify(erp.body)}`);
    }
    assert.equal((await call('GET', `${sim}/_sim/stats`)).body.orders, ordersBefore + 20);
    // Each item links to its instance.
    await page.locator('#batch-items').getByRole('link', { name: 'bulk:7', exact: true }).click();
    await page.getByRole('heading', { name: /bulk:7/, level: 1 }).waitFor();
    await page.goto(`${base}/console/#/batches`);
    await page.getByRole('link', { name: id }).waitFor();
    await shot('batches');
    await axe('batches');
  });

  await check('a paused batch takes no item until it is resumed from its view; a viewer is offered no pause', async () => {
    // The same twenty again: each is completed now, so the retry is refused item by item.
    const created = await call('POST', `${base}/v1/batches`, { bearer: alice, body: {
      action: 'retry', step: 'create-order', reason: 'second pass', filter: { key_prefix: 'bulk:' } } });
    const id = created.body.id;
    const paused = await call('POST', `${base}/v1/batches/${id}/pause`, { bearer: alice, body: {} });
    assert.equal(paused.body.state, 'paused');
    await page.goto(`${base}/console/#/batch/${id}`);
    await page.locator('.batch-head', { hasText: 'paused' }).waitFor();
    await page.getByRole('button', { name: 'Resume' }).waitFor();
    const waiting = async () => (await call('GET', `${base}/v1/batches/${id}`, { bearer: alice })).body.counts;
    // Items taken before the pause finish; after that none is taken.
    const settled = await until('the items under way', async () => {
      const counts = await waiting();
      return counts.applying === 0 && counts.applied === 0 ? counts : false;
    });
    assert.ok(settled.pending > 0, JSON.stringify(settled));
    await sleep(1500);
    assert.equal((await waiting()).pending, settled.pending, 'a paused batch took items');
    await shot('batch-paused');
    await axe('batch-paused');
    const viewer = await browser.newContext({ viewport: { width: 1366, height: 900 } });
    const vpage = await viewer.newPage();
    await vpage.goto(`${base}/console/#/batch/${id}`);
    await vpage.getByLabel('API token').fill(victor);
    await vpage.getByRole('button', { name: 'Log in' }).click();
    await vpage.locator('.batch-head', { hasText: 'paused' }).waitFor();
    assert.equal(await vpage.getByRole('button', { name: /Resume|Pause|Cancel/ }).count(), 0);
    await viewer.close();
    await page.getByRole('button', { name: 'Resume' }).click();
    await until('the resumed batch to finish', async () =>
      /finished/.test(await page.locator('.batch-head').textContent()), 60);
    const done = (await call('GET', `${base}/v1/batches/${id}`, { bearer: alice })).body;
    assert.equal(done.counts.refused, 20, JSON.stringify(done.counts));
    assert.match(done.items[0].message, /completed/);
    for (const key of ['bulk:1', 'bulk:20']) {
      assert.equal((await show(key)).audit.filter((a) => a.action === 'retry').length, 1, key);
    }
  });

  // Access: a second API-only server on the same database whose permissions narrow
  // operators of tenant "default" to retry and confirm.
  await check('permissions: an operator narrowed to retry and confirm is not offered compensate or close, and gets 403 for them', async () => {
    const narrowPort = await freePort();
    const narrow = `http://127.0.0.1:${narrowPort}`;
    fs.writeFileSync(path.join(work, 'narrow.yaml'),
      `database: ${db}\nlisten: 127.0.0.1:${narrowPort}\ndefinitions: definitions\n` +
      'permissions:\n  - role: operator\n    tenant: default\n    actions: [retry, confirm]\n');
    const nora = await token('operator', 'nora');
    start('serve-narrow', ['serve', '--api-only', '--config', path.join(work, 'narrow.yaml')], env);
    await until('the narrowed server', async () => (await fetch(`${narrow}/readyz`)).ok);
    // Its own order with an unknown outcome (the ERP's answer lost): confirm is offered.
    await faults({ 'erp.create_order': { next: ['close_before_bytes'] } });
    await startOrder('console-order', { order_id: 'p1', customer_id: 'C-P1', amount: 4 });
    await settles('console:p1', (v) => v.state === 'needs_attention');
    await faults({});
    const me = (await call('GET', `${narrow}/v1/me`, { bearer: nora })).body;
    assert.deepEqual(me.actions, ['retry', 'confirm']);
    // What the same state offers a default operator, on the first server: close too.
    const full = (await show('console:p1')).stopped.next_actions.map((a) => a.action);
    assert.ok(full.includes('confirm') && full.includes('close'), JSON.stringify(full));

    const narrowed = await browser.newContext({ viewport: { width: 1366, height: 900 } });
    const npage = await narrowed.newPage();
    await npage.goto(`${narrow}/console/#/instance/default/console%3Ap1`);
    await npage.getByLabel('API token').fill(nora);
    await npage.getByRole('button', { name: 'Log in' }).click();
    await npage.getByRole('heading', { name: /console:p1/, level: 1 }).waitFor();
    const offered = await npage.locator('button.action').evaluateAll((buttons) => buttons.map((b) => b.dataset.action));
    assert.ok(offered.includes('confirm'), JSON.stringify(offered));
    for (const action of offered) assert.ok(['retry', 'confirm'].includes(action), JSON.stringify(offered));
    assert.equal(await npage.locator('button.action-compensate, button.action-close').count(), 0);
    assert.equal(await npage.getByRole('button', { name: /Acknowledge/ }).count(), 0);
    assert.doesNotMatch(await npage.locator('.actions-text').textContent(), /ompensate|lose/);
    await npage.screenshot({ path: path.join(out, 'instance-narrowed-operator.png'), fullPage: true });
    const before = await show('console:p1');
    for (const action of ['compensate', 'close']) {
      for (const dry of ['?dry_run=true', '']) {
        const refused = await call('POST', `${narrow}/v1/instances/console%3Ap1/${action}${dry}`,
          { bearer: nora, body: { reason: 'narrowed operator tries' }, ok: false });
        assert.equal(refused.status, 403, `${action}${dry}`);
        assert.match(refused.headers.get('content-type'), /problem\+json/);
        assert.equal(refused.body.action, action);
        assert.equal(refused.body.role, 'operator');
      }
    }
    // And from the page itself, as a script would: the same 403.
    const fromPage = await npage.evaluate(async (key) => {
      const response = await fetch(`/v1/instances/${encodeURIComponent(key)}/close`, {
        method: 'POST', body: JSON.stringify({ reason: 'from the page' }),
        headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${sessionStorage.getItem('waystone.token')}` },
      });
      return response.status;
    }, 'console:p1');
    assert.equal(fromPage, 403);
    const after = await show('console:p1');
    assert.equal(after.state, before.state);
    assert.deepEqual(after.audit, before.audit);
    // Bulk actions offer only what the operator may take: of retry, skip, compensate
    // and close, retry.
    await npage.goto(`${narrow}/console/#/find?state=needs_attention&workflow=console-order`);
    await npage.getByRole('button', { name: /^Act on / }).click();
    const options = await npage.locator('dialog[open] #batch-action option').evaluateAll((o) => o.map((x) => x.value));
    assert.deepEqual(options, ['retry']);
    await npage.keyboard.press('Escape');
    const closeBatch = await call('POST', `${narrow}/v1/batches?dry_run=true`, { bearer: nora, ok: false,
      body: { action: 'close', reason: 'narrowed', filter: { state: 'needs_attention' } } });
    assert.equal(closeBatch.status, 403);
    assert.equal(closeBatch.body.action, 'close');
    await narrowed.close();
  });

  // Access: an admin of tenant "default" creates a token in the Tokens view,
  // revokes it there with a reason, and the token is refused from then on.
  await check('tokens: only an admin is offered the view; it creates a token, revokes it with a reason, and that token then gets 401', async () => {
    const ada = await token('admin', 'ada');
    const operatorView = await browser.newContext({ viewport: { width: 1366, height: 900 } });
    const opage = await operatorView.newPage();
    await opage.goto(`${base}/console/`);
    await opage.getByLabel('API token').fill(alice);
    await opage.getByRole('button', { name: 'Log in' }).click();
    await opage.getByRole('navigation').getByRole('link', { name: 'Triage' }).waitFor();
    assert.equal(await opage.getByRole('link', { name: 'Tokens' }).count(), 0, 'an operator is offered Tokens');
    await operatorView.close();
    assert.equal((await call('GET', `${base}/v1/tokens`, { bearer: alice, ok: false })).status, 403);

    const adminView = await browser.newContext({ viewport: { width: 1366, height: 900 } });
    const apage = await adminView.newPage();
    const errors = [];
    apage.on('pageerror', (error) => errors.push(String(error)));
    await apage.goto(`${base}/console/`);
    await apage.getByLabel('API token').fill(ada);
    await apage.getByRole('button', { name: 'Log in' }).click();
    await apage.getByRole('link', { name: 'Tokens' }).click();
    await apage.getByRole('heading', { name: 'Tokens', level: 1 }).waitFor();
    for (const name of ['alice', 'victor', 'ada']) {
      assert.equal(await apage.locator(`tr[data-token="${name}"]`).count(), 1, name);
    }
    await apage.getByLabel('Name').fill('temp-operator');
    await apage.getByLabel('Role').selectOption('operator');
    await apage.getByRole('button', { name: 'Create' }).click();
    const secret = await apage.locator('#token-secret code.secret').textContent();
    assert.match(secret, /^wst_[0-9a-f]{64}$/);
    assert.equal((await call('GET', `${base}/v1/me`, { bearer: secret })).body.token, 'temp-operator');
    await apage.locator('tr[data-token="temp-operator"]').waitFor();
    assert.doesNotMatch(await apage.locator('#token-list').textContent(), new RegExp(secret.slice(4, 20)));
    await apage.screenshot({ path: path.join(out, 'tokens.png'), fullPage: true });
    await apage.evaluate(axeSource);
    const result = await apage.evaluate(async () => window.axe.run(document, {
      runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa'] },
    }));
    assert.deepEqual(result.violations.map((v) => `${v.id}: ${v.help}`), [], 'axe on tokens');

    await apage.getByRole('button', { name: 'Revoke temp-operator' }).click();
    const dialog = apage.locator('dialog[open]');
    await dialog.getByRole('button', { name: 'Revoke' }).click();  // no reason yet: nothing sent
    assert.equal((await call('GET', `${base}/v1/me`, { bearer: secret })).status, 200);
    await dialog.getByLabel(/Reason/).fill('rotated after the drill');
    await dialog.getByRole('button', { name: 'Revoke' }).click();
    await dialog.getByText('Token temp-operator is revoked.').waitFor();
    await dialog.getByRole('button', { name: 'Done' }).click();
    const row = apage.locator('tr[data-token="temp-operator"]');
    await until('the list to show the revocation', async () => /rotated after the drill/.test(await row.textContent()));
    assert.match(await row.textContent(), /revoked.*by ada: rotated after the drill/i);
    assert.equal(await row.getByRole('button', { name: /Revoke/ }).count(), 0);
    await apage.screenshot({ path: path.join(out, 'tokens-revoked.png'), fullPage: true });
    const refused = await call('GET', `${base}/v1/me`, { bearer: secret, ok: false });
    assert.equal(refused.status, 401);
    // The API agrees, and names who revoked it and why.
    const listed = (await call('GET', `${base}/v1/tokens`, { bearer: ada })).body.items;
    const temp = listed.find((t) => t.name === 'temp-operator');
    assert.equal(temp.state, 'revoked');
    assert.equal(temp.revoked_by, 'ada');
    assert.equal(temp.revoke_reason, 'rotated after the drill');
    assert.ok(listed.every((t) => !('token' in t) && !('hash' in t) && !('id' in t)));
    assert.deepEqual(errors, []);
    await adminView.close();
  });

  // Access: a workflow whose definition redacts the customer's phone, registered by
  // a third API-only server; a viewer sees "[redacted]", an admin the number.
  await check('redaction: the pinned input shows a redacted value as [redacted] to a viewer and in full to an admin', async () => {
    const redactPort = await freePort();
    const redactBase = `http://127.0.0.1:${redactPort}`;
    const folder = path.join(work, 'definitions-redacted');
    fs.mkdirSync(folder);
    fs.writeFileSync(path.join(folder, 'console-redacted.yaml'),
      'workflow: console-redacted\nkey: "redacted:{{input.order_id}}"\nredact: [/customer/phone]\n' +
      'steps:\n  - name: approval\n    wait: { event: com.example.approved }\n');
    fs.writeFileSync(path.join(work, 'redacted.yaml'),
      `database: ${db}\nlisten: 127.0.0.1:${redactPort}\ndefinitions: definitions-redacted\n`);
    start('serve-redacted', ['serve', '--api-only', '--config', path.join(work, 'redacted.yaml')], env);
    await until('the redacting server', async () => (await fetch(`${redactBase}/readyz`)).ok);
    const phone = '+81-90-5555-0101';
    await call('POST', `${redactBase}/v1/instances`, { bearer: alice,
      body: { workflow: 'console-redacted', input: { order_id: '1', customer: { phone } } } });
    const ada = await token('admin', 'ada-redact');
    const url = `${redactBase}/console/#/instance/default/redacted%3A1`;
    const seen = {};
    for (const [who, bearer] of [['victor', victor], ['ada', ada]]) {
      const context = await browser.newContext({ viewport: { width: 1366, height: 900 } });
      const p = await context.newPage();
      await p.goto(url);
      await p.getByLabel('API token').fill(bearer);
      await p.getByRole('button', { name: 'Log in' }).click();
      await p.getByRole('heading', { name: /redacted:1/, level: 1 }).waitFor();
      await p.getByText('Input (pinned)').click();
      seen[who] = await p.locator('pre.input').textContent();
      await p.screenshot({ path: path.join(out, `instance-redacted-${who}.png`), fullPage: true });
      await context.close();
    }
    assert.match(seen.victor, /"phone": "\[redacted\]"/);
    assert.doesNotMatch(seen.victor, /5555/);
    assert.match(seen.ada, new RegExp(`"phone": "\\${phone}"`));
    // The API says the same to the viewer; the store keeps the number.
    const viewed = (await call('GET', `${redactBase}/v1/instances/redacted%3A1`, { bearer: victor })).body;
    assert.equal(viewed.input.customer.phone, '[redacted]');
    assert.equal(viewed.input.order_id, '1');
  });

  await check('approval: the snapshot and data version are shown; the requester is refused with why; a viewer of the finance group approves; the API, the audit trail and the ERP agree', async () => {
    await startOrder('order-approval', { source: 'crm', order_id: '50', customer_id: 'C-50', amount: 4200,
      lines: [{ sku: 'A-1', qty: 3 }], submitted_by: 'alice' });
    const waiting = await settles('crm:50', (v) => v.approvals?.[0]?.state === 'waiting');
    const url = `${base}/console/#/instance/default/crm%3A50`;
    // alice (an operator, and the requester; not in the group) is refused, and told why.
    await page.goto(url);
    await page.getByRole('heading', { name: 'Approvals' }).waitFor();
    await page.getByRole('button', { name: 'Approve' }).click();
    await page.getByText(/decided by group 'finance', and 'alice' is not in it/).waitFor();
    assert.equal((await show('crm:50')).approvals[0].state, 'waiting');
    const context = await browser.newContext({ viewport: { width: 1366, height: 900 } });
    const p = await context.newPage();
    const errors = [];
    p.on('pageerror', (error) => errors.push(String(error)));
    await p.goto(url);
    await p.getByLabel('API token').fill(victor);
    await p.getByRole('button', { name: 'Log in' }).click();
    await p.getByRole('heading', { name: 'Approvals' }).waitFor();
    await p.getByText('Order 50 for C-50: 4200 EUR').waitFor();
    assert.equal(await p.locator('article.approval code[title]').getAttribute('title'),
      waiting.approvals[0].data_version);
    await p.getByLabel('Comment (kept with the decision)').fill('checked against the quote');
    await p.screenshot({ path: path.join(out, 'instance-approval.png'), fullPage: true, timeout: 60000 });
    await p.getByRole('button', { name: 'Approve' }).click();
    // The view is drawn again with the decision in place of the form.
    await p.locator('article.approval').getByText('approve by victor — checked against the quote').waitFor();
    assert.equal(await p.getByRole('button', { name: 'Approve' }).count(), 0);
    const done = await settles('crm:50', (v) => v.state === 'completed');
    assert.equal(done.approvals[0].decision.by, 'victor');
    assert.equal(done.approvals[0].decision.comment, 'checked against the quote');
    assert.equal(done.audit.filter((a) => a.action === 'decide').length, 1);
    assert.ok(done.audit.some((a) => a.action === 'decision_refused' && a.actor === 'alice'));
    const erp = await call('GET', `${sim}/erp/orders?ref=${encodeURIComponent('default:crm:50')}`);
    assert.equal(erp.body.items.length, 1, 'one ERP order, after the approval');
    assert.deepEqual(errors, []);
    await context.close();
  });
} catch (error) {
  failures += 1;
  console.log(`not ok - setting up\n  ${error.stack ?? error}`);
} finally {
  if (browser) await browser.close();
  await stopAll();
  fs.rmSync(work, { recursive: true, force: true });
}
console.log(`screenshots and logs: ${out}`);
console.log(`${passes} passed, ${failures} failed`);
process.exit(failures === 0 ? 0 : 1);
