// A webhook endpoint on loopback for bench/relay_bench (--receiver node), Node.js's own
// http module only: it shares no code with Waystone's HTTP client or server, so what it
// counts is what arrived. The same routes as bench/loopback_receiver.py, which is
// slower (a thread per connection under Python's lock) and bounds what the relay can
// show; this one answers on one event loop.
//
// POST /hook      records the CloudEvent (its id, and its subject in arrival order); 204
// POST /raw       counted only (the sink's raw rate, no store behind it); 204
// GET  /count     {"hook": requests, "unique": distinct ids, "raw": requests}
// GET  /stats     /count's fields and "out_of_order": instances whose ids arrived in
//                 another order than POST /expect said, "missing": ids not yet arrived
// POST /expect    {"subject": [id, ...]}: the committed order per instance
//
// Prints the port it listens on as its first line of output.

import http from 'node:http';

let hookRequests = 0;
let rawRequests = 0;
const ids = new Set();
const arrivals = new Map();  // subject -> [id, ...] in arrival order, duplicates dropped
let expected = {};

function reply(res, status, body) {
  const text = body === undefined ? '' : JSON.stringify(body);
  const headers = {'Content-Length': Buffer.byteLength(text)};
  if (text) headers['Content-Type'] = 'application/json';
  res.writeHead(status, headers);
  res.end(text);
}

function stats(withOrder) {
  const counts = {hook: hookRequests, unique: ids.size, raw: rawRequests};
  if (!withOrder) return counts;
  let outOfOrder = 0;
  let missing = 0;
  for (const [subject, want] of Object.entries(expected)) {
    const got = arrivals.get(subject) || [];
    if (got.some((id, i) => id !== want[i])) outOfOrder += 1;
    if (got.length < want.length) missing += want.length - got.length;
  }
  return {...counts, out_of_order: outOfOrder, missing};
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (chunk) => chunks.push(chunk));
  req.on('end', () => {
    if (req.method === 'GET') {
      if (req.url === '/count') return reply(res, 200, stats(false));
      if (req.url === '/stats') return reply(res, 200, stats(true));
      return reply(res, 404);
    }
    const body = Buffer.concat(chunks).toString('utf8');
    if (req.url === '/raw') {
      rawRequests += 1;
      return reply(res, 204);
    }
    if (req.url === '/expect') {
      expected = JSON.parse(body);
      return reply(res, 204);
    }
    if (req.url !== '/hook') return reply(res, 404);
    let event;
    try {
      event = JSON.parse(body);
    } catch {
      return reply(res, 400);
    }
    if (event.id !== req.headers['webhook-id']) return reply(res, 400);
    hookRequests += 1;
    if (!ids.has(event.id)) {
      ids.add(event.id);
      const subject = event.subject || '';
      if (!arrivals.has(subject)) arrivals.set(subject, []);
      arrivals.get(subject).push(event.id);
    }
    return reply(res, 204);
  });
});
server.keepAliveTimeout = 5000;
server.listen({host: '127.0.0.1', port: 0, backlog: 1024}, () => {
  process.stdout.write(`${server.address().port}\n`);
});
process.on('SIGTERM', () => process.exit(0));
