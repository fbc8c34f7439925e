// smtp_target — independent SMTP test target for the workflow engine's tests.
//
// A real SMTP server (the npm package smtp-server, pinned in package.json) with
// fault injection, plus a small JSON control server (node:http). It shares no
// code with the engine. See tests/targets/README.md for the full description.
//
//   node smtp_target.mjs [--host 127.0.0.1] [--port 0] [--smtp-port 0] [--seed N] [--password P]
//
// Once both servers listen it prints one line, `PORT <control port>`, to stdout,
// then serves until SIGTERM/SIGINT and exits 0.

import http from 'node:http';
import { SMTPServer } from 'smtp-server';

// ---------------------------------------------------------------- arguments

function usage(msg) {
  if (msg) process.stderr.write(`smtp_target: ${msg}\n`);
  process.stderr.write(
    'usage: node smtp_target.mjs [--host 127.0.0.1] [--port 0] [--smtp-port 0] [--seed N] [--password P]\n');
  process.exit(2);
}

function parseArgs(argv) {
  const opts = { host: '127.0.0.1', port: 0, smtpPort: 0, seed: 0, password: null };
  for (let i = 0; i < argv.length; i++) {
    let arg = argv[i];
    let value;
    const eq = arg.indexOf('=');
    if (arg.startsWith('--') && eq > 0) {
      value = arg.slice(eq + 1);
      arg = arg.slice(0, eq);
    }
    const take = () => {
      if (value !== undefined) return value;
      if (i + 1 >= argv.length) usage(`${arg} needs a value`);
      return argv[++i];
    };
    const int = (s, lo, hi) => {
      if (!/^-?\d+$/.test(s)) usage(`${arg}: not an integer: ${s}`);
      const n = Number(s);
      if (n < lo || n > hi) usage(`${arg}: out of range: ${s}`);
      return n;
    };
    switch (arg) {
      case '--host': opts.host = take(); break;
      case '--port': opts.port = int(take(), 0, 65535); break;
      case '--smtp-port': opts.smtpPort = int(take(), 0, 65535); break;
      case '--seed': opts.seed = int(take(), -(2 ** 53), 2 ** 53); break;
      case '--password': opts.password = take(); break;
      case '-h': case '--help': usage(); break;
      default: usage(`unknown argument ${arg}`);
    }
  }
  return opts;
}

const opts = parseArgs(process.argv.slice(2));

function log(...parts) {
  try {
    process.stderr.write(`smtp_target: ${parts.map(p => (p instanceof Error ? (p.stack || p.message) : String(p))).join(' ')}\n`);
  } catch {
    // nothing sensible left to do
  }
}

process.on('uncaughtException', err => log('uncaught exception:', err));
process.on('unhandledRejection', err => log('unhandled rejection:', err));

// ---------------------------------------------------------------- PRNG

// mulberry32: tiny, seedable, reproducible across runs and platforms.
function mulberry32(seed) {
  let a = seed >>> 0;
  return function next() {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// ---------------------------------------------------------------- state

const SIZE_LIMIT = 1024 * 1024;
const DATA_SHAPES = new Set([
  'ok', 'accept_then_close', 'accept_then_reset', 'accept_then_stall', 'accept_then_wait',
  'reject_451', 'reject_550',
]);
const ALL_SHAPES = new Set([...DATA_SHAPES, 'close_at_mail']);
const DEFAULT_STALL_MS = 5000;
const MAX_STALL_MS = 600000;

let state;
let faults;
let rand;
let queueCounter = 0; // queue ids are never reused, not even after a reset

function freshState() {
  return {
    connections_total: 0,
    messages_received: 0,
    replies_dropped: 0,
    rejected: 0,
    too_large: 0,
    auth_failures: 0,
    duplicates: 0,
    by_recipient: Object.create(null),
    messages: [],
  };
}

function resetAll() {
  state = freshState();
  faults = { next: [], drop_percent: 0, stall_ms: DEFAULT_STALL_MS };
  rand = mulberry32(opts.seed);
}
resetAll();

function faultsView() {
  return { next: [...faults.next], drop_percent: faults.drop_percent, stall_ms: faults.stall_ms };
}

// The shape for a completed DATA. close_at_mail at the head of the queue is left
// for the next MAIL FROM, and the message is handled as if the queue were empty.
function takeDataShape() {
  if (faults.next.length && faults.next[0] !== 'close_at_mail') return faults.next.shift();
  if (faults.drop_percent > 0 && rand() * 100 < faults.drop_percent) return 'accept_then_close';
  return 'ok';
}

// ---------------------------------------------------------------- message parsing

function decoderFor(charset) {
  let label = (charset || 'utf-8').trim().toLowerCase();
  if (label === 'us-ascii' || label === 'ascii') label = 'utf-8';
  try {
    return new TextDecoder(label);
  } catch {
    return new TextDecoder('utf-8');
  }
}

// latin1: the text holds raw bytes as code points 0..255 (a body), else it is UTF-8 text.
function decodeQBytes(text, underscoreIsSpace, latin1 = false) {
  const bytes = [];
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '=' && /^[0-9A-Fa-f]{2}$/.test(text.slice(i + 1, i + 3))) {
      bytes.push(parseInt(text.slice(i + 1, i + 3), 16));
      i += 2;
    } else if (c === '_' && underscoreIsSpace) {
      bytes.push(0x20);
    } else {
      const code = c.charCodeAt(0);
      if (code < 0x80 || (latin1 && code < 0x100)) bytes.push(code);
      else for (const b of Buffer.from(c, 'utf8')) bytes.push(b);
    }
  }
  return Buffer.from(bytes);
}

const ENCODED_WORD = /=\?([^?\s]+)\?([BbQq])\?([^?\s]*)\?=/g;

// RFC 2047: decodes encoded-words; whitespace between two adjacent encoded-words is
// dropped, and adjacent words in the same charset are joined at the byte level (so
// a multi-byte character split across two words still decodes).
function decodeWords(value) {
  if (typeof value !== 'string' || !value.includes('=?')) return value;
  const tokens = []; // {kind:'text', s} | {kind:'word', charset, bytes}
  let last = 0;
  ENCODED_WORD.lastIndex = 0;
  let m;
  while ((m = ENCODED_WORD.exec(value)) !== null) {
    const between = value.slice(last, m.index);
    const prev = tokens[tokens.length - 1];
    if (between && !(prev && prev.kind === 'word' && /^\s+$/.test(between))) {
      tokens.push({ kind: 'text', s: between });
    }
    const charset = m[1].split('*')[0].toLowerCase(); // RFC 2231 language suffix
    let bytes;
    if (m[2].toUpperCase() === 'B') {
      bytes = Buffer.from(m[3].replace(/[^A-Za-z0-9+/]/g, ''), 'base64');
    } else {
      bytes = decodeQBytes(m[3], true);
    }
    const top = tokens[tokens.length - 1];
    if (top && top.kind === 'word' && top.charset === charset) {
      top.bytes = Buffer.concat([top.bytes, bytes]);
    } else {
      tokens.push({ kind: 'word', charset, bytes });
    }
    last = m.index + m[0].length;
  }
  if (last < value.length) tokens.push({ kind: 'text', s: value.slice(last) });
  return tokens.map(t => (t.kind === 'text' ? t.s : decoderFor(t.charset).decode(t.bytes))).join('');
}

// Splits raw message bytes into {headers (lower-case name -> first value), body (Buffer)}.
function splitMessage(buf) {
  let headerEnd = -1;
  let bodyStart = buf.length;
  for (let i = 0; i < buf.length; i++) {
    if (buf[i] !== 0x0a) continue;
    // buf[i] is LF: is the next line empty?
    if (i === 0 || (i === 1 && buf[0] === 0x0d)) {
      // the message starts with an empty line: no headers at all
      headerEnd = 0;
      bodyStart = i + 1;
      break;
    }
    if (buf[i + 1] === 0x0a) { headerEnd = i + 1; bodyStart = i + 2; break; }
    if (buf[i + 1] === 0x0d && buf[i + 2] === 0x0a) { headerEnd = i + 1; bodyStart = i + 3; break; }
  }
  if (headerEnd < 0) { headerEnd = buf.length; bodyStart = buf.length; }
  const headerText = buf.subarray(0, headerEnd).toString('utf8');
  const headers = Object.create(null);
  const unfolded = [];
  for (const line of headerText.split(/\r?\n/)) {
    if (/^[ \t]/.test(line) && unfolded.length) unfolded[unfolded.length - 1] += line;
    else if (line !== '') unfolded.push(line);
  }
  for (const line of unfolded) {
    const colon = line.indexOf(':');
    if (colon <= 0) continue;
    const name = line.slice(0, colon).trim().toLowerCase();
    if (!name || name in headers) continue;
    headers[name] = line.slice(colon + 1).trim();
  }
  return { headers, body: buf.subarray(bodyStart) };
}

function headerParam(value, param) {
  if (!value) return null;
  const re = new RegExp(`;\\s*${param}\\s*=\\s*(?:"((?:[^"\\\\]|\\\\.)*)"|([^;\\s]+))`, 'i');
  const m = re.exec(value);
  if (!m) return null;
  return m[1] !== undefined ? m[1].replace(/\\(.)/g, '$1') : m[2];
}

function decodeBody(headers, body) {
  const cte = (headers['content-transfer-encoding'] || '7bit').trim().toLowerCase();
  let bytes = body;
  if (cte === 'base64') {
    bytes = Buffer.from(body.toString('latin1').replace(/[^A-Za-z0-9+/]/g, ''), 'base64');
  } else if (cte === 'quoted-printable') {
    const s = body.toString('latin1').replace(/[ \t]+(?=\r?\n)/g, '').replace(/=\r?\n/g, '');
    bytes = decodeQBytes(s, false, true);
  }
  return bytes;
}

// The text of a body part. For multipart/* the first text/plain part (depth first)
// is used, else the first part; otherwise the body decoded per its own headers.
function partText(headers, body, depth = 0) {
  const ctype = (headers['content-type'] || 'text/plain').trim();
  if (/^multipart\//i.test(ctype) && depth < 8) {
    const boundary = headerParam(ctype, 'boundary');
    if (boundary) {
      const parts = splitMultipart(body, boundary);
      if (parts.length) {
        const parsed = parts.map(p => splitMessage(p));
        const plain = parsed.find(p => /^text\/plain\b/i.test((p.headers['content-type'] || 'text/plain').trim()));
        const nested = plain ? null : parsed.find(p => /^multipart\//i.test(p.headers['content-type'] || ''));
        const pick = plain || nested || parsed[0];
        return partText(pick.headers, pick.body, depth + 1);
      }
    }
  }
  const bytes = decodeBody(headers, body);
  return decoderFor(headerParam(ctype, 'charset')).decode(bytes);
}

function splitMultipart(body, boundary) {
  const text = body.toString('latin1');
  const lines = text.split(/\r?\n/);
  const delim = `--${boundary}`;
  const parts = [];
  let current = null;
  for (const line of lines) {
    const trimmed = line.replace(/[ \t]+$/, '');
    if (trimmed === delim || trimmed === `${delim}--`) {
      if (current) parts.push(current);
      current = trimmed === delim ? [] : null;
      if (trimmed !== delim) break;
      continue;
    }
    if (current) current.push(line);
  }
  return parts.map(p => Buffer.from(p.join('\r\n'), 'latin1'));
}

function parseMessage(buf) {
  const { headers, body } = splitMessage(buf);
  let text = partText(headers, body);
  text = text.replace(/\r\n/g, '\n').replace(/\n+$/, '');
  const mid = headers['message-id'];
  return {
    message_id: mid === undefined ? null : mid.trim(),
    from: headers.from === undefined ? null : decodeWords(headers.from),
    to: headers.to === undefined ? null : decodeWords(headers.to),
    subject: headers.subject === undefined ? null : decodeWords(headers.subject),
    text,
    headers: { ...headers },
  };
}

// ---------------------------------------------------------------- cutting connections

// net.Socket of each live SMTP connection, by remote port (a fallback only: the
// connection is normally found through smtp-server's own connection set, whose
// entries have the same id as the session given to the handlers).
const socketsByPort = new Map();

function findConnection(session) {
  for (const conn of smtp.connections) {
    if (conn && conn.id === session.id) return conn;
  }
  return null;
}

function findSocket(session) {
  const conn = findConnection(session);
  if (conn && conn._socket) return { conn, socket: conn._socket };
  const socket = socketsByPort.get(session.remotePort);
  return socket ? { conn: null, socket } : null;
}

// FIN: the client reads end-of-stream where it expects the reply.
function cutWithFin(session, quiet = false) {
  const found = findSocket(session);
  if (!found) {
    if (!quiet) log('cannot find the socket of session', session.id);
    return;
  }
  const { conn, socket } = found;
  try {
    if (conn && typeof conn.close === 'function') {
      conn.close(); // socket.end() + stop parsing + drain whatever still arrives
    } else {
      socket.end();
      socket.resume();
    }
    // never hold a half-closed socket for long
    setTimeout(() => { if (!socket.destroyed) socket.destroy(); }, 5000).unref();
  } catch (err) {
    log('closing failed:', err);
    try { socket.destroy(); } catch { /* ignore */ }
  }
}

// RST: SO_LINGER 0 + close, pending data discarded.
function cutWithRst(session) {
  const found = findSocket(session);
  if (!found) { log('cannot find the socket of session', session.id); return; }
  const { socket } = found;
  try {
    if (typeof socket.resetAndDestroy === 'function') socket.resetAndDestroy();
    else socket.destroy();
  } catch (err) {
    log('reset failed:', err);
    try { socket.destroy(); } catch { /* ignore */ }
  }
}

// ---------------------------------------------------------------- SMTP handlers

function onAuth(auth, session, callback) {
  if (opts.password !== null && auth.password !== opts.password) {
    state.auth_failures++;
    const err = new Error('5.7.8 Authentication credentials invalid');
    err.responseCode = 535;
    return callback(err);
  }
  return callback(null, { user: auth.username || '' });
}

function onMailFrom(address, session, callback) {
  if (faults.next.length && faults.next[0] === 'close_at_mail') {
    faults.next.shift();
    cutWithFin(session); // no reply, the callback is never called
    return;
  }
  callback();
}

function recordMessage(buf, session, shape) {
  const envelope = session.envelope || {};
  const parsed = parseMessage(buf);
  const rcpts = (envelope.rcptTo || []).map(r => r.address);
  const rec = {
    seq: state.messages_received + 1,
    message_id: parsed.message_id,
    envelope_from: envelope.mailFrom ? envelope.mailFrom.address : null,
    envelope_to: rcpts,
    from: parsed.from,
    to: parsed.to,
    subject: parsed.subject,
    text: parsed.text,
    headers: parsed.headers,
    shape,
    size: buf.length,
    auth_user: session.user === undefined || session.user === false ? null : session.user,
  };
  state.messages_received++;
  state.messages.push(rec);
  if (rec.message_id !== null) {
    for (const rcpt of rcpts) {
      const per = state.by_recipient[rcpt] || (state.by_recipient[rcpt] = Object.create(null));
      if (per[rec.message_id]) state.duplicates++;
      per[rec.message_id] = (per[rec.message_id] || 0) + 1;
    }
  }
  return rec;
}

function onData(stream, session, callback) {
  const chunks = [];
  let kept = 0;
  let failed = false;
  stream.on('data', chunk => {
    // keep what fits in the limit (plus one byte to notice the overflow), drop the rest
    if (kept <= SIZE_LIMIT) {
      chunks.push(chunk);
      kept += chunk.length;
    }
  });
  stream.on('error', err => {
    // the client went away before the terminating dot: nothing was received
    failed = true;
    log('message stream error:', err.message);
  });
  stream.on('end', () => {
    if (failed) return;
    try {
      if (stream.sizeExceeded || kept > SIZE_LIMIT) {
        state.too_large++;
        const err = new Error(`5.3.4 message exceeds the size limit of ${SIZE_LIMIT} bytes`);
        err.responseCode = 552;
        return callback(err);
      }
      const buf = Buffer.concat(chunks);
      const shape = takeDataShape();
      switch (shape) {
        case 'reject_451': {
          state.rejected++;
          const err = new Error('4.3.0 temporary failure');
          err.responseCode = 451;
          return callback(err);
        }
        case 'reject_550': {
          state.rejected++;
          const err = new Error('5.7.1 refused');
          err.responseCode = 550;
          return callback(err);
        }
        case 'accept_then_close':
          recordMessage(buf, session, shape);
          state.replies_dropped++;
          return cutWithFin(session);
        case 'accept_then_reset':
          recordMessage(buf, session, shape);
          state.replies_dropped++;
          return cutWithRst(session);
        case 'accept_then_stall': {
          recordMessage(buf, session, shape);
          state.replies_dropped++;
          const timer = setTimeout(() => cutWithFin(session, true), faults.stall_ms);
          timer.unref();
          return undefined;
        }
        case 'accept_then_wait': {
          // taken now, answered 250 only after stall_ms: a slow server, nothing lost
          recordMessage(buf, session, 'ok');
          queueCounter++;
          const queued = `OK: queued as Q${String(queueCounter).padStart(6, '0')}`;
          const timer = setTimeout(() => callback(null, queued), faults.stall_ms);
          timer.unref();
          return undefined;
        }
        default: {
          recordMessage(buf, session, 'ok');
          queueCounter++;
          return callback(null, `OK: queued as Q${String(queueCounter).padStart(6, '0')}`);
        }
      }
    } catch (err) {
      log('handling a message failed:', err);
      const e = new Error('4.3.0 internal error of the test target');
      e.responseCode = 451;
      try { callback(e); } catch { /* ignore */ }
      return undefined;
    }
  });
  if (stream.readableFlowing === null) stream.resume();
}

const smtp = new SMTPServer({
  name: 'smtp-target.test',
  banner: 'waystone smtp test target',
  logger: false,
  secure: false,
  disabledCommands: ['STARTTLS'],
  hideSTARTTLS: true,
  authOptional: true,
  allowInsecureAuth: true,
  authMethods: ['PLAIN', 'LOGIN'],
  size: SIZE_LIMIT,
  disableReverseLookup: true,
  onAuth,
  onMailFrom,
  onData,
});

smtp.on('error', err => log('smtp error:', err.message));
smtp.server.on('connection', socket => {
  state.connections_total++;
  const port = socket.remotePort;
  socketsByPort.set(port, socket);
  socket.on('close', () => { if (socketsByPort.get(port) === socket) socketsByPort.delete(port); });
  socket.on('error', () => { /* smtp-server reports socket errors itself */ });
});

let smtpPort = null;

// ---------------------------------------------------------------- control HTTP server

function sendJson(res, status, obj, extraHeaders = {}) {
  const body = Buffer.from(`${JSON.stringify(obj)}\n`, 'utf8');
  res.writeHead(status, {
    'Content-Type': 'application/json',
    'Content-Length': body.length,
    ...extraHeaders,
  });
  res.end(body);
}

function statsView() {
  return {
    smtp_port: smtpPort,
    connections_total: state.connections_total,
    messages_received: state.messages_received,
    replies_dropped: state.replies_dropped,
    rejected: state.rejected,
    too_large: state.too_large,
    auth_failures: state.auth_failures,
    duplicates: state.duplicates,
    by_recipient: state.by_recipient,
    messages: state.messages,
    faults: faultsView(),
  };
}

// Validates a faults post; returns an error text or null. Nothing is applied on error.
function applyFaults(body) {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) return 'body must be a JSON object';
  for (const key of Object.keys(body)) {
    if (!['next', 'drop_percent', 'stall_ms'].includes(key)) return `unknown key ${key}`;
  }
  if ('next' in body) {
    if (!Array.isArray(body.next)) return 'next must be an array of shapes';
    for (const s of body.next) {
      if (typeof s !== 'string' || !ALL_SHAPES.has(s)) return `unknown shape ${JSON.stringify(s)}`;
    }
  }
  if ('drop_percent' in body) {
    const n = body.drop_percent;
    if (typeof n !== 'number' || !Number.isFinite(n) || n < 0 || n > 100) return 'drop_percent must be a number 0..100';
  }
  if ('stall_ms' in body) {
    const n = body.stall_ms;
    if (!Number.isInteger(n) || n < 0 || n > MAX_STALL_MS) return `stall_ms must be an integer 0..${MAX_STALL_MS}`;
  }
  if ('next' in body) faults.next = [...body.next];
  if ('drop_percent' in body) faults.drop_percent = body.drop_percent;
  if ('stall_ms' in body) faults.stall_ms = body.stall_ms;
  return null;
}

const ROUTES = {
  '/_target/stats': ['GET'],
  '/_target/faults': ['GET', 'POST'],
  '/_target/reset': ['POST'],
};

const control = http.createServer((req, res) => {
  const chunks = [];
  let size = 0;
  let tooBig = false;
  req.on('data', chunk => {
    size += chunk.length;
    if (size > SIZE_LIMIT) { tooBig = true; return; }
    chunks.push(chunk);
  });
  req.on('error', err => log('control request error:', err.message));
  req.on('end', () => {
    try {
      const path = (req.url || '/').split('?')[0];
      const allowed = ROUTES[path];
      if (!allowed) return sendJson(res, 404, { error: 'not found', path });
      if (!allowed.includes(req.method)) {
        return sendJson(res, 405, { error: 'method not allowed', allow: allowed }, { Allow: allowed.join(', ') });
      }
      if (tooBig) return sendJson(res, 413, { error: 'body too large' });
      if (path === '/_target/stats') return sendJson(res, 200, statsView());
      if (path === '/_target/reset') {
        resetAll();
        return sendJson(res, 200, { reset: true });
      }
      // /_target/faults
      if (req.method === 'GET') return sendJson(res, 200, faultsView());
      let body;
      const raw = Buffer.concat(chunks).toString('utf8');
      try {
        body = raw.trim() === '' ? {} : JSON.parse(raw);
      } catch {
        return sendJson(res, 400, { error: 'bad JSON' });
      }
      const problem = applyFaults(body);
      if (problem) return sendJson(res, 400, { error: problem });
      return sendJson(res, 200, faultsView());
    } catch (err) {
      log('control request failed:', err);
      try { sendJson(res, 500, { error: 'internal error' }); } catch { /* ignore */ }
      return undefined;
    }
  });
});
control.on('clientError', (err, socket) => {
  try { socket.end('HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n'); } catch { /* ignore */ }
});
control.on('error', err => log('control error:', err.message));

// ---------------------------------------------------------------- start / stop

function listen(server, port) {
  return new Promise((resolve, reject) => {
    const onError = err => reject(err);
    server.once('error', onError);
    server.listen(port, opts.host, () => {
      server.removeListener('error', onError);
      resolve(server.address().port);
    });
  });
}

try {
  smtpPort = await listen(smtp.server, opts.smtpPort);
  const controlPort = await listen(control, opts.port);
  process.stdout.write(`PORT ${controlPort}\n`);
} catch (err) {
  log('cannot listen:', err.message);
  process.exit(1);
}

let stopping = false;
function stop() {
  if (stopping) return;
  stopping = true;
  try { control.close(); } catch { /* ignore */ }
  try { smtp.server.close(); } catch { /* ignore */ }
  for (const socket of socketsByPort.values()) {
    try { socket.destroy(); } catch { /* ignore */ }
  }
  // let stdout/stderr drain, then leave
  setImmediate(() => process.exit(0));
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
