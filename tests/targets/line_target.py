#!/usr/bin/env python3
"""Independent LINE Messaging API push-message simulator (test target).

Simulates ``POST /v2/bot/message/push`` of the LINE Messaging API as the
public LINE documentation describes it (API reference "Send push message",
the common "Retry failed API requests" page and the OpenAPI description
published by LINE): Bearer channel access token, request body validation,
``X-Line-Request-Id`` on every answer and the ``X-Line-Retry-Key``
semantics (a key is accepted once; a later request with the same key within
24 hours is not processed again and gets 409 Conflict with
``X-Line-Accepted-Request-Id``).

On top of that it has a simulated clock (so a test can jump past the 24 h
retry-key window), a per-request fault queue (answers lost after the
message was delivered, 500, 429) and stats about what was delivered.

It is self-contained on purpose: it shares no code or assumptions with the
engine it is used to test.  Python 3.11 standard library only
(http.server.ThreadingHTTPServer, one daemon thread per connection, every
piece of shared state under one lock).

Usage:
    python3 line_target.py [--host 127.0.0.1] [--port 0] [--token T ...]

Once listening it prints exactly one line ``PORT <n>`` (flushed) to stdout,
then serves until SIGTERM or SIGINT and exits with status 0.
"""

import argparse
import io
import ipaddress
import json
import os
import re
import secrets
import signal
import socket
import struct
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

MAX_BODY = 1024 * 1024            # bytes
IDLE_TIMEOUT = 60.0               # seconds a keep-alive connection may idle
RETRY_KEY_WINDOW_S = 24 * 3600    # LINE: a retry key is valid for 24 hours
MAX_MESSAGES = 5                  # LINE: messages has 1..5 elements
MAX_TEXT = 5000                   # LINE: text message max 5000 characters
MAX_STALL_MS = 600_000
MAX_RETRY_AFTER_S = 3600
DEFAULT_STALL_MS = 5000
DEFAULT_RETRY_AFTER_S = 1
REQUESTS_CAP = 10_000             # entries kept in stats["requests"]
DELIVERIES_CAP = 10_000           # entries kept in stats["deliveries"]
MESSAGE_ID_BASE = 500_000_000_000_000_000   # 18-digit numeric ids

PUSH_PATH = "/v2/bot/message/push"
CONTROL_PREFIX = "/_target/"
CONTROL_ROUTES = {                # path -> allowed methods
    "/_target/stats": ("GET",),
    "/_target/faults": ("GET", "POST"),
    "/_target/clock": ("GET", "POST"),
    "/_target/reset": ("POST",),
}

# Message object types of the Messaging API.  Only "text" is checked in
# depth; the others only need a known "type".
MESSAGE_TYPES = ("text", "textV2", "sticker", "image", "video", "audio",
                 "location", "imagemap", "template", "flex", "coupon")

SHAPES = ("ok", "status_500", "status_429", "accept_then_reset",
          "accept_then_close", "accept_then_stall")
PROCESSING_SHAPES = ("ok", "accept_then_reset", "accept_then_close",
                     "accept_then_stall")

# "Canonical hex form": 8-4-4-4-12 hex digits, any version/variant nibble.
UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                     r"[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")

MSG_NO_AUTH = ("Authorization header required. Must follow the scheme, "
               "'Authorization: Bearer <ACCESS TOKEN>'")
MSG_BAD_AUTH = ("Authentication failed. Confirm that the access token in the "
                "authorization header is valid.")
MSG_BAD_RETRY_KEY = ("The value of the X-Line-Retry-Key header is invalid. "
                     "Specify a UUID in hexadecimal format.")
MSG_CONFLICT = "The retry key is already accepted"


class BadRequest(Exception):
    """Client error in a control-route body (answered 400, nothing changes)."""


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def utf16_len(s):
    """Length in UTF-16 code units: how LINE counts characters in a text."""
    return len(s.encode("utf-16-le", "surrogatepass")) // 2


def canonical(obj):
    """Canonical JSON text of a parsed value (used to compare bodies)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False)


def validate_push(doc):
    """Return a list of LINE-style error details ({"message","property"})
    for a parsed push request body; empty if the body is valid."""
    if not isinstance(doc, dict):
        return [{"message": "The request body must be a JSON object",
                 "property": ""}]
    details = []
    to = doc.get("to")
    if to is None:
        details.append({"message": "Must not be null", "property": "to"})
    elif not isinstance(to, str):
        details.append({"message": "Must be a string", "property": "to"})
    elif to == "":
        details.append({"message": "Must not be empty", "property": "to"})
    msgs = doc.get("messages")
    if msgs is None:
        details.append({"message": "Must not be null", "property": "messages"})
    elif not isinstance(msgs, list):
        details.append({"message": "Must be an array", "property": "messages"})
    elif not 1 <= len(msgs) <= MAX_MESSAGES:
        details.append({"message": "Size must be between 1 and %d" % MAX_MESSAGES,
                        "property": "messages"})
    else:
        for i, m in enumerate(msgs):
            prop = "messages[%d]" % i
            if not isinstance(m, dict):
                details.append({"message": "Must be an object", "property": prop})
                continue
            mtype = m.get("type")
            if mtype is None:
                details.append({"message": "Must not be null",
                                "property": prop + ".type"})
                continue
            if mtype not in MESSAGE_TYPES:
                details.append({"message": "Must be one of the following values: [%s]"
                                % ", ".join(MESSAGE_TYPES),
                                "property": prop + ".type"})
                continue
            if mtype == "text":
                text = m.get("text")
                if text is None:
                    details.append({"message": "Must not be null",
                                    "property": prop + ".text"})
                elif not isinstance(text, str):
                    details.append({"message": "Must be a string",
                                    "property": prop + ".text"})
                elif not 1 <= utf16_len(text) <= MAX_TEXT:
                    details.append({"message": "Length must be between 1 and %d"
                                    % MAX_TEXT, "property": prop + ".text"})
    if "notificationDisabled" in doc and not isinstance(doc["notificationDisabled"], bool):
        details.append({"message": "Must be a boolean",
                        "property": "notificationDisabled"})
    return details


def validate_faults(doc):
    """Return a validated faults patch or raise BadRequest."""
    if not isinstance(doc, dict):
        raise BadRequest("faults must be a JSON object")
    unknown = sorted(set(doc) - {"next", "stall_ms", "retry_after_s"})
    if unknown:
        raise BadRequest("unknown key(s): " + ", ".join(unknown))
    out = {}
    if "next" in doc:
        q = doc["next"]
        if not isinstance(q, list) or not all(isinstance(s, str) for s in q):
            raise BadRequest("next must be a list of shape names")
        bad = sorted(set(s for s in q if s not in SHAPES))
        if bad:
            raise BadRequest("unknown shape(s): %s (known: %s)"
                             % (", ".join(bad), ", ".join(SHAPES)))
        out["next"] = list(q)
    if "stall_ms" in doc:
        v = doc["stall_ms"]
        if not _is_int(v) or not 0 <= v <= MAX_STALL_MS:
            raise BadRequest("stall_ms must be an integer 0..%d" % MAX_STALL_MS)
        out["stall_ms"] = v
    if "retry_after_s" in doc:
        v = doc["retry_after_s"]
        if not _is_int(v) or not 0 <= v <= MAX_RETRY_AFTER_S:
            raise BadRequest("retry_after_s must be an integer 0..%d" % MAX_RETRY_AFTER_S)
        out["retry_after_s"] = v
    return out


class State:
    """All shared state.  Every access holds self.lock."""

    def __init__(self, tokens):
        self.lock = threading.Lock()
        self.tokens = frozenset(tokens)
        self.next_message = 0       # message ids never repeat, even after reset
        self._clear()

    def _clear(self):
        self.offset = 0.0           # simulated clock offset, seconds
        self.queue = []             # pending fault shapes
        self.stall_ms = DEFAULT_STALL_MS
        self.retry_after_s = DEFAULT_RETRY_AFTER_S
        self.seq = 0
        self.requests = []          # request log (dicts, oldest first)
        self.requests_total = 0
        self.keys = {}              # normalised key -> accepted record
        self.deliveries = []        # one entry per delivered message
        self.delivered = 0
        self.delivered_by_to = {}
        self.by_content = {}        # (to, text or canonical message) -> count
        self.conflicts_409 = 0
        self.key_reused_with_other_body = 0

    # -- clock ----------------------------------------------------------
    def _now(self):
        """Simulated time in seconds (monotonic + offset)."""
        return time.monotonic() + self.offset

    # -- business side --------------------------------------------------
    def arrive(self, method, path, retry_key, is_push):
        """Log one business request, take its fault shape (push only).
        Returns (entry, shape, stall_ms, retry_after_s)."""
        with self.lock:
            self.seq += 1
            self.requests_total += 1
            shape = None
            if is_push:
                shape = self.queue.pop(0) if self.queue else "ok"
            entry = {"seq": self.seq, "method": method, "path": path,
                     "retry_key": retry_key, "shape": shape,
                     "request_id": None, "processed_status": None,
                     "accepted_request_id": None, "status": None}
            self.requests.append(entry)
            if len(self.requests) > REQUESTS_CAP:
                del self.requests[0]
            return entry, shape, self.stall_ms, self.retry_after_s

    def note(self, entry, **fields):
        with self.lock:
            entry.update(fields)

    def process_push(self, request_id, key, doc):
        """Deliver a valid push request, honouring the retry key.  Atomic.
        Returns (status, body dict, extra headers)."""
        with self.lock:
            now = self._now()
            fp = canonical(doc)
            norm = key.lower() if key is not None else None
            if norm is not None:
                rec = self.keys.get(norm)
                if rec is not None and now - rec["accepted_at"] < RETRY_KEY_WINDOW_S:
                    self.conflicts_409 += 1
                    if rec["fingerprint"] != fp:
                        self.key_reused_with_other_body += 1
                    body = {"message": MSG_CONFLICT,
                            "sentMessages": [dict(m) for m in rec["sent"]]}
                    return 409, body, (("X-Line-Accepted-Request-Id", rec["request_id"]),)
            sent = []
            to = doc["to"]
            for m in doc["messages"]:
                self.next_message += 1
                mid = str(MESSAGE_ID_BASE + self.next_message)
                sent.append({"id": mid, "quoteToken": secrets.token_urlsafe(48)})
                text = m.get("text") if m["type"] == "text" else None
                content = text if m["type"] == "text" else canonical(m)
                ck = (to, content)
                self.by_content[ck] = self.by_content.get(ck, 0) + 1
                self.delivered += 1
                self.delivered_by_to[to] = self.delivered_by_to.get(to, 0) + 1
                self.deliveries.append({"to": to, "type": m["type"], "text": text,
                                        "message_id": mid, "request_id": request_id,
                                        "retry_key": key})
                if len(self.deliveries) > DELIVERIES_CAP:
                    del self.deliveries[0]
            if norm is not None:
                self.keys[norm] = {"accepted_at": now, "request_id": request_id,
                                   "fingerprint": fp, "sent": sent}
            return 200, {"sentMessages": [dict(m) for m in sent]}, ()

    # -- control side ---------------------------------------------------
    def faults(self):
        with self.lock:
            return {"next": list(self.queue), "stall_ms": self.stall_ms,
                    "retry_after_s": self.retry_after_s}

    def set_faults(self, doc):
        clean = validate_faults(doc)
        with self.lock:
            if "next" in clean:
                self.queue = clean["next"]
            if "stall_ms" in clean:
                self.stall_ms = clean["stall_ms"]
            if "retry_after_s" in clean:
                self.retry_after_s = clean["retry_after_s"]
        return self.faults()

    def clock(self):
        with self.lock:
            return {"offset_seconds": self.offset}

    def advance(self, seconds):
        with self.lock:
            self.offset += seconds
            return {"offset_seconds": self.offset}

    def reset(self):
        with self.lock:
            self._clear()

    def stats(self):
        with self.lock:
            now = self._now()
            keys = []
            for k, rec in self.keys.items():
                age = now - rec["accepted_at"]
                keys.append({"key": k, "request_id": rec["request_id"],
                             "age_seconds": round(age, 3),
                             "active": age < RETRY_KEY_WINDOW_S})
            return {
                "requests_total": self.requests_total,
                "requests": [dict(r) for r in self.requests],
                "delivered": self.delivered,
                "delivered_by_to": dict(self.delivered_by_to),
                "duplicates": sum(n - 1 for n in self.by_content.values() if n > 1),
                "conflicts_409": self.conflicts_409,
                "key_reused_with_other_body": self.key_reused_with_other_body,
                "retry_keys": keys,
                "deliveries": [dict(d) for d in self.deliveries],
                "clock": {"offset_seconds": self.offset},
                "faults": {"next": list(self.queue), "stall_ms": self.stall_ms,
                           "retry_after_s": self.retry_after_s},
            }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "line-target/1"
    sys_version = ""
    timeout = IDLE_TIMEOUT
    state = None   # set on the class by main()

    # Any method name goes to _dispatch, so a known path with a wrong method
    # gets 405 instead of http.server's 501.
    def __getattr__(self, name):
        if name.startswith("do_"):
            return self._dispatch
        raise AttributeError(name)

    def log_message(self, fmt, *args):   # keep stderr quiet
        pass

    def setup(self):
        super().setup()
        try:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass

    # -- responses ------------------------------------------------------
    def _send(self, status, obj, extra=(), request_id=None):
        """Write a JSON answer (head and body in one write, so there is no
        write-write-read Nagle stall).  Returns True if it was written."""
        body = json.dumps(obj).encode("utf-8")
        reason = self.responses.get(status, ("",))[0]
        lines = ["HTTP/1.1 %d %s" % (status, reason),
                 "Server: " + self.version_string(),
                 "Date: " + self.date_time_string(),
                 "Content-Type: application/json",
                 "Content-Length: %d" % len(body),
                 "X-Line-Request-Id: " + (request_id or str(uuid.uuid4()))]
        lines += ["%s: %s" % (name, value) for name, value in extra]
        lines.append("Connection: " + ("close" if self.close_connection else "keep-alive"))
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if self.command != "HEAD":
            data += body
        try:
            self.wfile.write(data)
            self.wfile.flush()
            return True
        except OSError:                  # client gone
            self.close_connection = True
            return False

    def send_error(self, code, message=None, explain=None):
        # http.server's own errors (bad request line, 414, 431, 505, ...).
        self.close_connection = True
        self._send(code, {"message": message or self.responses.get(code, ("error",))[0]})

    # -- connection endings without a single response byte --------------
    def _drop(self, rst):
        """Close the connection without sending anything: RST if rst (linger
        0), else FIN.  The file objects are closed first so that the socket
        is really closed now and not when http.server finishes."""
        self.close_connection = True
        sock = self.connection
        try:
            if rst:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                struct.pack("ii", 1, 0))
            else:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        for f in (self.wfile, self.rfile):
            try:
                f.close()
            except OSError:
                pass
        # http.server flushes and closes self.wfile after the handler returns.
        self.wfile = io.BytesIO()
        try:
            sock.close()
        except OSError:
            pass

    # -- request body -----------------------------------------------------
    def _read_body(self):
        """Read a Content-Length body.  Returns bytes, or None after having
        answered a framing error (the connection is then closed)."""
        if self.headers.get("Transfer-Encoding") is not None:
            self.close_connection = True
            self._send(400, {"message": "Transfer-Encoding is not supported; "
                                        "use Content-Length"})
            return None
        values = self.headers.get_all("Content-Length") or []
        if not values:
            return b""
        if len(set(v.strip() for v in values)) != 1 or not values[0].strip().isdigit():
            self.close_connection = True
            self._send(400, {"message": "Invalid Content-Length"})
            return None
        length = int(values[0].strip())
        if length > MAX_BODY:
            self.close_connection = True
            self._send(413, {"message": "Request entity too large"})
            return None
        try:
            data = self.rfile.read(length)
        except OSError:
            data = b""
        if len(data) != length:
            self.close_connection = True
            return None
        return data

    # -- routing ----------------------------------------------------------
    def _dispatch(self):
        body = self._read_body()
        if body is None:
            return
        path = urlsplit(self.path).path
        if path.startswith(CONTROL_PREFIX) or path == CONTROL_PREFIX.rstrip("/"):
            self._control(path, body)
        else:
            self._business(path, body)

    def _business(self, path, body):
        st = self.state
        request_id = str(uuid.uuid4())
        key_values = self.headers.get_all("X-Line-Retry-Key") or []
        retry_key = key_values[0] if len(key_values) == 1 else (
            None if not key_values else ",".join(key_values))
        is_push = path == PUSH_PATH and self.command == "POST"
        entry, shape, stall_ms, retry_after_s = st.arrive(
            self.command, path, retry_key, is_push)
        st.note(entry, request_id=request_id)

        if shape == "status_500":
            status, obj, extra = 500, {"message": "Internal server error"}, ()
        elif shape == "status_429":
            status, obj, extra = (429, {"message": "The API rate limit has been "
                                                   "exceeded. Try again later."},
                                  (("Retry-After", str(retry_after_s)),))
        else:
            status, obj, extra = self._push_answer(path, body, request_id, key_values)
        accepted = dict(extra).get("X-Line-Accepted-Request-Id")
        st.note(entry, processed_status=status, accepted_request_id=accepted)

        if shape == "accept_then_reset":
            self._drop(rst=True)
            return
        if shape == "accept_then_close":
            self._drop(rst=False)
            return
        if shape == "accept_then_stall":
            time.sleep(stall_ms / 1000.0)
            self._drop(rst=False)
            return
        if self._send(status, obj, extra, request_id):
            st.note(entry, status=status)

    def _push_answer(self, path, body, request_id, key_values):
        """Process one business request.  Returns (status, body, headers)."""
        if path != PUSH_PATH:
            return 404, {"message": "Not found"}, ()
        if self.command != "POST":
            return 405, {"message": "Method not allowed"}, (("Allow", "POST"),)
        # 1. Authentication: Authorization: Bearer <channel access token>.
        auth = self.headers.get("Authorization")
        if auth is None or not auth.strip():
            return 401, {"message": MSG_NO_AUTH}, ()
        scheme, _, token = auth.strip().partition(" ")
        if scheme.lower() != "bearer" or token.strip() not in self.state.tokens:
            return 401, {"message": MSG_BAD_AUTH}, ()
        # 2. Retry key format: one header, a UUID in canonical hex form.
        key = None
        if key_values:
            if len(key_values) != 1 or not UUID_RE.match(key_values[0].strip()):
                return 400, {"message": MSG_BAD_RETRY_KEY}, ()
            key = key_values[0].strip()
        # 3. Body validation.
        try:
            doc = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return 400, {"message": "The request body has 1 error(s)",
                         "details": [{"message": "The request body could not be "
                                                 "parsed as JSON", "property": ""}]}, ()
        details = validate_push(doc)
        if details:
            return 400, {"message": "The request body has %d error(s)" % len(details),
                         "details": details}, ()
        # 4. Retry-key check and delivery (atomic).
        return self.state.process_push(request_id, key, doc)

    def _control(self, path, body):
        methods = CONTROL_ROUTES.get(path)
        if methods is None:
            return self._send(404, {"message": "Not found"})
        if self.command not in methods:
            return self._send(405, {"message": "Method not allowed"},
                              (("Allow", ", ".join(methods)),))
        st = self.state
        try:
            doc = None
            if self.command == "POST" and body.strip():
                try:
                    doc = json.loads(body.decode("utf-8"))
                except (UnicodeDecodeError, ValueError):
                    raise BadRequest("bad JSON")
            if path == "/_target/stats":
                return self._send(200, st.stats())
            if path == "/_target/faults":
                if self.command == "GET":
                    return self._send(200, st.faults())
                return self._send(200, st.set_faults(doc))
            if path == "/_target/clock":
                if self.command == "GET":
                    return self._send(200, st.clock())
                if not isinstance(doc, dict) or set(doc) != {"advance_seconds"}:
                    raise BadRequest('body must be {"advance_seconds": N}')
                n = doc["advance_seconds"]
                if not _is_number(n) or n < 0 or n != n or n == float("inf"):
                    raise BadRequest("advance_seconds must be a finite number >= 0")
                return self._send(200, st.advance(n))
            if path == "/_target/reset":
                st.reset()
                return self._send(200, {"reset": True})
        except BadRequest as e:
            return self._send(400, {"message": str(e)})


def loopback_address(host):
    """(address family, literal address) for a loopback host, else exit 1."""
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        sys.exit("line_target: --host must be a loopback IP address or localhost")
    if not ip.is_loopback:
        sys.exit("line_target: refusing to bind non-loopback address %s" % host)
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    return family, str(ip)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Independent LINE push API simulator")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--token", action="append", default=None,
                    help="accepted channel access token (repeatable; default test-token)")
    args = ap.parse_args(argv)
    tokens = args.token or ["test-token"]
    if any(not t or t != t.strip() or " " in t for t in tokens):
        ap.error("--token must be non-empty and contain no spaces")
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
        request_queue_size = 128

    Handler.state = State(tokens)
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
    # Connection threads are daemons (some may be sleeping in a stall).
    os._exit(0)


if __name__ == "__main__":
    main()
