#!/usr/bin/env python3
"""Independent HTTP/1.1 test target: a tiny in-memory "ERP" + "notify" service
with per-route fault injection.

This file is deliberately self-contained: it shares no code or assumptions with
the workflow engine it is used to test.  It is written against RFC 9112
(HTTP/1.1 message syntax) using only the standard library and raw sockets, so
that every byte written and every connection teardown (FIN vs. RST) is under
explicit control.  (http.server is not used on purpose.)

Usage:
    python3 erp_target.py [--host 127.0.0.1] [--port 0] [--seed N]

Once listening it prints exactly one line ``PORT <n>`` to stdout and serves
until SIGTERM or SIGINT, then exits with status 0.

See README.md next to this file for routes, fault shapes and the stats format.
"""

import argparse
import ipaddress
import json
import os
import random
import re
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections import deque
from email.utils import formatdate
from urllib.parse import parse_qs, quote, unquote, urlsplit

# --------------------------------------------------------------------------
# Limits and constants
# --------------------------------------------------------------------------

MAX_HEAD = 64 * 1024          # request line + header section, incl. final CRLFCRLF
MAX_BODY = 1024 * 1024        # decoded request body
MAX_CHUNK_LINE = 4096         # one chunk-size line (size + extensions)
IDLE_TIMEOUT = 30.0           # seconds a connection may sit idle / stall mid-message
LINGER_DRAIN_SECONDS = 1.0    # how long a graceful close drains client input
LINGER_DRAIN_BYTES = 4 * MAX_BODY
DEFAULT_LATE_DELAY_MS = 2000

ROUTES = ("create_order", "find_orders", "get_order", "cancel_order", "send_message")

# Shapes that are decided *before* the business effect: the effect is never
# committed.  Every other shape lets the handler commit first and only then
# damages (or delays, or replaces) the response.  That ordering is the whole
# point of the target: it models a server that *did* the work but whose answer
# never reached the client intact, which is exactly the case a client's retry
# logic must handle without creating duplicates.
PRE_COMMIT_SHAPES = ("refuse_503", "reject_422_before")
STATUS_SHAPES = {"status_500": 500, "status_502": 502, "status_504": 504}
WIRE_SHAPES = ("close_before_bytes", "reset", "partial_status",
               "partial_headers", "partial_body", "late")
SHAPES = frozenset(("ok",) + PRE_COMMIT_SHAPES + tuple(STATUS_SHAPES) + WIRE_SHAPES)

REASONS = {
    100: "Continue", 200: "OK", 201: "Created", 400: "Bad Request",
    404: "Not Found", 405: "Method Not Allowed", 413: "Content Too Large",
    422: "Unprocessable Content", 431: "Request Header Fields Too Large",
    500: "Internal Server Error", 501: "Not Implemented", 502: "Bad Gateway",
    503: "Service Unavailable", 504: "Gateway Timeout",
    505: "HTTP Version Not Supported",
}

# RFC 9110 5.6.2 token characters (method and field names).
TCHAR = frozenset(b"!#$%&'*+-.^_`|~0123456789"
                  b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
HEXDIGITS = frozenset(b"0123456789abcdefABCDEF")
VERSION_RE = re.compile(r"HTTP/([0-9])\.([0-9])")


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------

class HttpError(Exception):
    """A request we must reject; the connection is closed after the answer
    because after a framing error we can no longer find the next request."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


class PeerClosed(Exception):
    """The client went away in the middle of a message: nobody to answer."""


# --------------------------------------------------------------------------
# Request reading (RFC 9112)
# --------------------------------------------------------------------------

class Reader:
    """Buffered reader over a socket.  Bytes beyond the current message stay
    in the buffer, so pipelined requests are served in order."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            return False
        self.buf += data
        return True

    def read_head(self):
        """Return the request line + header section (without the terminating
        empty line), or None if the client closed cleanly between requests."""
        while True:
            # RFC 9112 2.2: a server SHOULD ignore at least one empty line
            # received before the request-line.
            while self.buf[:2] == b"\r\n":
                del self.buf[:2]
            end = self.buf.find(b"\r\n\r\n")
            if end >= 0:
                if end + 4 > MAX_HEAD:
                    raise HttpError(431, "request head exceeds 64 KiB")
                head = bytes(self.buf[:end])
                del self.buf[:end + 4]
                return head
            if len(self.buf) >= MAX_HEAD:
                raise HttpError(431, "request head exceeds 64 KiB")
            if not self._fill():
                if self.buf and self.buf != b"\r":
                    raise PeerClosed()
                return None

    def read_line(self, limit):
        """One CRLF-terminated line (without the CRLF)."""
        while True:
            end = self.buf.find(b"\r\n")
            if end >= 0:
                if end > limit:
                    raise HttpError(400, "line too long")
                line = bytes(self.buf[:end])
                del self.buf[:end + 2]
                return line
            if len(self.buf) > limit + 1:
                raise HttpError(400, "line too long")
            if not self._fill():
                raise PeerClosed()

    def read_exact(self, n):
        while len(self.buf) < n:
            if not self._fill():
                raise PeerClosed()
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data


class Headers:
    """Ordered multi-map with case-insensitive names (RFC 9110 5.1)."""

    def __init__(self):
        self.items = []  # (lower-case name, value)

    def add(self, name, value):
        self.items.append((name.lower(), value))

    def get_all(self, name):
        name = name.lower()
        return [v for n, v in self.items if n == name]

    def get(self, name, default=None):
        values = self.get_all(name)
        return values[0] if values else default

    def tokens(self, name):
        """Comma-separated list header -> lower-case tokens."""
        out = []
        for value in self.get_all(name):
            out.extend(t.strip().lower() for t in value.split(",") if t.strip())
        return out


class Request:
    def __init__(self, method, target, version, headers):
        self.method = method
        self.target = target          # raw request-target, exactly as received
        self.version = version        # (major, minor)
        self.headers = headers
        self.body = b""
        self.path = ""
        self.segments = []            # path segments, each percent-decoded
        self.query = {}               # parse_qs() result
        key = headers.get("idempotency-key")
        # The raw field value (OWS stripped) is the key; quotes are NOT
        # removed.  An empty value counts as "no key".
        self.idempotency_key = key if key else None

    @property
    def keep_alive(self):
        # HTTP/1.0 always closes after the response (as specified for this
        # target, even if the client sent "Connection: keep-alive").
        if self.version < (1, 1):
            return False
        return "close" not in self.headers.tokens("connection")


def parse_head(head):
    """Parse request-line and field lines (RFC 9112 3 and 5)."""
    lines = head.split(b"\r\n")
    for line in lines:
        # A bare CR or LF inside a line is invalid (RFC 9112 2.2).
        if b"\r" in line or b"\n" in line:
            raise HttpError(400, "bare CR or LF in request head")
    parts = lines[0].decode("latin-1").split(" ")
    if len(parts) != 3:
        raise HttpError(400, "malformed request line")
    method, target, version = parts
    if not method or any(ord(c) not in TCHAR for c in method):
        raise HttpError(400, "malformed method")
    if not target or any(ord(c) <= 0x20 or ord(c) >= 0x7F for c in target):
        raise HttpError(400, "malformed request target")
    m = VERSION_RE.fullmatch(version)
    if not m:
        raise HttpError(400, "malformed HTTP version")
    ver = (int(m.group(1)), int(m.group(2)))
    if ver[0] != 1:
        raise HttpError(505, "only HTTP/1.x is supported")

    headers = Headers()
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t"):
            # obs-fold: RFC 9112 5.2 allows rejecting with 400.
            raise HttpError(400, "obsolete line folding")
        name, sep, value = line.partition(b":")
        # No whitespace is allowed between field name and colon (RFC 9112 5.1);
        # the token check rejects it.
        if not sep or not name or any(b not in TCHAR for b in name):
            raise HttpError(400, "malformed header field")
        value = value.strip(b" \t")
        if any(b == 0x7F or (b < 0x20 and b != 0x09) for b in value):
            raise HttpError(400, "invalid character in header value")
        headers.add(name.decode("ascii"), value.decode("latin-1"))

    req = Request(method, target, ver, headers)
    if ver >= (1, 1) and len(headers.get_all("host")) != 1:
        # RFC 9112 3.2: MUST answer 400 to an HTTP/1.1 request without Host
        # (or with more than one).
        raise HttpError(400, "exactly one Host header required")
    split_target(req)
    return req


def split_target(req):
    """Split path and query.  The path is percent-decoded per segment with
    urllib.parse.unquote (so %2F stays inside its segment); the query is
    parsed with parse_qs, which - as in HTML forms - decodes '+' as a space.
    A literal '+' must therefore be sent as %2B."""
    target = req.target
    if target.startswith("/"):
        path, _, query = target.partition("?")
    elif target.lower().startswith(("http://", "https://")):
        # absolute-form (RFC 9112 3.2.2): servers MUST accept it.
        parts = urlsplit(target)
        path, query = parts.path or "/", parts.query
    else:
        # asterisk-form / authority-form are not meaningful here.
        raise HttpError(400, "unsupported request-target form")
    req.path = path
    req.segments = [unquote(s) for s in path.split("/")[1:]]
    req.query = parse_qs(query, keep_blank_values=True)


def read_body(reader, req, sock):
    """Read the message body according to RFC 9112 6.1-6.3 and 7.1."""
    te = req.headers.get_all("transfer-encoding")
    cl = req.headers.get_all("content-length")
    expects_continue = (req.version >= (1, 1) and
                        "100-continue" in req.headers.tokens("expect"))

    if te:
        if cl:
            # Both present: classic request-smuggling vector; RFC 9112 6.1
            # lets us treat it as an error, which we do.
            raise HttpError(400, "both Transfer-Encoding and Content-Length")
        codings = req.headers.tokens("transfer-encoding")
        if not codings or codings[-1] != "chunked":
            # Request length cannot be determined: MUST be 400 (RFC 9112 6.3).
            raise HttpError(400, "final transfer coding is not chunked")
        if len(codings) > 1:
            raise HttpError(501, "only the chunked transfer coding is supported")
        if expects_continue:
            sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        req.body = read_chunked(reader)
        return

    length = 0
    if cl:
        values = [v.strip() for v in ",".join(cl).split(",")]
        if not all(v.isdigit() and v.isascii() for v in values) or len(set(values)) != 1:
            raise HttpError(400, "invalid Content-Length")
        length = int(values[0])
        if length > MAX_BODY:
            raise HttpError(413, "request body exceeds 1 MiB")
    if length and expects_continue:
        sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
    req.body = reader.read_exact(length) if length else b""


def read_chunked(reader):
    """chunked-body = *chunk last-chunk trailer-section CRLF (RFC 9112 7.1)."""
    body = bytearray()
    while True:
        line = reader.read_line(MAX_CHUNK_LINE)
        size_text = line.split(b";", 1)[0].rstrip(b" \t")   # drop extensions (BWS allowed)
        if not size_text or any(b not in HEXDIGITS for b in size_text):
            raise HttpError(400, "invalid chunk size")
        size = int(size_text, 16)
        if size == 0:
            break
        if len(body) + size > MAX_BODY:
            raise HttpError(413, "request body exceeds 1 MiB")
        body += reader.read_exact(size)
        if reader.read_exact(2) != b"\r\n":
            raise HttpError(400, "chunk data not followed by CRLF")
    # Trailer section: field lines until an empty line; read and discarded.
    trailer_bytes = 0
    while True:
        line = reader.read_line(MAX_HEAD)
        if not line:
            return bytes(body)
        trailer_bytes += len(line) + 2
        if trailer_bytes > MAX_HEAD:
            raise HttpError(431, "trailer section too large")
        name, sep, _ = line.partition(b":")
        if not sep or not name or any(b not in TCHAR for b in name):
            raise HttpError(400, "malformed trailer field")


# --------------------------------------------------------------------------
# Responses
# --------------------------------------------------------------------------

class Response:
    def __init__(self, status, body, headers=()):
        self.status = status
        self.body = body              # JSON-serialisable object
        self.headers = list(headers)  # extra (name, value) pairs
        self.encoded = None

    def encode(self):
        # Done while the state lock is held so the body is a snapshot.
        if self.encoded is None:
            self.encoded = json.dumps(self.body).encode("utf-8")
        return self.encoded

    def wire(self, keep_alive, head_only=False):
        """-> (list of head lines without CRLF, body bytes)."""
        body = self.encode()
        lines = [
            "HTTP/1.1 %d %s" % (self.status, REASONS.get(self.status, "Unknown")),
            "Content-Type: application/json",
            "Content-Length: %d" % len(body),
            "Connection: %s" % ("keep-alive" if keep_alive else "close"),
            "Date: %s" % formatdate(usegmt=True),
        ]
        lines.extend("%s: %s" % (n, v) for n, v in self.headers)
        return lines, (b"" if head_only else body)


def error(status, message, **extra):
    body = {"error": message}
    body.update(extra)
    return Response(status, body)


def parse_json_object(body):
    """-> (dict, None) or (None, error Response)."""
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None, error(400, "body is not valid JSON")
    if not isinstance(data, dict):
        return None, error(400, "body must be a JSON object")
    return data, None


# --------------------------------------------------------------------------
# State, business routes and fault settings
# --------------------------------------------------------------------------

class FaultSetting:
    def __init__(self, next_shapes=(), rate=0.0, shape=None, delay_ms=DEFAULT_LATE_DELAY_MS,
                 retry_after_s=0):
        self.next = deque(next_shapes)
        self.rate = rate
        self.shape = shape
        self.delay_ms = delay_ms
        self.retry_after_s = retry_after_s   # the Retry-After a refuse_503 carries

    def as_json(self):
        return {"next": list(self.next), "rate": self.rate,
                "shape": self.shape, "delay_ms": self.delay_ms,
                "retry_after_s": self.retry_after_s}


def validate_fault_setting(route, spec):
    """Turn one route's JSON settings into a FaultSetting or raise ValueError."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ValueError("settings for %s must be an object" % route)
    unknown = set(spec) - {"next", "rate", "shape", "delay_ms", "retry_after_s"}
    if unknown:
        raise ValueError("unknown keys for %s: %s" % (route, sorted(unknown)))
    nxt = spec.get("next", [])
    if not isinstance(nxt, list) or any(not isinstance(s, str) or s not in SHAPES for s in nxt):
        raise ValueError("next must be a list of known shapes")
    rate = spec.get("rate", 0)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
        raise ValueError("rate must be a number in [0, 1]")
    shape = spec.get("shape")
    if shape is not None and (not isinstance(shape, str) or shape not in SHAPES):
        raise ValueError("unknown shape %r" % (shape,))
    if rate > 0 and shape is None:
        raise ValueError("shape is required when rate > 0")
    delay = spec.get("delay_ms", DEFAULT_LATE_DELAY_MS)
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
        raise ValueError("delay_ms must be a non-negative number")
    retry_after = spec.get("retry_after_s", 0)
    if isinstance(retry_after, bool) or not isinstance(retry_after, int) or retry_after < 0:
        raise ValueError("retry_after_s must be a non-negative integer")
    return FaultSetting(nxt, float(rate), shape, delay, retry_after)


class State:
    """All mutable state.  Every access happens with self.lock held."""

    def __init__(self, seed):
        self.lock = threading.Lock()
        self.seed = seed
        # Connection ids are never reset, so they stay unique for the life of
        # the process even across /_target/reset.
        self.last_connection_id = 0
        self.clear()

    def clear(self):
        self.rng = random.Random(self.seed)   # re-seeded: runs are reproducible
        self.faults = {}                      # route -> FaultSetting
        self.orders = {}                      # id -> order (insertion = age order)
        self.order_seq = 0
        self.orders_by_ref = {}
        self.cancels = {}                     # order id -> number of cancel requests
        self.messages = {}                    # id -> message
        self.message_seq = 0
        self.messages_by_content = {}         # canonical [to, text] -> count
        self.idempotency = {}                 # key -> (body fingerprint, message id)
        self.log = []
        self.seq = 0
        self.by_route = {r: 0 for r in ROUTES}
        self.connections = 0                  # accepted since the last reset

    def new_connection(self):
        self.last_connection_id += 1
        self.connections += 1
        return self.last_connection_id

    def take_fault(self, route):
        """-> (shape, delay_ms) for the next request on this route."""
        setting = self.faults.get(route)
        if setting is None:
            return "ok", DEFAULT_LATE_DELAY_MS
        if setting.next:
            return setting.next.popleft(), setting.delay_ms
        if setting.rate > 0 and self.rng.random() < setting.rate:
            return setting.shape, setting.delay_ms
        return "ok", setting.delay_ms

    def retry_after(self, route):
        setting = self.faults.get(route)
        return str(setting.retry_after_s if setting is not None else 0)

    # ---- business handlers (lock held) -----------------------------------

    def create_order(self, req, params):
        data, err = parse_json_object(req.body)
        if err:
            return err
        ref = data.get("ref")
        if not isinstance(ref, str):
            return error(422, "ref required")
        # Deliberately NOT idempotent: the Idempotency-Key is only recorded.
        self.order_seq += 1
        oid = "ORD-%d" % self.order_seq
        echo = {k: v for k, v in data.items() if k != "ref"}
        self.orders[oid] = {"id": oid, "ref": ref, "state": "open", "request": echo,
                            "idempotency_key": req.idempotency_key}
        self.orders_by_ref[ref] = self.orders_by_ref.get(ref, 0) + 1
        return Response(201, {"id": oid, "ref": ref, "state": "open", "request": echo},
                        [("Location", "/erp/orders/" + quote(oid, safe=""))])

    def find_orders(self, req, params):
        refs = req.query.get("ref")
        if refs is None:
            return error(400, "ref query parameter required")
        ref = refs[0]
        items = [{"id": o["id"], "ref": o["ref"], "state": o["state"]}
                 for o in self.orders.values() if o["ref"] == ref]
        return Response(200, {"items": items})

    def get_order(self, req, params):
        order = self.orders.get(params[0])
        if order is None:
            return error(404, "order not found", id=params[0])
        return Response(200, dict(order))

    def cancel_order(self, req, params):
        oid = params[0]
        order = self.orders.get(oid)
        if order is None:
            return error(404, "order not found", id=oid)
        # Every cancel of an existing order is counted; the 2nd+ are
        # duplicates but are still answered 200 (cancel is naturally
        # idempotent in effect, the counter exposes retries).
        self.cancels[oid] = self.cancels.get(oid, 0) + 1
        order["state"] = "cancelled"
        return Response(200, {"id": oid, "state": "cancelled"})

    def send_message(self, req, params):
        data, err = parse_json_object(req.body)
        if err:
            return err
        key = req.idempotency_key
        # "Same body" means the same JSON value (key order / whitespace do not
        # matter), not byte-identical bytes.
        fingerprint = json.dumps(data, sort_keys=True, separators=(",", ":"))
        if key is not None and key in self.idempotency:
            prior_fp, prior_id = self.idempotency[key]
            if prior_fp != fingerprint:
                return error(422, "key reused with another body")
            return Response(200, {"id": prior_id}, [("Idempotent-Replayed", "true")])
        if data.get("to") is None or data.get("text") is None:
            return error(422, "to and text required")
        self.message_seq += 1
        mid = "MSG-%d" % self.message_seq
        self.messages[mid] = {"id": mid, "to": data["to"], "text": data["text"],
                              "idempotency_key": key}
        content = json.dumps([data["to"], data["text"]], sort_keys=True)
        self.messages_by_content[content] = self.messages_by_content.get(content, 0) + 1
        if key is not None:
            self.idempotency[key] = (fingerprint, mid)
        return Response(201, {"id": mid})

    # ---- /_target handlers (lock held) -----------------------------------

    def faults_json(self):
        return {"faults": {r: s.as_json() for r, s in self.faults.items()}}

    def get_faults(self, req, params):
        return Response(200, self.faults_json())

    def post_faults(self, req, params):
        data, err = parse_json_object(req.body)
        if err:
            return err
        reset = data.get("reset", False)
        if not isinstance(reset, bool):
            return error(400, "reset must be a boolean")
        new = {}
        try:
            for route, spec in data.items():
                if route == "reset":
                    continue
                if route not in ROUTES:
                    raise ValueError("unknown route %r" % route)
                new[route] = validate_fault_setting(route, spec)
        except ValueError as exc:
            return error(400, str(exc))
        # Validation passed for everything: apply atomically.
        if reset:
            self.faults = {}
        for route, setting in new.items():
            if setting is None:
                self.faults.pop(route, None)
            else:
                self.faults[route] = setting
        return Response(200, self.faults_json())

    def stats(self, req, params):
        dup_orders = sum(c - 1 for c in self.orders_by_ref.values())
        dup_cancels = sum(c - 1 for c in self.cancels.values())
        dup_messages = sum(c - 1 for c in self.messages_by_content.values())
        content = []
        for key, count in self.messages_by_content.items():
            to, text = json.loads(key)
            content.append({"to": to, "text": text, "count": count})
        return Response(200, {
            "requests": [dict(e) for e in self.log],
            "by_route": dict(self.by_route),
            "orders": len(self.orders),
            "orders_by_ref": dict(self.orders_by_ref),
            "duplicate_orders": dup_orders,
            "cancels": dict(self.cancels),
            "duplicate_cancels": dup_cancels,
            "messages": len(self.messages),
            "messages_by_content": content,
            "duplicate_messages": dup_messages,
            "connections": self.connections,
            "connections_used": len({e["connection"] for e in self.log}),
        })

    def reset(self, req, params):
        self.clear()
        return Response(200, {"reset": True})


PARAM = object()   # path-segment placeholder in the route table

# (path pattern, {method: (route name or None for /_target, State method)})
ROUTE_TABLE = [
    (("erp", "orders"), {"POST": ("create_order", State.create_order),
                         "GET": ("find_orders", State.find_orders)}),
    (("erp", "orders", PARAM), {"GET": ("get_order", State.get_order)}),
    (("erp", "orders", PARAM, "cancel"), {"POST": ("cancel_order", State.cancel_order)}),
    (("notify", "messages"), {"POST": ("send_message", State.send_message)}),
    (("_target", "faults"), {"POST": (None, State.post_faults),
                             "GET": (None, State.get_faults)}),
    (("_target", "stats"), {"GET": (None, State.stats)}),
    (("_target", "reset"), {"POST": (None, State.reset)}),
]


def resolve(segments):
    """-> (methods dict, params) or (None, None) for an unknown path."""
    for pattern, methods in ROUTE_TABLE:
        if len(pattern) != len(segments):
            continue
        params = []
        for pat, seg in zip(pattern, segments):
            if pat is PARAM:
                if not seg:
                    break
                params.append(seg)
            elif pat != seg:
                break
        else:
            return methods, params
    return None, None


# --------------------------------------------------------------------------
# Connection handling
# --------------------------------------------------------------------------

class Connection:
    """One accepted TCP connection, served by its own daemon thread."""

    def __init__(self, server, sock, conn_id):
        self.server = server
        self.state = server.state
        self.sock = sock
        self.id = conn_id
        self.requests = 0
        self.closed = False

    # ---- teardown variants -----------------------------------------------

    def close_fin(self):
        """Orderly FIN right away, nothing more.  (Note: if the client had
        sent bytes we never read, e.g. a pipelined request, Linux turns close()
        into an RST; in the fault scenarios the request has been fully read.)"""
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def close_rst(self):
        """Abortive close: SO_LINGER on with timeout 0 makes close() send RST."""
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.sock.close()

    def close_graceful(self):
        """Close after a complete response (RFC 9112 9.6): half-close our side,
        then drain what the client still sends for a short while.  Closing
        with unread input would make the kernel send RST, which can destroy
        the response before the client has read it."""
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + LINGER_DRAIN_SECONDS
            drained = 0
            while drained < LINGER_DRAIN_BYTES:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.sock.settimeout(remaining)
                data = self.sock.recv(65536)
                if not data:
                    break
                drained += len(data)
        except OSError:
            pass
        self.sock.close()

    # ---- main loop ---------------------------------------------------------

    def serve(self):
        reader = Reader(self.sock)
        try:
            self.sock.settimeout(IDLE_TIMEOUT)
            while not self.closed:
                try:
                    head = reader.read_head()
                    if head is None:
                        break                     # clean close between requests
                    req = parse_head(head)
                    read_body(reader, req, self.sock)
                except HttpError as exc:
                    self.send_error(exc)
                    break
                self.requests += 1
                if not self.handle(req):
                    break
        except (PeerClosed, OSError):
            pass                                   # client vanished / timed out
        except Exception:                          # a bug in this target
            traceback.print_exc()
        finally:
            self.close_fin()

    def send_error(self, exc):
        resp = error(exc.status, exc.message)
        lines, body = resp.wire(keep_alive=False)
        try:
            self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        except OSError:
            pass
        self.close_graceful()

    def handle(self, req):
        """Dispatch one fully-read request.  Returns True to keep reading."""
        state = self.state
        internal = bool(req.segments) and req.segments[0] == "_target"
        methods, params = resolve(req.segments)
        route = None
        shape, delay_ms = "ok", DEFAULT_LATE_DELAY_MS

        # Fault choice, business effect and log entry happen atomically under
        # the one state lock; the (possibly slow or broken) write happens after
        # the lock is released.
        with state.lock:
            if methods is None:
                resp = error(404, "no such route", path=req.path)
            elif req.method not in methods:
                resp = error(405, "method not allowed", allow=sorted(methods))
                resp.headers.append(("Allow", ", ".join(sorted(methods))))
            else:
                route, handler = methods[req.method]
                if route is not None:
                    shape, delay_ms = state.take_fault(route)
                if shape in PRE_COMMIT_SHAPES:
                    # Decided before the effect: nothing is committed.
                    if shape == "refuse_503":
                        resp = Response(503, {"error": "unavailable (injected fault, not committed)",
                                              "shape": shape},
                                        [("Retry-After", state.retry_after(route))])
                    else:
                        resp = Response(422, {"error": "rejected (injected fault, not committed)",
                                              "shape": shape})
                else:
                    # Commit first; any post-commit shape only affects what the
                    # client gets to see of the answer.
                    try:
                        resp = handler(state, req, params)
                    except Exception:
                        traceback.print_exc()
                        resp = error(500, "internal error in test target")
                    if shape in STATUS_SHAPES:
                        resp = Response(STATUS_SHAPES[shape],
                                        {"error": "injected fault (effect committed)",
                                         "shape": shape})
            resp.encode()
            if not internal:
                state.seq += 1
                if route is not None:
                    state.by_route[route] += 1
                written = None if shape in ("close_before_bytes", "reset", "partial_status") \
                    else resp.status
                state.log.append({
                    "seq": state.seq,
                    "method": req.method,
                    "target": req.target,
                    "route": route,
                    "idempotency_key": req.idempotency_key,
                    "connection": self.id,
                    "request_on_connection": self.requests,
                    "shape": shape,
                    "status": written,
                })
        return self.write(req, resp, shape, delay_ms)

    def write(self, req, resp, shape, delay_ms):
        keep_alive = req.keep_alive
        lines, body = resp.wire(keep_alive, head_only=(req.method == "HEAD"))
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        sock = self.sock

        if shape == "close_before_bytes":
            self.close_fin()
            return False
        if shape == "reset":
            self.close_rst()
            return False
        if shape == "partial_status":
            sock.sendall(b"HTTP/1.1 20")
            self.close_fin()
            return False
        if shape == "partial_headers":
            # Status line and exactly one header line, no terminating blank line.
            sock.sendall((lines[0] + "\r\n" + lines[1] + "\r\n").encode("latin-1"))
            self.close_fin()
            return False
        if shape == "partial_body":
            # Complete head announcing the true Content-Length, half the body.
            sock.sendall(head + body[:len(body) // 2])
            self.close_fin()
            return False
        if shape == "late":
            time.sleep(delay_ms / 1000.0)

        sock.sendall(head + body)
        if not keep_alive:
            self.close_graceful()
            return False
        return True


# --------------------------------------------------------------------------
# Server / main
# --------------------------------------------------------------------------

class Server:
    def __init__(self, sock, seed):
        self.sock = sock
        self.state = State(seed)

    def serve_forever(self):
        while True:
            try:
                client, _addr = self.sock.accept()
            except socket.timeout:
                continue                # lets the main thread run a pending signal handler
            except OSError:
                time.sleep(0.05)        # e.g. EMFILE; keep serving
                continue
            try:
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            with self.state.lock:
                conn_id = self.state.new_connection()
            conn = Connection(self, client, conn_id)
            threading.Thread(target=conn.serve, name="conn-%d" % conn_id, daemon=True).start()


ACCEPT_POLL = 0.2   # seconds the main thread may sleep in accept()


class _Stop(BaseException):
    """Raised from the signal handler to leave accept()."""


def _stop(signum, frame):
    raise _Stop()


def loopback_address(host):
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise SystemExit("erp_target: --host must be a loopback IP address")
    if not ip.is_loopback:
        raise SystemExit("erp_target: refusing to listen on non-loopback address %s" % host)
    return (socket.AF_INET6 if ip.version == 6 else socket.AF_INET), host


def main(argv=None):
    ap = argparse.ArgumentParser(description="Independent HTTP/1.1 ERP test target")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0,
                    help="seed for rate-based faults (default 0)")
    args = ap.parse_args(argv)
    family, host = loopback_address(args.host)

    # Install handlers before announcing the port so an immediate SIGTERM
    # after "PORT n" still exits cleanly with status 0.
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)

    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, args.port))
        listener.listen(128)
        # The kernel may hand SIGTERM/SIGINT to a connection thread; Python
        # then runs the handler only when the main thread next wakes.  A
        # bounded accept() makes sure it does.
        listener.settimeout(ACCEPT_POLL)
        sys.stdout.write("PORT %d\n" % listener.getsockname()[1])
        sys.stdout.flush()
        Server(listener, args.seed).serve_forever()
    except _Stop:
        pass
    finally:
        listener.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # Connection threads are daemons; leave without waiting for them.
    os._exit(0)


if __name__ == "__main__":
    main()
