#!/usr/bin/env python3
"""Independent OAuth2-protected test target: a token endpoint (client
credentials grant) in front of a tiny in-memory "ERP" order API.

Self-contained on purpose: it shares no code or assumptions with the engine it
is used to test.  It is written from
  * RFC 6749  2.3.1 (client password authentication: HTTP Basic with the id
    and secret form-urlencoded first, or body parameters), 3.2 (token
    endpoint: parameters without a value are omitted, none may repeat),
    4.4 (client credentials grant), 5.1 / 5.2 (token and error responses);
  * RFC 6750  2.1 (Authorization: Bearer) and 3 / 3.1 (WWW-Authenticate
    challenge and the invalid_token error code).
Python 3.11 standard library only (http.server, one thread per connection,
all state under one lock).

Usage:
    python3 oauth_erp_target.py --client-id ID --client-secret SECRET
        [--host 127.0.0.1] [--port 0] [--token-ttl SECONDS] [--token-delay-ms N]
        [--scope "space delimited scopes"]

Once listening it prints exactly one line ``PORT <n>`` (flushed) to stdout and
serves until SIGTERM or SIGINT, then exits with status 0.
"""

import argparse
import base64
import binascii
import ipaddress
import json
import os
import re
import secrets
import signal
import socket
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, parse_qsl, unquote_plus, urlsplit

MAX_BODY = 1024 * 1024
MAX_CHUNK_LINE = 4096
IDLE_TIMEOUT = 30.0
FAIL_TOKEN_MODES = (None, "invalid_client", "server_error", "close")
CONFIG_KEYS = ("token_ttl", "token_delay_ms", "fail_token")
FORM_TYPE = "application/x-www-form-urlencoded"
# RFC 6750 2.1: b64token = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="
B64TOKEN_RE = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
# RFC 6749 3.3: scope-token = 1*( %x21 / %x23-5B / %x5D-7E )
SCOPE_TOKEN_RE = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")
BEARER_REALM = "erp"


class BadRequest(Exception):
    """Framing / syntax error: answered 400 and the connection is closed."""


# --------------------------------------------------------------------------
# State
# --------------------------------------------------------------------------

class State:
    """Every piece of mutable state; every access happens with self.lock held."""

    def __init__(self, client_id, client_secret, token_ttl, token_delay_ms, scope):
        self.lock = threading.Lock()
        self.client_id = client_id
        self.client_secret = client_secret
        self.scope = scope                      # None or a set of scope tokens
        self.cli_config = {"token_ttl": token_ttl, "token_delay_ms": token_delay_ms,
                           "fail_token": None}
        # Live gauge of token requests being handled right now.  It is not
        # cleared by a reset (requests still in flight would drive it negative).
        self.token_in_flight = 0
        self.clear()

    def clear(self):
        self.config = dict(self.cli_config)
        self.tokens = {}            # token -> {"index", "issued", "ttl", "revoked"}
        self.token_seq = 0
        self.token_requests = 0
        self.tokens_issued = 0
        self.max_concurrent = 0
        self.token_errors = {}      # error code -> count
        self.auth_methods = {"basic": 0, "body": 0}
        self.last_content_type = None
        self.orders = []            # [{"id", "ref"}] in creation order
        self.orders_by_ref = {}
        self.orders_by_token = {}   # token index -> authorised API requests
        self.unauthorized = 0

    def stats(self):
        return {
            "token_requests": self.token_requests,
            "tokens_issued": self.tokens_issued,
            "max_concurrent_token_requests": self.max_concurrent,
            "token_errors": dict(self.token_errors),
            "token_auth_methods": dict(self.auth_methods),
            "last_token_request_content_type": self.last_content_type,
            "orders": len(self.orders),
            "orders_by_ref": dict(self.orders_by_ref),
            "orders_by_token": {str(k): v for k, v in sorted(self.orders_by_token.items())},
            "unauthorized": self.unauthorized,
        }

    def config_json(self):
        out = dict(self.config)
        out["scope"] = " ".join(sorted(self.scope)) if self.scope is not None else None
        return out


STATE = None  # set in main()


def validate_config(data):
    """-> dict of validated changes, or raise ValueError."""
    unknown = sorted(set(data) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError("unknown config keys: %s" % ", ".join(unknown))
    out = {}
    if "token_ttl" in data:
        v = data["token_ttl"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError("token_ttl must be an integer >= 0 (seconds)")
        out["token_ttl"] = v
    if "token_delay_ms" in data:
        v = data["token_delay_ms"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise ValueError("token_delay_ms must be a number >= 0")
        out["token_delay_ms"] = v
    if "fail_token" in data:
        v = data["fail_token"]
        if v not in FAIL_TOKEN_MODES or isinstance(v, bool):
            raise ValueError("fail_token must be null, \"invalid_client\", "
                             "\"server_error\" or \"close\"")
        out["fail_token"] = v
    return out


# --------------------------------------------------------------------------
# Token endpoint logic (RFC 6749)
# --------------------------------------------------------------------------

class TokenError(Exception):
    def __init__(self, status, code, description, basic_challenge=False):
        super().__init__(description)
        self.status = status
        self.code = code
        self.description = description
        self.basic_challenge = basic_challenge


def media_type(value):
    return value.split(";", 1)[0].strip().lower() if value else ""


def parse_form(body):
    """application/x-www-form-urlencoded (RFC 6749 Appendix B) -> dict.
    RFC 6749 3.2: a parameter sent without a value is treated as omitted; a
    parameter must not appear more than once."""
    try:
        text = body.decode("ascii")
        pairs = parse_qsl(text, keep_blank_values=True, encoding="utf-8",
                          errors="strict")
    except (UnicodeDecodeError, ValueError):
        raise TokenError(400, "invalid_request", "body is not valid form-urlencoded UTF-8")
    params = {}
    for name, value in pairs:
        if value == "":
            continue
        if name in params:
            raise TokenError(400, "invalid_request", "parameter %r repeated" % name)
        params[name] = value
    return params


def parse_basic(value):
    """Authorization: Basic b64(urlenc(id) ":" urlenc(secret)) -> (id, secret)
    (RFC 6749 2.3.1 + RFC 7617).  Raises TokenError invalid_client."""
    scheme, _, cred = value.strip().partition(" ")
    cred = cred.strip()
    try:
        raw = base64.b64decode(cred, validate=True).decode("utf-8")
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise TokenError(401, "invalid_client", "malformed Basic credentials", True)
    user, sep, password = raw.partition(":")
    if not sep:
        raise TokenError(401, "invalid_client", "malformed Basic credentials", True)
    try:
        return (unquote_plus(user, errors="strict"),
                unquote_plus(password, errors="strict"))
    except UnicodeDecodeError:
        raise TokenError(401, "invalid_client", "malformed Basic credentials", True)


def check_token_request(headers, body):
    """Validate a token request.  Records the stats that are known at arrival.
    Returns the requested scope (str or None); raises TokenError."""
    ctype = headers.get("Content-Type")
    auth_values = headers.get_all("Authorization") or []
    uses_header = bool(auth_values)
    uses_basic = (len(auth_values) == 1 and
                  auth_values[0].strip().partition(" ")[0].lower() == "basic")
    with STATE.lock:
        STATE.last_content_type = ctype
        if uses_basic:
            STATE.auth_methods["basic"] += 1
    if media_type(ctype) != FORM_TYPE:
        raise TokenError(400, "invalid_request",
                         "Content-Type must be " + FORM_TYPE)
    params = parse_form(body)
    uses_body = "client_id" in params or "client_secret" in params
    if uses_body:
        with STATE.lock:
            STATE.auth_methods["body"] += 1
    # RFC 6749 2.3: the client MUST NOT use more than one authentication method.
    if uses_header and uses_body:
        raise TokenError(400, "invalid_request",
                         "more than one client authentication method used")
    if "grant_type" not in params:
        raise TokenError(400, "invalid_request", "grant_type is required")

    # Client authentication (RFC 6749 2.3.1).
    if uses_header:
        if not uses_basic:
            raise TokenError(401, "invalid_client",
                             "unsupported client authentication method", True)
        cid, secret = parse_basic(auth_values[0])
    elif uses_body:
        cid, secret = params.get("client_id"), params.get("client_secret")
    else:
        raise TokenError(401, "invalid_client", "no client authentication", True)
    ok_id = cid is not None and secrets.compare_digest(
        cid.encode("utf-8"), STATE.client_id.encode("utf-8"))
    ok_secret = secret is not None and secrets.compare_digest(
        secret.encode("utf-8"), STATE.client_secret.encode("utf-8"))
    if not (ok_id and ok_secret):
        raise TokenError(401, "invalid_client", "client authentication failed", True)

    if params["grant_type"] != "client_credentials":
        raise TokenError(400, "unsupported_grant_type",
                         "only client_credentials is supported")
    scope = params.get("scope")
    if scope is not None:
        tokens = scope.split(" ")
        if not all(SCOPE_TOKEN_RE.fullmatch(t) for t in tokens):
            raise TokenError(400, "invalid_scope", "malformed scope")
        if STATE.scope is not None and not set(tokens) <= STATE.scope:
            raise TokenError(400, "invalid_scope", "scope exceeds the client's scope")
    return scope


# --------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT
    server_version = "oauth_erp_target/1"
    sys_version = ""

    def log_message(self, *args):
        pass

    # ---- output ----------------------------------------------------------

    def answer(self, status, obj, headers=(), close=False):
        body = json.dumps(obj).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        if close:
            self.close_connection = True
        self.send_header("Connection", "close" if self.close_connection else "keep-alive")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_error(self, code, message=None, explain=None):
        """Used by http.server for a malformed request line / header, an
        over-long line (414/431) or an unknown method (501): JSON, then close."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":
            self.request_version = "HTTP/1.1"   # HTTP/0.9 is not served: always send a head
        try:
            self.answer(code, {"error": message or self.responses.get(code, ("",))[0]},
                        close=True)
        except OSError:
            pass

    # ---- input -----------------------------------------------------------

    def read_body(self):
        te = self.headers.get_all("Transfer-Encoding") or []
        cl = self.headers.get_all("Content-Length") or []
        if te:
            if cl:
                raise BadRequest("both Transfer-Encoding and Content-Length")
            codings = [c.strip().lower() for v in te for c in v.split(",") if c.strip()]
            if codings != ["chunked"]:
                raise BadRequest("only the chunked transfer coding is supported")
            return self.read_chunked()
        if not cl:
            return b""
        values = {v.strip() for v in ",".join(cl).split(",")}
        if len(values) != 1:
            raise BadRequest("conflicting Content-Length")
        value = values.pop()
        if not (value.isascii() and value.isdigit()):
            raise BadRequest("invalid Content-Length")
        length = int(value)
        if length > MAX_BODY:
            raise BadRequest("body too large")
        data = self.rfile.read(length)
        if len(data) != length:
            raise ConnectionError("peer closed mid-body")
        return data

    def read_chunked(self):
        body = bytearray()
        while True:
            line = self.rfile.readline(MAX_CHUNK_LINE + 1)
            if not line.endswith(b"\r\n"):
                raise BadRequest("bad chunk-size line")
            size = line[:-2].split(b";", 1)[0].strip(b" \t")
            if not size or any(c not in b"0123456789abcdefABCDEF" for c in size):
                raise BadRequest("bad chunk size")
            n = int(size, 16)
            if n == 0:
                break
            if len(body) + n > MAX_BODY:
                raise BadRequest("body too large")
            data = self.rfile.read(n + 2)
            if len(data) != n + 2 or data[-2:] != b"\r\n":
                raise BadRequest("bad chunk data")
            body += data[:-2]
        while True:                       # trailer section, discarded
            line = self.rfile.readline(MAX_CHUNK_LINE + 1)
            if line == b"\r\n":
                return bytes(body)
            if not line.endswith(b"\r\n"):
                raise BadRequest("bad trailer")

    # ---- dispatch --------------------------------------------------------

    def dispatch(self):
        try:
            body = self.read_body()
        except BadRequest as exc:
            return self.answer(400, {"error": str(exc)}, close=True)
        except (ConnectionError, OSError):
            self.close_connection = True
            return
        parts = urlsplit(self.path)
        path, query = parts.path, parts.query
        method = self.command

        routes = {
            "/oauth/token": {"POST": self.token},
            "/erp/orders": {"POST": self.create_order, "GET": self.find_orders},
            "/_target/stats": {"GET": self.ctl_stats},
            "/_target/revoke": {"POST": self.ctl_revoke},
            "/_target/config": {"POST": self.ctl_config, "GET": self.ctl_get_config},
            "/_target/reset": {"POST": self.ctl_reset},
        }
        methods = routes.get(path)
        if methods is None:
            return self.answer(404, {"error": "not found", "path": path})
        fn = methods.get(method)
        if fn is None:
            return self.answer(405, {"error": "method not allowed"},
                               [("Allow", ", ".join(sorted(methods)))])
        return fn(body, query)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = dispatch

    # ---- token endpoint --------------------------------------------------

    def token(self, body, query):
        with STATE.lock:
            STATE.token_requests += 1
            STATE.token_in_flight += 1
            STATE.max_concurrent = max(STATE.max_concurrent, STATE.token_in_flight)
            delay_ms = STATE.config["token_delay_ms"]
        self.in_flight = True
        try:
            self._token(body, delay_ms)
        finally:
            if self.in_flight:            # only if _token() failed before deciding
                with STATE.lock:
                    self.leave_token_request()

    def leave_token_request(self):
        """The request stops being "in progress" once its answer is decided,
        *before* the answer is written: otherwise a client that sends its next
        request as soon as it has read this answer could be counted as
        concurrent with it.  The caller holds STATE.lock."""
        if self.in_flight:
            self.in_flight = False
            STATE.token_in_flight -= 1

    def _token(self, body, delay_ms):
        no_cache = [("Cache-Control", "no-store"), ("Pragma", "no-cache")]
        try:
            scope = check_token_request(self.headers, body)
            error = None
        except TokenError as exc:
            error = exc
        if delay_ms:
            time.sleep(delay_ms / 1000.0)
        with STATE.lock:
            self.leave_token_request()
            fail = STATE.config["fail_token"]
            if fail == "close":
                STATE.token_errors["close"] = STATE.token_errors.get("close", 0) + 1
            elif fail == "invalid_client":
                error = TokenError(401, "invalid_client", "injected failure", True)
            elif fail == "server_error":
                error = TokenError(500, "server_error", "injected failure")
            if fail != "close" and error is not None:
                STATE.token_errors[error.code] = STATE.token_errors.get(error.code, 0) + 1
            if fail is None and error is None:
                token = secrets.token_urlsafe(32)
                STATE.token_seq += 1
                STATE.tokens_issued += 1
                ttl = STATE.config["token_ttl"]
                STATE.tokens[token] = {"index": STATE.token_seq, "ttl": ttl,
                                       "issued": time.monotonic(), "revoked": False}
        if fail == "close":
            self.close_connection = True      # no response byte at all (FIN)
            return
        if error is not None:
            extra = list(no_cache)
            if error.basic_challenge:
                extra.append(("WWW-Authenticate", 'Basic realm="oauth"'))
            return self.answer(error.status, {"error": error.code,
                                              "error_description": error.description},
                               extra)
        obj = {"access_token": token, "token_type": "Bearer", "expires_in": ttl}
        if scope is not None:
            obj["scope"] = scope
        return self.answer(200, obj, no_cache)

    # ---- protected API (RFC 6750) ----------------------------------------

    def authorise(self):
        """-> token index, or None after answering 401 (lock NOT held)."""
        values = self.headers.get_all("Authorization") or []
        scheme, _, cred = (values[0].strip().partition(" ") if values else ("", "", ""))
        cred = cred.strip()
        if not values or (len(values) == 1 and scheme.lower() != "bearer"):
            # No credentials (or an unsupported scheme): no error code, 6750 3.1.
            challenge, reason = 'Bearer realm="%s"' % BEARER_REALM, "no bearer token"
        else:
            reason = None
            with STATE.lock:
                if len(values) != 1 or not B64TOKEN_RE.fullmatch(cred):
                    reason = "malformed bearer credentials"
                else:
                    info = STATE.tokens.get(cred)
                    if info is None:
                        reason = "unknown token"
                    elif info["revoked"]:
                        reason = "token revoked"
                    elif time.monotonic() - info["issued"] >= info["ttl"]:
                        reason = "token expired"
                    else:
                        idx = info["index"]
                        STATE.orders_by_token[idx] = STATE.orders_by_token.get(idx, 0) + 1
                        return idx
            challenge = 'Bearer realm="%s", error="invalid_token"' % BEARER_REALM
        with STATE.lock:
            STATE.unauthorized += 1
        self.answer(401, {"error": "invalid_token", "error_description": reason},
                    [("WWW-Authenticate", challenge)])
        return None

    def create_order(self, body, query):
        if self.authorise() is None:
            return
        try:
            data = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return self.answer(400, {"error": "body is not valid JSON"})
        if not isinstance(data, dict):
            return self.answer(400, {"error": "body must be a JSON object"})
        ref = data.get("ref")
        if not isinstance(ref, str):
            return self.answer(422, {"error": "ref required"})
        with STATE.lock:
            oid = "ORD-%d" % (len(STATE.orders) + 1)
            STATE.orders.append({"id": oid, "ref": ref})
            STATE.orders_by_ref[ref] = STATE.orders_by_ref.get(ref, 0) + 1
        return self.answer(201, {"id": oid, "ref": ref})

    def find_orders(self, body, query):
        if self.authorise() is None:
            return
        refs = parse_qs(query, keep_blank_values=True).get("ref")
        if refs is None:
            return self.answer(400, {"error": "ref query parameter required"})
        with STATE.lock:
            items = [dict(o) for o in STATE.orders if o["ref"] == refs[0]]
        return self.answer(200, {"items": items})

    # ---- control routes (no auth, never counted) --------------------------

    def ctl_stats(self, body, query):
        with STATE.lock:
            obj = STATE.stats()
        return self.answer(200, obj)

    def ctl_revoke(self, body, query):
        with STATE.lock:
            n = 0
            for info in STATE.tokens.values():
                if not info["revoked"]:
                    info["revoked"] = True
                    n += 1
        return self.answer(200, {"revoked": n})

    def ctl_get_config(self, body, query):
        with STATE.lock:
            obj = STATE.config_json()
        return self.answer(200, obj)

    def ctl_config(self, body, query):
        try:
            data = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return self.answer(400, {"error": "body is not valid JSON"})
        if not isinstance(data, dict):
            return self.answer(400, {"error": "body must be a JSON object"})
        try:
            changes = validate_config(data)
        except ValueError as exc:
            return self.answer(400, {"error": str(exc)})
        with STATE.lock:
            STATE.config.update(changes)
            obj = STATE.config_json()
        return self.answer(200, obj)

    def ctl_reset(self, body, query):
        with STATE.lock:
            STATE.clear()
            obj = STATE.stats()
        return self.answer(200, obj)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256          # many clients connect at once

    def __init__(self, family, address):
        self.address_family = family
        super().__init__(address, Handler)

    def server_bind(self):
        # HTTPServer.server_bind() would call socket.getfqdn() (a DNS lookup).
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request, client_address):
        pass                          # peer resets etc. are not interesting


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

class _Stop(BaseException):
    """Raised from the signal handler to leave serve_forever().  Not an Exception, so
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
        sys.exit("oauth_erp_target: --host must be a loopback IP address or localhost")
    if not addr.is_loopback:
        sys.exit("oauth_erp_target: refusing to bind non-loopback address %s" % host)
    return (socket.AF_INET6 if addr.version == 6 else socket.AF_INET), host


def non_negative_int(text):
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return v


def main(argv=None):
    ap = argparse.ArgumentParser(description="Independent OAuth2 client-credentials test target")
    ap.add_argument("--client-id", required=True)
    ap.add_argument("--client-secret", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--token-ttl", type=non_negative_int, default=3600,
                    help="token lifetime in seconds (default 3600)")
    ap.add_argument("--token-delay-ms", type=non_negative_int, default=0,
                    help="sleep before answering a token request (default 0)")
    ap.add_argument("--scope", default=None,
                    help="space-delimited scopes the client may ask for")
    args = ap.parse_args(argv)
    family, host = loopback(args.host)
    scope = None
    if args.scope is not None:
        scope = set(args.scope.split(" "))
        if not all(SCOPE_TOKEN_RE.fullmatch(t) for t in scope):
            sys.exit("oauth_erp_target: malformed --scope")

    global STATE
    STATE = State(args.client_id, args.client_secret, args.token_ttl,
                  args.token_delay_ms, scope)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    server = None
    try:
        server = Server(family, (host, args.port))
        sys.stdout.write("PORT %d\n" % server.server_address[1])
        sys.stdout.flush()
        server.serve_forever(poll_interval=0.2)
    except _Stop:
        pass
    finally:
        if server is not None:
            server.socket.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)                       # connection threads are daemons; do not wait


if __name__ == "__main__":
    main()
