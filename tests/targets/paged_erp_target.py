#!/usr/bin/env python3
"""Independent HTTP test target: a "paged ERP".

It models an ERP whose API reports errors in the body with HTTP 200, whose
order search is paginated and loose (substring match on ref), and whose search
index lags behind writes.  Create requests can be given queued faults.

Self-contained (Python 3.11 standard library only); it shares no code or
assumptions with the engine it is used to test.

Usage:
    python3 paged_erp_target.py [--host 127.0.0.1] [--port 0]

Once listening it prints exactly one line ``PORT <n>`` to stdout and serves
until SIGTERM or SIGINT, then exits with status 0.  Loopback addresses only.

See README.md next to this file (section "paged_erp_target") for the routes,
fault shapes and the stats format.
"""

import argparse
import ipaddress
import json
import os
import re
import signal
import socket
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

MAX_BODY = 1024 * 1024
V1_DEFAULT_PER_PAGE = 2
V1_MAX_PER_PAGE = 50
V2_PAGE_SIZE = 2
SHAPES = ("ok", "rate_limit", "busy_503", "lost")
CANCEL_RE = re.compile(r"^/api/orders/([^/]+)/cancel$")

# Known paths -> allowed methods (used for 404 vs 405).
ROUTES = {
    "/api/orders": ("GET", "POST"),
    "/api/v2/orders": ("GET",),
    "/_target/settings": ("GET", "POST"),
    "/_target/seed": ("POST",),
    "/_target/stats": ("GET",),
}


class BadRequest(Exception):
    pass


class State:
    """All mutable state; every access holds self.lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        self.dedupe = False
        self.search_lag_ms = 0
        self.create_faults = []
        self.orders = []            # dicts: order_no, ref, state, seeded, created, amount
        self.by_no = {}
        self.next_no = 1
        self.creates_received = 0
        self.api_orders = 0
        self.seeded = 0
        self.searches = {"v1": 0, "v2": 0}
        self.pages_served = 0
        self.cancels = {}
        self.requests = []

    def settings(self):
        return {"dedupe": self.dedupe, "search_lag_ms": self.search_lag_ms,
                "create_faults": list(self.create_faults)}

    def add_order(self, ref, state="open", seeded=False, amount=None):
        order = {"order_no": "SO-%d" % self.next_no, "ref": ref, "state": state,
                 "seeded": seeded, "created": time.monotonic(), "amount": amount}
        self.next_no += 1
        self.orders.append(order)
        self.by_no[order["order_no"]] = order
        return order

    def search(self, q):
        """Orders whose ref contains q and that the (lagging) index can see."""
        now = time.monotonic()
        lag = self.search_lag_ms / 1000.0
        return [{"order_no": o["order_no"], "ref": o["ref"], "state": o["state"]}
                for o in self.orders
                if q in o["ref"] and (o["seeded"] or now - o["created"] >= lag)]

    def stats(self):
        by_ref = {}
        for o in self.orders:
            by_ref[o["ref"]] = by_ref.get(o["ref"], 0) + 1
        return {
            "creates_received": self.creates_received,
            "orders": self.api_orders,
            "seeded": self.seeded,
            "orders_by_ref": by_ref,
            "duplicate_orders": sum(max(0, n - 1) for n in by_ref.values()),
            "searches": dict(self.searches),
            "pages_served": self.pages_served,
            "cancels": dict(self.cancels),
            "requests": list(self.requests),
        }


STATE = State()


def error(code, message, **extra):
    body = {"status": "ERROR", "code": code, "message": message}
    body.update(extra)
    return body


def first_param(query, name):
    values = query.get(name)
    return values[0] if values else None


def int_param(query, name, default, lo, hi=None):
    raw = first_param(query, name)
    if raw is None:
        return default
    if not re.fullmatch(r"[0-9]+", raw):
        raise BadRequest("%s must be an integer" % name)
    value = int(raw)
    if value < lo or (hi is not None and value > hi):
        raise BadRequest("%s out of range" % name)
    return value


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "paged-erp-target/1"

    def log_message(self, fmt, *args):  # keep stderr quiet
        pass

    # ---- plumbing -------------------------------------------------------

    def send_json(self, status, obj, extra_headers=()):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in extra_headers:
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def send_error(self, code, message=None, explain=None):
        # Replaces http.server's HTML error page (bad request line, etc.).
        # A malformed request line leaves request_version at "HTTP/0.9",
        # which would suppress the status line; always answer as HTTP/1.1.
        self.request_version = "HTTP/1.1"
        self.close_connection = True
        try:
            self.send_json(code, error("HTTP_%d" % code, message or "error"))
        except OSError:
            pass

    def read_body(self):
        if "Transfer-Encoding" in self.headers:
            self.close_connection = True
            raise BadRequest("Transfer-Encoding not supported; use Content-Length")
        raw = self.headers.get("Content-Length", "0").strip()
        if not re.fullmatch(r"[0-9]+", raw):
            self.close_connection = True
            raise BadRequest("bad Content-Length")
        length = int(raw)
        if length > MAX_BODY:
            self.close_connection = True
            raise BadRequest("body too large")
        return self.rfile.read(length)

    def do_GET(self):
        self.dispatch()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_GET

    def dispatch(self):
        split = urlsplit(self.path)
        path, query_raw = split.path, split.query
        query = parse_qs(query_raw, keep_blank_values=True)
        control = path.startswith("/_target/")
        try:
            body = self.read_body()
        except BadRequest as e:
            self.send_json(400, error("BAD_REQUEST", str(e)))
            return
        m = CANCEL_RE.match(path)
        allowed = ("POST",) if m else ROUTES.get(path)
        entry = None
        if not control:
            entry = {"method": self.command, "path": path, "query": query_raw,
                     "idempotency_key": self.headers.get("Idempotency-Key"),
                     "shape": None}
            with STATE.lock:
                STATE.requests.append(entry)
        if allowed is None:
            self.send_json(404, error("NO_ROUTE", "no such path"))
            return
        if self.command not in allowed:
            self.send_json(405, error("METHOD_NOT_ALLOWED", "method not allowed"),
                           [("Allow", ", ".join(allowed))])
            return
        try:
            if m:
                self.cancel(unquote(m.group(1)))
            elif path == "/api/orders" and self.command == "POST":
                self.create(body, entry)
            elif path == "/api/orders":
                self.search_v1(query)
            elif path == "/api/v2/orders":
                self.search_v2(query)
            elif path == "/_target/settings":
                self.settings(body)
            elif path == "/_target/seed":
                self.seed(body)
            else:
                with STATE.lock:
                    stats = STATE.stats()
                self.send_json(200, stats)
        except BadRequest as e:
            self.send_json(400, error("BAD_REQUEST", str(e)))

    # ---- business routes ------------------------------------------------

    def create(self, body, entry):
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        with STATE.lock:
            STATE.creates_received += 1
            shape = STATE.create_faults.pop(0) if STATE.create_faults else None
            entry["shape"] = shape
            status, answer, headers = 200, None, ()
            if shape == "rate_limit":
                answer = error("RATE_LIMIT", "try later")
            elif shape == "busy_503":
                status, headers = 503, [("Retry-After", "0")]
                answer = {"status": "ERROR", "code": "BUSY"}
            elif not isinstance(doc, dict) or not isinstance(doc.get("ref"), str):
                answer = error("VALIDATION", "body must be a JSON object with a string ref")
            else:
                ref = doc["ref"]
                existing = next((o for o in STATE.orders if o["ref"] == ref), None)
                if STATE.dedupe and existing is not None:
                    answer = error("DUPLICATE", "order with ref %s exists" % ref,
                                   data={"order_no": existing["order_no"]})
                else:
                    order = STATE.add_order(ref, amount=doc.get("amount"))
                    STATE.api_orders += 1
                    answer = {"status": "OK", "data": {
                        "order_no": order["order_no"], "ref": ref,
                        "amount": order["amount"]}}
        if shape == "lost":
            # The work is done (or refused) but no response byte is sent.
            self.close_connection = True
            return
        self.send_json(status, answer, headers)

    def cancel(self, order_no):
        with STATE.lock:
            order = STATE.by_no.get(order_no)
            if order is not None:
                order["state"] = "cancelled"
                STATE.cancels[order_no] = STATE.cancels.get(order_no, 0) + 1
        if order is None:
            self.send_json(200, error("NOT_FOUND", "no order %s" % order_no))
        else:
            self.send_json(200, {"status": "OK", "data": {
                "order_no": order_no, "state": "cancelled"}})

    def search_v1(self, query):
        with STATE.lock:
            STATE.searches["v1"] += 1
        q = first_param(query, "q")
        if q is None:
            raise BadRequest("q required")
        page = int_param(query, "page", 1, 1)
        per_page = int_param(query, "per_page", V1_DEFAULT_PER_PAGE, 1, V1_MAX_PER_PAGE)
        with STATE.lock:
            hits = STATE.search(q)
            STATE.pages_served += 1
        start = (page - 1) * per_page
        nxt = None
        if start + per_page < len(hits):
            nxt = "/api/orders?" + urlencode({"q": q, "page": page + 1, "per_page": per_page})
        self.send_json(200, {"status": "OK", "data": hits[start:start + per_page],
                             "page": page, "next": nxt})

    def search_v2(self, query):
        with STATE.lock:
            STATE.searches["v2"] += 1
        q = first_param(query, "q")
        if q is None:
            raise BadRequest("q required")
        page = int_param(query, "page", 1, 1)
        with STATE.lock:
            hits = STATE.search(q)
            STATE.pages_served += 1
        start = (page - 1) * V2_PAGE_SIZE
        self.send_json(200, {"items": hits[start:start + V2_PAGE_SIZE]})

    # ---- control routes -------------------------------------------------

    def settings(self, body):
        if self.command == "GET":
            with STATE.lock:
                current = STATE.settings()
            self.send_json(200, current)
            return
        doc = parse_object(body)
        for key, value in doc.items():
            if key in ("dedupe", "reset"):
                ok = isinstance(value, bool)
            elif key == "search_lag_ms":
                ok = type(value) is int and value >= 0
            elif key == "create_faults":
                ok = isinstance(value, list) and all(
                    isinstance(s, str) and s in SHAPES for s in value)
            else:
                raise BadRequest("unknown setting %r" % key)
            if not ok:
                raise BadRequest("bad value for %s" % key)
        with STATE.lock:
            if doc.get("reset"):
                STATE.reset()
            if "dedupe" in doc:
                STATE.dedupe = doc["dedupe"]
            if "search_lag_ms" in doc:
                STATE.search_lag_ms = doc["search_lag_ms"]
            if "create_faults" in doc:
                STATE.create_faults = list(doc["create_faults"])
            current = STATE.settings()
        self.send_json(200, current)

    def seed(self, body):
        doc = parse_object(body)
        orders = doc.get("orders")
        if set(doc) != {"orders"} or not isinstance(orders, list):
            raise BadRequest('expected {"orders": [...]}')
        for o in orders:
            if (not isinstance(o, dict) or not isinstance(o.get("ref"), str)
                    or not set(o) <= {"ref", "state"}
                    or not isinstance(o.get("state", ""), str)):
                raise BadRequest("each order needs a string ref and optional string state")
        with STATE.lock:
            made = [STATE.add_order(o["ref"], o.get("state", "open"), seeded=True)
                    for o in orders]
            STATE.seeded += len(made)
        self.send_json(200, {"status": "OK", "data": [
            {"order_no": o["order_no"], "ref": o["ref"], "state": o["state"]} for o in made]})


def parse_object(body):
    try:
        doc = json.loads(body)
    except ValueError:
        raise BadRequest("body is not JSON")
    if not isinstance(doc, dict):
        raise BadRequest("body must be a JSON object")
    return doc


class _Stop(BaseException):
    """Raised from the signal handler to leave serve_forever()."""


def _stop(signum, frame):
    raise _Stop()


def main(argv=None):
    ap = argparse.ArgumentParser(description="Independent paged ERP test target")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)
    host = "127.0.0.1" if args.host == "localhost" else args.host
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise SystemExit("paged_erp_target: --host must be a loopback IP address")
    if not ip.is_loopback:
        raise SystemExit("paged_erp_target: refusing non-loopback address %s" % host)

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        daemon_threads = True

        def server_bind(self):  # skip HTTPServer's reverse DNS lookup
            socketserver.TCPServer.server_bind(self)
            self.server_name, self.server_port = host, self.server_address[1]

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    server = Server((host, args.port), Handler)
    try:
        sys.stdout.write("PORT %d\n" % server.server_address[1])
        sys.stdout.flush()
        server.serve_forever()
    except _Stop:
        pass
    finally:
        server.server_close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
