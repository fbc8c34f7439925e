#!/usr/bin/env python3
"""Independent Standard Webhooks receiver simulator (test target).

Simulates the *receiving* side of webhook notifications sent following the
Standard Webhooks convention (https://www.standardwebhooks.com/): every
``POST`` to any path that is not under ``/_target/`` is a webhook message
carrying a ``Webhook-Id`` header, the message's unique id, which stays the
same across retries of that message.  The receiver deduplicates on it:

* the first request with a given id is *delivered*: counted and its body
  (parsed JSON) stored;
* a later request with the same id is acknowledged ``200`` but NOT delivered
  again; it is counted in ``duplicates_seen``;
* a request without (or with an empty or repeated) ``Webhook-Id`` gets 400;
* the body must be JSON (any JSON value; 400 otherwise), at most 1 MiB
  (413 above that).  ``Webhook-Timestamp`` / ``Webhook-Signature`` are not
  checked.

On top of that there is a per-request fault queue (answers lost after the
message was delivered, 500, 503, connection closed before anything) and
stats about what was received and delivered.

Control routes (JSON in, JSON out):

* ``GET  /_target/stats``   - counters, see ``State.stats``;
* ``GET  /_target/faults``  - ``{"next": [...], "stall_ms": n, "retry_after_s": n}``;
* ``POST /_target/faults``  - same keys, each optional; ``next`` replaces the
  queue.  Each business POST pops one shape (``"ok"`` when empty):

  ``ok``                 process normally;
  ``status_500``         answer 500, not delivered;
  ``status_503``         answer 503 with ``Retry-After`` (default 1), not delivered;
  ``accept_then_reset``  process (deliver), then reset the connection
                         (SO_LINGER 0) before any response byte;
  ``accept_then_close``  process (deliver), then close cleanly (FIN) before
                         any response byte;
  ``close_before``       close cleanly without processing and without answering;
  ``accept_then_stall``  process (deliver), sleep ``stall_ms`` (default 5000),
                         then close cleanly without answering.

  The ``accept_then_*`` shapes run the normal processing first, so an invalid
  request (no id, bad JSON) or a duplicate is not delivered either; only the
  answer is lost.
* ``POST /_target/reset``   - clears stats, queue and settings.

An unknown ``/_target/`` path gets 404, a known one with the wrong method 405.
A business path with a method other than POST gets 405 (counted in
``requests_total``, no shape popped).

It is self-contained on purpose: it shares no code or assumptions with the
engine it is used to test.  Python 3.11 standard library only
(http.server.ThreadingHTTPServer, HTTP/1.1, one daemon thread per
connection, every piece of shared state under one lock).

Usage:
    python3 webhook_receiver.py [--host 127.0.0.1] [--port 0]

Once listening it prints exactly one line ``PORT <n>`` (flushed) to stdout,
then serves until SIGTERM or SIGINT and exits with status 0.
"""

import argparse
import io
import ipaddress
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

MAX_BODY = 1024 * 1024            # bytes
IDLE_TIMEOUT = 60.0               # seconds a keep-alive connection may idle
MAX_STALL_MS = 600_000
MAX_RETRY_AFTER_S = 3600
DEFAULT_STALL_MS = 5000
DEFAULT_RETRY_AFTER_S = 1
DELIVERIES_CAP = 100_000          # entries kept in stats["deliveries"]

ID_HEADER = "Webhook-Id"
CONTROL_PREFIX = "/_target/"
CONTROL_ROUTES = {                # path -> allowed methods
    "/_target/stats": ("GET",),
    "/_target/faults": ("GET", "POST"),
    "/_target/reset": ("POST",),
}

SHAPES = ("ok", "status_500", "status_503", "accept_then_reset",
          "accept_then_close", "close_before", "accept_then_stall")


class BadRequest(Exception):
    """Client error in a control-route body (answered 400, nothing changes)."""


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def recipient_key(doc):
    """The ``delivered_by_recipient`` key of a delivered body, or None.

    ``body["recipient"]`` when the body is an object that has it: a string
    is used as is, any other JSON value as its compact JSON text."""
    if not isinstance(doc, dict) or "recipient" not in doc:
        return None
    r = doc["recipient"]
    if isinstance(r, str):
        return r
    return json.dumps(r, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


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

    def __init__(self):
        self.lock = threading.Lock()
        self._clear()

    def _clear(self):
        self.queue = []             # pending fault shapes
        self.stall_ms = DEFAULT_STALL_MS
        self.retry_after_s = DEFAULT_RETRY_AFTER_S
        self.seq = 0                # business request sequence number
        self.requests_total = 0
        self.seen_ids = set()       # ids already delivered
        self.by_id = {}             # id -> business POSTs that carried it
        self.duplicates_seen = 0
        self.deliveries = []
        self.delivered_by_recipient = {}

    # -- business side --------------------------------------------------
    def arrive(self, msg_id, pops_shape):
        """Count one business request (and its id, if any); pop its fault
        shape if pops_shape.  Returns (seq, shape, stall_ms, retry_after_s)."""
        with self.lock:
            self.seq += 1
            self.requests_total += 1
            if msg_id is not None:
                self.by_id[msg_id] = self.by_id.get(msg_id, 0) + 1
            shape = None
            if pops_shape:
                shape = self.queue.pop(0) if self.queue else "ok"
            return self.seq, shape, self.stall_ms, self.retry_after_s

    def deliver(self, seq, msg_id, path, doc):
        """Deliver a valid message unless its id was delivered before.
        Atomic (check and insert under the lock).  Returns True if delivered,
        False if it was a duplicate."""
        with self.lock:
            if msg_id in self.seen_ids:
                self.duplicates_seen += 1
                return False
            self.seen_ids.add(msg_id)
            self.deliveries.append({"id": msg_id, "path": path, "body": doc,
                                    "seq": seq})
            if len(self.deliveries) > DELIVERIES_CAP:
                del self.deliveries[0]
            r = recipient_key(doc)
            if r is not None:
                self.delivered_by_recipient[r] = self.delivered_by_recipient.get(r, 0) + 1
            return True

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

    def reset(self):
        with self.lock:
            self._clear()

    def stats(self):
        """Snapshot of the counters:

        requests_total          business requests (any method, any outcome;
                                not those rejected while reading the body:
                                bad framing, 413)
        delivered               distinct ids delivered
        duplicates_seen         valid requests acknowledged 200 without
                                delivery because their id was delivered before
        by_id                   {id: business POSTs that carried it, whatever
                                their fate (faults, 400s, duplicates)}
        deliveries              [{"id", "path", "body", "seq"}] in delivery
                                order; seq is the business request's arrival
                                number (1-based since start or reset)
        delivered_by_recipient  {body["recipient"]: deliveries}
        """
        with self.lock:
            # Bodies are never mutated after delivery; a JSON round trip is a
            # cheap deep copy so the answer cannot alias shared state.
            deliveries = json.loads(json.dumps(self.deliveries))
            return {
                "requests_total": self.requests_total,
                "delivered": len(self.seen_ids),
                "duplicates_seen": self.duplicates_seen,
                "by_id": dict(self.by_id),
                "deliveries": deliveries,
                "delivered_by_recipient": dict(self.delivered_by_recipient),
            }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "webhook-receiver/1"
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
    def _send(self, status, obj, extra=()):
        """Write a JSON answer (head and body in one write, so there is no
        write-write-read Nagle stall).  Returns True if it was written."""
        body = json.dumps(obj).encode("utf-8")
        reason = self.responses.get(status, ("",))[0]
        lines = ["HTTP/1.1 %d %s" % (status, reason),
                 "Server: " + self.version_string(),
                 "Date: " + self.date_time_string(),
                 "Content-Type: application/json",
                 "Content-Length: %d" % len(body)]
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

    def _message_id(self):
        """The Webhook-Id value, or None if missing, empty or repeated."""
        values = self.headers.get_all(ID_HEADER) or []
        if len(values) != 1 or not values[0].strip():
            return None
        return values[0].strip()

    def _business(self, path, body):
        st = self.state
        is_post = self.command == "POST"
        msg_id = self._message_id() if is_post else None
        seq, shape, stall_ms, retry_after_s = st.arrive(msg_id, is_post)

        if not is_post:
            self._send(405, {"message": "Method not allowed"}, (("Allow", "POST"),))
            return
        if shape == "status_500":
            self._send(500, {"message": "Internal server error"})
            return
        if shape == "status_503":
            self._send(503, {"message": "Service unavailable"},
                       (("Retry-After", str(retry_after_s)),))
            return
        if shape == "close_before":
            self._drop(rst=False)
            return

        status, obj = self._process(seq, path, msg_id, body)

        if shape == "accept_then_reset":
            self._drop(rst=True)
        elif shape == "accept_then_close":
            self._drop(rst=False)
        elif shape == "accept_then_stall":
            time.sleep(stall_ms / 1000.0)
            self._drop(rst=False)
        else:
            self._send(status, obj)

    def _process(self, seq, path, msg_id, body):
        """Validate and deliver one webhook message.  Returns (status, body)."""
        if msg_id is None:
            return 400, {"message": "exactly one non-empty %s header is required"
                                    % ID_HEADER}
        try:
            doc = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return 400, {"message": "the request body must be JSON"}
        delivered = self.state.deliver(seq, msg_id, path, doc)
        return 200, {"id": msg_id, "delivered": delivered,
                     "duplicate": not delivered}

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
        sys.exit("webhook_receiver: --host must be a loopback IP address or localhost")
    if not ip.is_loopback:
        sys.exit("webhook_receiver: refusing to bind non-loopback address %s" % host)
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    return family, str(ip)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Independent Standard Webhooks receiver simulator")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)
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

    Handler.state = State()
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
