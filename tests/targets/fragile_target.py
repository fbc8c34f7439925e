#!/usr/bin/env python3
"""Independent "fragile ERP" test target.

A small in-memory order service that can be told to be healthy ("ok"),
failing ("fail") or slow ("slow"), and that measures what it RECEIVED:
how many business requests arrived, when (monotonic clock), how many were
being handled at the same moment, and the highest number of arrivals inside
any sliding 1-second window.  It is the counterpart for testing a client's
protection of a struggling target (rate limit, concurrency cap, circuit
breaker, operator pause).

It is self-contained on purpose: it shares no code or assumptions with the
engine it is used to test.  Python 3.11 standard library only
(http.server.ThreadingHTTPServer, one daemon thread per connection, every
piece of shared state under one lock).

Usage:
    python3 fragile_target.py [--host 127.0.0.1] [--port 0] [--service-ms 50]

Once listening it prints exactly one line ``PORT <n>`` (flushed) to stdout,
then serves until SIGTERM or SIGINT and exits with status 0.
"""

import argparse
import ipaddress
import json
import os
import signal
import socket
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

MAX_BODY = 1024 * 1024          # bytes
IDLE_TIMEOUT = 60.0             # seconds a keep-alive connection may idle
MAX_MS = 600_000                # upper bound for every *_ms setting
ARRIVALS_CAP = 10_000           # arrival times kept in stats["arrivals"]
RATE_WINDOW_S = 5.0             # window behind stats["rate"]
BURST_WINDOW_S = 1.0            # window behind stats["max_per_second_1s"]
MAX_MARKS = 1000
MAX_LABEL = 200
MODES = ("ok", "fail", "slow")
CONFIG_KEYS = ("mode", "fail_status", "slow_ms", "service_ms")

BUSINESS_PATH = "/erp/orders"
BUSINESS_ALLOW = "GET, POST"
CONTROL_PREFIX = "/_target/"
CONTROL_ROUTES = {            # path -> allowed methods
    "/_target/stats": ("GET",),
    "/_target/config": ("GET", "POST"),
    "/_target/reset": ("POST",),
    "/_target/mark": ("POST",),
}


class BadRequest(Exception):
    """Client error in a request body (answered 400, nothing changes)."""


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def validate_config(patch):
    """Return a validated copy of a config patch or raise BadRequest."""
    if not isinstance(patch, dict):
        raise BadRequest("config must be a JSON object")
    unknown = sorted(set(patch) - set(CONFIG_KEYS))
    if unknown:
        raise BadRequest("unknown config key(s): " + ", ".join(unknown))
    out = {}
    if "mode" in patch:
        if patch["mode"] not in MODES:
            raise BadRequest("mode must be one of " + ", ".join(MODES))
        out["mode"] = patch["mode"]
    if "fail_status" in patch:
        v = patch["fail_status"]
        if not _is_int(v) or not 400 <= v <= 599:
            raise BadRequest("fail_status must be an integer 400..599")
        out["fail_status"] = v
    for key in ("slow_ms", "service_ms"):
        if key in patch:
            v = patch[key]
            if not _is_int(v) or not 0 <= v <= MAX_MS:
                raise BadRequest("%s must be an integer 0..%d" % (key, MAX_MS))
            out[key] = v
    return out


class State:
    """All shared state.  Every access holds self.lock."""

    def __init__(self, service_ms):
        self.lock = threading.Lock()
        self.config = {"mode": "ok", "fail_status": 503, "slow_ms": 0,
                       "service_ms": service_ms}
        self.next_order = 0     # order numbers are never reused, even after reset
        self.in_flight = 0      # live gauge, not cleared by reset
        self.epoch = 0
        self._clear()

    def _clear(self):
        self.epoch += 1
        self.t0 = time.monotonic()
        self.orders = []                    # [{"id", "ref"}], oldest first
        self.requests = 0
        self.failed = 0
        self.by_mode = {m: 0 for m in MODES}
        self.by_status = {}
        self.arrivals = deque(maxlen=ARRIVALS_CAP)   # rounded relative seconds
        self.rate_times = deque()           # monotonic times, last RATE_WINDOW_S
        self.burst_times = deque()          # monotonic times, last BURST_WINDOW_S
        self.max_per_second_1s = 0
        self.in_flight_max = self.in_flight
        self.marks = []                     # [{"label", "t"}]
        self.after = {}                     # label -> arrivals since latest mark

    # -- business side --------------------------------------------------
    def arrive(self):
        """Record one business request; return (epoch, config snapshot)."""
        with self.lock:
            now = time.monotonic()
            self.requests += 1
            self.by_mode[self.config["mode"]] += 1
            self.arrivals.append(round(now - self.t0, 3))
            self.rate_times.append(now)
            while self.rate_times and self.rate_times[0] <= now - RATE_WINDOW_S:
                self.rate_times.popleft()
            # Window (now - 1 s, now]: the busiest 1-s window always ends
            # on an arrival, so checking at each arrival finds the maximum.
            self.burst_times.append(now)
            while self.burst_times[0] <= now - BURST_WINDOW_S:
                self.burst_times.popleft()
            if len(self.burst_times) > self.max_per_second_1s:
                self.max_per_second_1s = len(self.burst_times)
            for label in self.after:
                self.after[label] += 1
            self.in_flight += 1
            if self.in_flight > self.in_flight_max:
                self.in_flight_max = self.in_flight
            return self.epoch, dict(self.config)

    def depart(self):
        with self.lock:
            self.in_flight -= 1

    def answered(self, epoch, status, failed=False):
        with self.lock:
            if epoch != self.epoch:
                return
            key = str(status)
            self.by_status[key] = self.by_status.get(key, 0) + 1
            if failed:
                self.failed += 1

    def commit(self, epoch, ref):
        with self.lock:
            self.next_order += 1
            order = {"id": "ORD-%d" % self.next_order, "ref": ref}
            if epoch == self.epoch:   # arrived before a reset: not stored
                self.orders.append(order)
            return dict(order)

    def find(self, ref):
        with self.lock:
            return [dict(o) for o in self.orders if o["ref"] == ref]

    # -- control side ---------------------------------------------------
    def get_config(self):
        with self.lock:
            return dict(self.config)

    def set_config(self, patch):
        clean = validate_config(patch)
        with self.lock:
            self.config.update(clean)
            return dict(self.config)

    def reset(self):
        with self.lock:
            self._clear()

    def mark(self, label):
        with self.lock:
            if len(self.marks) >= MAX_MARKS:
                raise BadRequest("too many marks (max %d); reset first" % MAX_MARKS)
            entry = {"label": label,
                     "t": round(time.monotonic() - self.t0, 3)}
            self.marks.append(entry)
            self.after[label] = 0
            return dict(entry)

    def stats(self):
        with self.lock:
            now = time.monotonic()
            elapsed = now - self.t0
            window = min(RATE_WINDOW_S, elapsed)
            while self.rate_times and self.rate_times[0] <= now - window:
                self.rate_times.popleft()
            per_second = len(self.rate_times) / window if window > 0 else 0.0
            return {
                "requests": self.requests,
                "orders": len(self.orders),
                "failed": self.failed,
                "in_flight": self.in_flight,
                "in_flight_max": self.in_flight_max,
                "by_mode": dict(self.by_mode),
                "by_status": dict(self.by_status),
                "rate": {"window_s": round(window, 3),
                         "per_second": round(per_second, 3)},
                "max_per_second_1s": self.max_per_second_1s,
                "marks": [dict(m) for m in self.marks],
                "arrivals_after": dict(self.after),
                "now": round(elapsed, 3),
                "config": dict(self.config),
                "arrivals": list(self.arrivals),
            }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fragile-target/1"
    sys_version = ""
    timeout = IDLE_TIMEOUT
    state = None   # set on the class by main()

    # Any method name (GET, POST, PUT, HEAD, FOO, ...) goes to _dispatch, so
    # a known path with a wrong method gets 405 instead of http.server's 501.
    def __getattr__(self, name):
        if name.startswith("do_"):
            return self._dispatch
        raise AttributeError(name)

    def log_message(self, fmt, *args):   # keep stderr quiet
        pass

    # -- responses ------------------------------------------------------
    def _send(self, status, obj, extra=()):
        body = json.dumps(obj).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for name, value in extra:
                self.send_header(name, value)
            self.send_header("Connection",
                             "close" if self.close_connection else "keep-alive")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            self.wfile.flush()
        except OSError:                  # client gone (e.g. it timed out)
            self.close_connection = True

    def send_error(self, code, message=None, explain=None):
        # http.server's own errors (bad request line, 414, 431, 505, ...).
        self.close_connection = True
        self._send(code, {"error": message or self.responses.get(code, ("error",))[0]})

    # -- request body -----------------------------------------------------
    def _read_body(self):
        """Read a Content-Length body.  Returns bytes, or None after having
        answered a framing error (the connection is then closed)."""
        if self.headers.get("Transfer-Encoding") is not None:
            self.close_connection = True
            self._send(400, {"error": "Transfer-Encoding not supported; use Content-Length"})
            return None
        values = self.headers.get_all("Content-Length") or []
        if not values:
            return b""
        if len(set(v.strip() for v in values)) != 1 or not values[0].strip().isdigit():
            self.close_connection = True
            self._send(400, {"error": "bad Content-Length"})
            return None
        length = int(values[0].strip())
        if length > MAX_BODY:
            self.close_connection = True
            self._send(413, {"error": "body over 1 MiB"})
            return None
        try:
            data = self.rfile.read(length)
        except OSError:
            data = b""
        if len(data) != length:
            self.close_connection = True
            return None
        return data

    @staticmethod
    def _json(body):
        try:
            return json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise BadRequest("bad JSON")

    # -- routing ----------------------------------------------------------
    def _dispatch(self):
        body = self._read_body()
        if body is None:
            return
        parts = urlsplit(self.path)
        path = parts.path
        if path.startswith(CONTROL_PREFIX) or path == CONTROL_PREFIX.rstrip("/"):
            self._control(path, body)
        else:
            self._business(path, parts.query, body)

    def _business(self, path, query, body):
        st = self.state
        epoch, cfg = st.arrive()
        try:
            status, obj, failed, extra = self._business_answer(path, query, body, epoch, cfg)
        finally:
            # Leave in_flight BEFORE the answer is written: a client with a
            # concurrency cap of N may send its next request as soon as it
            # reads this answer, and must not be seen as the (N+1)th.
            st.depart()
        st.answered(epoch, status, failed)
        self._send(status, obj, extra)

    def _business_answer(self, path, query, body, epoch, cfg):
        """Return (status, body, failed, extra_headers)."""
        if path != BUSINESS_PATH:
            return 404, {"error": "not found"}, False, ()
        if self.command not in ("GET", "POST"):
            return 405, {"error": "method not allowed"}, False, (("Allow", BUSINESS_ALLOW),)
        if cfg["mode"] == "fail":
            return cfg["fail_status"], {"error": "unavailable"}, True, ()
        if cfg["mode"] == "slow" and cfg["slow_ms"]:
            time.sleep(cfg["slow_ms"] / 1000.0)
        if self.command == "GET":
            refs = parse_qs(query, keep_blank_values=True).get("ref")
            if not refs:
                return 400, {"error": "ref query parameter required"}, False, ()
            return 200, {"items": self.state.find(refs[0])}, False, ()
        try:
            doc = self._json(body)
        except BadRequest as e:
            return 400, {"error": str(e)}, False, ()
        if not isinstance(doc, dict):
            return 400, {"error": "body must be a JSON object"}, False, ()
        if not isinstance(doc.get("ref"), str):
            return 422, {"error": "ref required"}, False, ()
        if cfg["service_ms"]:
            time.sleep(cfg["service_ms"] / 1000.0)
        return 201, self.state.commit(epoch, doc["ref"]), False, ()

    def _control(self, path, body):
        methods = CONTROL_ROUTES.get(path)
        if methods is None:
            return self._send(404, {"error": "not found"})
        if self.command not in methods:
            return self._send(405, {"error": "method not allowed"},
                              (("Allow", ", ".join(methods)),))
        st = self.state
        try:
            if path == "/_target/stats":
                return self._send(200, st.stats())
            if path == "/_target/config":
                if self.command == "GET":
                    return self._send(200, st.get_config())
                return self._send(200, st.set_config(self._json(body)))
            if path == "/_target/reset":
                if body.strip():
                    self._json(body)        # a body is optional but must be JSON
                st.reset()
                return self._send(200, {"reset": True, "config": st.get_config()})
            if path == "/_target/mark":
                doc = self._json(body)
                if not isinstance(doc, dict) or set(doc) != {"label"}:
                    raise BadRequest('body must be {"label": str}')
                label = doc["label"]
                if not isinstance(label, str) or not label or len(label) > MAX_LABEL:
                    raise BadRequest("label must be a non-empty string of at most %d chars"
                                     % MAX_LABEL)
                return self._send(200, st.mark(label))
        except BadRequest as e:
            return self._send(400, {"error": str(e)})


def loopback_address(host):
    """(address family, literal address) for a loopback host, else exit 2."""
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        sys.exit("fragile_target: --host must be a loopback IP address or localhost")
    if not ip.is_loopback:
        sys.exit("fragile_target: refusing to bind non-loopback address %s" % host)
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    return family, str(ip)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Independent fragile ERP test target")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--service-ms", type=int, default=50,
                    help="time a POST /erp/orders is held before it commits (default 50)")
    args = ap.parse_args(argv)
    if not 0 <= args.service_ms <= MAX_MS:
        ap.error("--service-ms must be 0..%d" % MAX_MS)
    family, host = loopback_address(args.host)

    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    # Install handlers before announcing the port, so a SIGTERM right after
    # "PORT n" still exits cleanly with status 0.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    class Server(ThreadingHTTPServer):
        address_family = family
        daemon_threads = True
        block_on_close = False
        request_queue_size = 128     # listen backlog: bursts of parallel connects

    Handler.state = State(args.service_ms)
    server = Server((host, args.port), Handler)
    sys.stdout.write("PORT %d\n" % server.server_address[1])
    sys.stdout.flush()
    loop = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                            daemon=True)
    loop.start()
    while not stop.wait(0.5):
        pass
    server.shutdown()
    server.server_close()
    sys.stdout.flush()
    sys.stderr.flush()
    # Connection threads are daemons (some may be sleeping in a hold).
    os._exit(0)


if __name__ == "__main__":
    main()
