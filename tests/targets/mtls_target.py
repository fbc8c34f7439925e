#!/usr/bin/env python3
"""Independent HTTPS test target that requires a client certificate (mutual TLS).

Self-contained on purpose: it shares no code or assumptions with the engine it
is used to test.  Python 3.11 standard library only.

Usage:
    python3 mtls_target.py --cert SERVER_CERT_PEM --key SERVER_KEY_PEM \
        --client-ca CA_PEM [--host 127.0.0.1] [--port 0] [--control-port 0]

Once both ports listen it prints ``PORT <tls port>`` then ``CONTROL <plain
port>`` (flushed) and serves until SIGTERM or SIGINT, then exits with status 0.

Counting rule: the TLS handshake is done explicitly in each connection's
thread.  If it fails, the connection is counted in ``handshake_failures`` and
nothing it sent is ever parsed.  A request is counted only after the handshake
succeeded *and* a complete HTTP request (head + Content-Length body) was read.
With TLS 1.3 a client may think its handshake is done and send a request
before the server has checked its certificate; the server-side do_handshake()
only returns after the client's Certificate/CertificateVerify/Finished were
received and verified, so such a request is never read.
"""

import argparse
import ipaddress
import json
import os
import signal
import socket
import socketserver
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler

HANDSHAKE_TIMEOUT = 5.0      # seconds for the whole TLS handshake
IDLE_TIMEOUT = 30.0          # seconds a TLS connection may sit idle
MAX_HEAD = 64 * 1024
MAX_BODY = 1024 * 1024
REASONS = {200: "OK", 201: "Created", 400: "Bad Request", 404: "Not Found"}


class State:
    """Every counter, under one lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        with self.lock:
            self.requests = 0
            self.orders = 0
            self.client_cns = []
            self.handshake_failures = 0
            self.handshake_errors = []

    def snapshot(self):
        with self.lock:
            return {"requests": self.requests, "orders": self.orders,
                    "client_cns": list(self.client_cns),
                    "handshake_failures": self.handshake_failures,
                    "handshake_errors": list(self.handshake_errors)}


STATE = State()


def error_text(exc):
    """The ssl error's reason (e.g. PEER_DID_NOT_RETURN_A_CERTIFICATE) if any."""
    reason = getattr(exc, "reason", None)
    return reason if reason else "%s: %s" % (type(exc).__name__, exc)


def peer_cn(tls_sock):
    cert = tls_sock.getpeercert()
    if not cert:
        return None, False
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value, True
    return None, True


# --------------------------------------------------------------------------
# TLS side: raw sockets, explicit handshake, hand-written HTTP/1.1 parsing
# --------------------------------------------------------------------------

class BadRequest(Exception):
    pass


def read_request(sock, buf):
    """Read one complete request from sock (leftover bytes stay in buf).
    Returns (method, target, version, headers, body), or None if the peer
    closed before a complete request arrived."""
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            break
        if len(buf) > MAX_HEAD:
            raise BadRequest("request head too large")
        data = sock.recv(65536)
        if not data:
            return None
        buf += data
    head = bytes(buf[:end]).decode("latin-1")
    del buf[:end + 4]
    lines = head.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest("malformed request line")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest("malformed header line")
        headers[name.lower()] = value.strip()
    if "transfer-encoding" in headers:
        raise BadRequest("Transfer-Encoding is not supported")
    length = headers.get("content-length", "0")
    if not length.isdigit() or int(length) > MAX_BODY:
        raise BadRequest("bad Content-Length")
    length = int(length)
    while len(buf) < length:
        data = sock.recv(65536)
        if not data:
            return None
        buf += data
    body = bytes(buf[:length])
    del buf[:length]
    return parts[0], parts[1], parts[2], headers, body


def send_json(sock, status, obj, close):
    body = json.dumps(obj).encode()
    head = ("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\nConnection: %s\r\n\r\n"
            % (status, REASONS[status], len(body), "close" if close else "keep-alive"))
    sock.sendall(head.encode() + body)


def handle_request(method, target, body, cn):
    """Route one counted request; returns (status, json object)."""
    if target.split("?", 1)[0] != "/orders" or method != "POST":
        return 404, {"error": "not found", "method": method, "target": target}
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        doc = None
    if not isinstance(doc, dict):
        return 400, {"error": "body must be a JSON object"}
    with STATE.lock:
        STATE.orders += 1
        n = STATE.orders
    return 201, {"id": "ORD-%d" % n, "client_cn": cn, "ref": doc.get("ref")}


def serve_tls_connection(ctx, raw):
    try:
        raw.settimeout(HANDSHAKE_TIMEOUT)
        sock = ctx.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
    except (OSError, ValueError) as exc:
        raw.close()
        return _handshake_failed(exc)
    try:
        try:
            sock.do_handshake()   # verifies the client certificate (CERT_REQUIRED)
        except (OSError, ValueError) as exc:
            return _handshake_failed(exc)
        sock.settimeout(IDLE_TIMEOUT)
        buf = bytearray()
        while True:
            try:
                req = read_request(sock, buf)
            except BadRequest as exc:
                send_json(sock, 400, {"error": str(exc)}, close=True)
                return
            if req is None:
                return            # incomplete request: never counted
            method, target, version, headers, body = req
            cn, has_cert = peer_cn(sock)
            if not has_cert:      # cannot happen with CERT_REQUIRED; be strict anyway
                return _handshake_failed("NO_PEER_CERTIFICATE_AFTER_HANDSHAKE")
            with STATE.lock:
                STATE.requests += 1
                STATE.client_cns.append(cn)
            status, obj = handle_request(method, target, body, cn)
            close = (version == "HTTP/1.0"
                     or headers.get("connection", "").lower() == "close")
            send_json(sock, status, obj, close)
            if close:
                return
    except OSError:
        pass                      # peer went away or timed out
    finally:
        sock.close()


def _handshake_failed(exc):
    with STATE.lock:
        STATE.handshake_failures += 1
        STATE.handshake_errors.append(exc if isinstance(exc, str) else error_text(exc))


# --------------------------------------------------------------------------
# Control side: plain HTTP on loopback
# --------------------------------------------------------------------------

class ControlHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _answer(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/_target/stats":
            return self._answer(200, STATE.snapshot())
        self._answer(404, {"error": "not found"})

    def do_POST(self):
        length = self.headers.get("Content-Length", "0")
        self.rfile.read(int(length) if length.isdigit() else 0)
        if self.path == "/_target/reset":
            STATE.reset()
            return self._answer(200, STATE.snapshot())
        self._answer(404, {"error": "not found"})


class ControlServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, family, address):
        self.address_family = family
        super().__init__(address, ControlHandler)


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

ACCEPT_POLL = 0.2   # seconds the main thread may sleep in accept()


class _Stop(BaseException):
    """Raised from the signal handler to leave accept().  Not an Exception, so
    that no `except Exception` on the way (socketserver's own, around a
    connection's thread start) swallows it."""


def _stop(signum, frame):
    raise _Stop()


def loopback(host):
    if host == "localhost":
        host = "127.0.0.1"
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        sys.exit("--host must be a loopback IP address or localhost")
    if not addr.is_loopback:
        sys.exit("refusing to bind non-loopback address %s" % host)
    return (socket.AF_INET6 if addr.version == 6 else socket.AF_INET), host


def main(argv=None):
    ap = argparse.ArgumentParser(description="Independent mutual-TLS HTTPS test target")
    ap.add_argument("--cert", required=True, help="server certificate (PEM)")
    ap.add_argument("--key", required=True, help="server private key (PEM)")
    ap.add_argument("--client-ca", required=True, help="CA that must sign client certs (PEM)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--control-port", type=int, default=0)
    args = ap.parse_args(argv)
    family, host = loopback(args.host)

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(args.cert, args.key)
    ctx.load_verify_locations(cafile=args.client_ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.num_tickets = 0           # no TLS 1.3 resumption: every connection is fully verified

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, args.port))
        listener.listen(128)
        control = ControlServer(family, (host, args.control_port))
        threading.Thread(target=control.serve_forever, daemon=True).start()
        sys.stdout.write("PORT %d\nCONTROL %d\n"
                         % (listener.getsockname()[1], control.server_address[1]))
        sys.stdout.flush()
        # The kernel may hand SIGTERM/SIGINT to another thread (the control
        # server, a connection); Python then runs the handler only when the
        # main thread next wakes.  A bounded accept() makes sure it does.
        listener.settimeout(ACCEPT_POLL)
        while True:
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            threading.Thread(target=serve_tls_connection, args=(ctx, conn),
                             daemon=True).start()
    except _Stop:
        pass
    finally:
        listener.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)                   # connection threads are daemons; do not wait


if __name__ == "__main__":
    main()
