#!/usr/bin/env python3
"""A webhook endpoint on loopback for bench/relay_bench, standard library only: it shares
no code with Waystone's HTTP client or server, so what it counts is what arrived.

POST /hook      records the CloudEvent (its id, and its subject in arrival order); 204
POST /raw       counted only (the sink's raw rate, no store behind it); 204
GET  /count     {"hook": requests, "unique": distinct ids, "raw": requests}
GET  /stats     {"hook": requests, "unique": distinct ids, "raw": requests,
                 "out_of_order": instances whose ids arrived in another order than
                 the bench's expected order (POST /expect first), "missing": ...}
POST /expect    {"subject": [id, ...]}: the committed order per instance

Prints the port it listens on as its first line of output.
"""

import http.server
import json
import sys
import threading

lock = threading.Lock()
hook_requests = 0
raw_requests = 0
ids = set()
arrivals = {}  # subject -> [id, ...] in arrival order, duplicates dropped
expected = {}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as webhook receivers commonly allow

    def log_message(self, *args):
        pass

    def reply(self, status, body=b""):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        if body:
            self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        global hook_requests, raw_requests, expected
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        if self.path == "/raw":
            with lock:
                raw_requests += 1
            return self.reply(204)
        if self.path == "/expect":
            with lock:
                expected = json.loads(body)
            return self.reply(204)
        if self.path != "/hook":
            return self.reply(404)
        event = json.loads(body)
        if event.get("id") != self.headers.get("webhook-id"):
            return self.reply(400)
        with lock:
            hook_requests += 1
            if event["id"] not in ids:
                ids.add(event["id"])
                arrivals.setdefault(event.get("subject", ""), []).append(event["id"])
        self.reply(204)

    def do_GET(self):
        if self.path == "/count":
            with lock:
                counts = {"hook": hook_requests, "unique": len(ids), "raw": raw_requests}
            return self.reply(200, json.dumps(counts).encode())
        if self.path != "/stats":
            return self.reply(404)
        with lock:
            out_of_order = 0
            missing = 0
            for subject, want in expected.items():
                got = arrivals.get(subject, [])
                if got != want[: len(got)]:
                    out_of_order += 1
                if len(got) < len(want):
                    missing += len(want) - len(got)
            stats = {"hook": hook_requests, "unique": len(ids), "raw": raw_requests,
                     "out_of_order": out_of_order, "missing": missing}
        self.reply(200, json.dumps(stats).encode())


class Server(http.server.ThreadingHTTPServer):
    # socketserver listens with a backlog of 5: connections beyond it wait for a SYN
    # retransmit (1 s), which would measure the backlog, not the relay.
    request_queue_size = 1024


def main():
    server = Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
