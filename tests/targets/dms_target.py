#!/usr/bin/env python3
"""Independent document-store (DMS) test target.

A small in-memory "document management system" that accepts uploads as
multipart/form-data, as raw binary bodies and as
application/x-www-form-urlencoded forms, with per-route fault injection.  It
is an outside system for the workflow engine's upload tests and shares no
code or assumptions with the engine or with the other targets in this
directory.  It was written from:

  * RFC 9112 (HTTP/1.1 message syntax and framing, chunked request bodies),
  * RFC 7578 (multipart/form-data),
  * RFC 2046 section 5.1 (multipart syntax and boundaries),
  * the WHATWG URL standard's application/x-www-form-urlencoded parser,

using only the Python 3.11 standard library.  HTTP is spoken on raw sockets,
one daemon thread per connection, so that the bytes written and the way a
connection ends (FIN or RST) are fully controlled.  Multipart bodies are
parsed by the standard library's ``email`` package
(``email.parser.BytesFeedParser`` with ``email.policy.HTTP``), fed with a
synthesized ``Content-Type: ...`` header followed by the request body as it
arrives from the socket.

Memory: only metadata is kept per document (sha256, size, filename, fields,
content type, idempotency key, first 64 bytes).  Raw (PUT) bodies are hashed
chunk by chunk and never held whole (a 100 MiB PUT peaks at ~25 MB RSS).  A
multipart body, however, is held by the ``email`` parser until the request is
complete (as text lines, then as the joined file part): a 100 MiB random
binary file part peaked at ~540 MB RSS and took 5-8 s.  It is released when
the request has been answered (the allocator may keep some of it).

Known properties of the ``email`` multipart parser (documented, not fixed):
a delimiter line is recognised after a bare CR or LF as well as after CRLF,
and a line "--<boundary>" followed by other text is treated as content.
Parts typed multipart/* or message/* are parsed as nested messages by
``email``, so they are rejected (400 unsupported_part_type).

Usage:
    python3 dms_target.py [--host 127.0.0.1] [--port 0] [--max-body-mb 256]

Once listening it prints one line ``PORT <n>`` (flushed) and serves until
SIGTERM or SIGINT, then exits with status 0.
"""

import argparse
import hashlib
import ipaddress
import json
import os
import re
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections import deque
from email import policy as email_policy
from email.parser import BytesFeedParser
from email.utils import formatdate
from http import HTTPStatus
from urllib.parse import parse_qs, unquote, urlsplit

# --------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------

MAX_HEAD = 64 * 1024               # request line + fields + blank line
MAX_CHUNK_LINE = 4096              # one chunk-size line incl. extensions
MAX_TRAILERS = 64 * 1024
CONTROL_BODY_LIMIT = 1024 * 1024   # bodies of /_target/* requests
RECV_SIZE = 256 * 1024
IDLE_TIMEOUT = 60.0                # seconds without any byte from the client
DRAIN_SECONDS = 1.0                # graceful close: how long to drain input
DRAIN_BYTES = 64 * 1024 * 1024
LOG_KEEP = 100                     # entries kept in stats["requests"]
HEAD_KEEP = 64                     # leading file bytes kept per document
MAX_STALL_MS = 600000

# Fault route names.
FAULT_ROUTES = ("upload", "raw", "form", "search", "delete")

# Statuses the target produces itself when it rejects a request
# (counted in stats["bad_requests"]; injected statuses are not).
REJECT_STATUSES = frozenset((400, 413, 415, 431, 501, 505))

_TCHARS = r"!#$%&'*+\-.^_`|~0-9A-Za-z"
TOKEN_RE = re.compile(rb"[" + _TCHARS.encode() + rb"]+")
REQUEST_LINE_RE = re.compile(
    rb"([" + _TCHARS.encode() + rb"]+) ([\x21-\x7e]+) HTTP/([0-9])\.([0-9])")
HEX_RE = re.compile(rb"[0-9A-Fa-f]+")
DIGITS_RE = re.compile(r"[0-9]+")
# RFC 2046 5.1.1: boundary := 0*69<bchars> bcharsnospace
BOUNDARY_RE = re.compile(r"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")
SHAPE_RE = re.compile(
    r"(?P<plain>ok|close_before_bytes|reset|partial_headers)"
    r"|stall_ms:(?P<stall>[0-9]{1,7})"
    r"|status:(?P<status>[0-9]{3})")
IDENTITY_CTES = ("7bit", "8bit", "binary")


def reason_phrase(code):
    try:
        return HTTPStatus(code).phrase
    except ValueError:
        return "Status %d" % code


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------

class HttpError(Exception):
    """A framing-level rejection: answered, then the connection is closed
    (after a framing error the start of the next request is unknown)."""

    def __init__(self, status, message, problem):
        super().__init__(message)
        self.status = status
        self.message = message
        self.problem = problem
        self.req = None        # set when the head had been parsed


class ClientGone(Exception):
    """EOF in the middle of a message."""


# --------------------------------------------------------------------------
# Socket input
# --------------------------------------------------------------------------

class Input:
    """Buffered socket input.  Bytes after the current message stay in the
    buffer, so pipelined requests are read in order."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()

    def _more(self):
        data = self.sock.recv(RECV_SIZE)
        if not data:
            return False
        self.buf += data
        return True

    def head(self):
        """The request head without its final CRLF CRLF, or None on a clean
        EOF before any byte of a new request."""
        while True:
            # RFC 9112 2.2: ignore empty lines before the request-line.
            while self.buf.startswith(b"\r\n"):
                del self.buf[:2]
            end = self.buf.find(b"\r\n\r\n")
            if end >= 0:
                if end + 4 > MAX_HEAD:
                    raise HttpError(431, "request head larger than 64 KiB", "head_too_large")
                out = bytes(self.buf[:end])
                del self.buf[:end + 4]
                return out
            if len(self.buf) >= MAX_HEAD:
                raise HttpError(431, "request head larger than 64 KiB", "head_too_large")
            if not self._more():
                if self.buf.strip(b"\r\n"):
                    raise ClientGone()
                return None

    def line(self, limit):
        while True:
            end = self.buf.find(b"\r\n")
            if end >= 0:
                if end > limit:
                    raise HttpError(400, "line too long in chunked body", "bad_chunk")
                out = bytes(self.buf[:end])
                del self.buf[:end + 2]
                return out
            if len(self.buf) > limit + 2:
                raise HttpError(400, "line too long in chunked body", "bad_chunk")
            if not self._more():
                raise ClientGone()

    def some(self, limit):
        """Between 1 and `limit` bytes (limit > 0)."""
        if self.buf:
            n = min(limit, len(self.buf))
            out = bytes(self.buf[:n])
            del self.buf[:n]
            return out
        data = self.sock.recv(min(limit, RECV_SIZE))
        if not data:
            raise ClientGone()
        return data

    def exact(self, n):
        while len(self.buf) < n:
            if not self._more():
                raise ClientGone()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


# --------------------------------------------------------------------------
# Requests (RFC 9112 sections 2-7)
# --------------------------------------------------------------------------

class Request:
    def __init__(self, method, target, version, fields):
        self.method = method
        self.target = target
        self.version = version                # (major, minor)
        self.fields = fields                  # [(lower-case name, value str)]
        self.path = ""
        self.segments = []
        self.query = {}
        self.chunked = False
        self.size = 0                         # decoded body bytes read
        key = self.get("idempotency-key")
        self.idempotency_key = key if key else None
        self.content_type = self.get("content-type")

    def get_all(self, name):
        return [v for n, v in self.fields if n == name]

    def get(self, name):
        values = self.get_all(name)
        return values[0] if values else None

    def tokens(self, name):
        out = []
        for value in self.get_all(name):
            out.extend(t.strip().lower() for t in value.split(",") if t.strip())
        return out

    @property
    def keep_alive(self):
        if self.version < (1, 1):
            return False
        return "close" not in self.tokens("connection")

    @property
    def expects_continue(self):
        return self.version >= (1, 1) and "100-continue" in self.tokens("expect")


def parse_head(head):
    lines = head.split(b"\r\n")
    if any(b"\r" in ln or b"\n" in ln for ln in lines):
        raise HttpError(400, "bare CR or LF in the request head", "bad_head")
    m = REQUEST_LINE_RE.fullmatch(lines[0])
    if not m:
        raise HttpError(400, "malformed request line", "bad_request_line")
    version = (int(m.group(3)), int(m.group(4)))
    if version[0] != 1:
        raise HttpError(505, "only HTTP/1.x is supported", "bad_version")
    fields = []
    for ln in lines[1:]:
        if ln[:1] in (b" ", b"\t"):
            raise HttpError(400, "obsolete line folding in the request head", "bad_header")
        name, colon, value = ln.partition(b":")
        if not colon or not TOKEN_RE.fullmatch(name):
            raise HttpError(400, "malformed header field", "bad_header")
        value = value.strip(b" \t")
        if any(c < 0x20 and c != 0x09 or c == 0x7f for c in value):
            raise HttpError(400, "control character in a header value", "bad_header")
        fields.append((name.decode("ascii").lower(), value.decode("latin-1")))
    req = Request(m.group(1).decode("ascii"), m.group(2).decode("ascii"), version, fields)
    try:
        target = req.target
        if target.startswith("/"):
            path, _, query = target.partition("?")
        elif target.lower().startswith(("http://", "https://")):
            parts = urlsplit(target)             # absolute-form, RFC 9112 3.2.2
            path, query = parts.path or "/", parts.query
        else:
            raise HttpError(400, "unsupported request-target form", "bad_target")
        # Each segment is percent-decoded on its own, so %2F stays inside it.
        req.path = path
        req.segments = [unquote(s) for s in path.split("/")[1:]]
        req.query = parse_qs(query, keep_blank_values=True)
        if version >= (1, 1) and len(req.get_all("host")) != 1:
            raise HttpError(400, "an HTTP/1.1 request needs exactly one Host", "bad_host")
    except HttpError as exc:
        exc.req = req
        raise
    return req


def body_framing(req, limit):
    """-> ("chunked", None) or ("length", n); RFC 9112 6.1-6.3."""
    te = req.get_all("transfer-encoding")
    cl = req.get_all("content-length")
    if te:
        if req.version < (1, 1):
            raise HttpError(400, "Transfer-Encoding in an HTTP/1.0 request", "bad_framing")
        if cl:
            raise HttpError(400, "both Transfer-Encoding and Content-Length", "bad_framing")
        codings = req.tokens("transfer-encoding")
        if not codings or codings[-1] != "chunked":
            raise HttpError(400, "the final transfer coding is not chunked", "bad_framing")
        if len(codings) > 1:
            raise HttpError(501, "only the chunked transfer coding is supported", "bad_framing")
        return "chunked", None
    if cl:
        values = [v.strip() for v in ",".join(cl).split(",")]
        if not all(DIGITS_RE.fullmatch(v) for v in values) or len(set(values)) != 1:
            raise HttpError(400, "invalid Content-Length", "bad_framing")
        n = int(values[0])
        if n > limit:
            raise HttpError(413, "request body larger than %d bytes" % limit, "body_too_large")
        return "length", n
    return "length", 0


def read_body(inp, sock, req, limit, feed):
    """Read the body and pass it to feed(bytes) piece by piece."""
    mode, length = body_framing(req, limit)
    if req.expects_continue and (mode == "chunked" or length > 0):
        sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
    if mode == "length":
        remaining = length
        while remaining:
            data = inp.some(remaining)
            remaining -= len(data)
            req.size += len(data)
            feed(data)
        return
    req.chunked = True
    while True:
        line = inp.line(MAX_CHUNK_LINE)
        size_text = line.split(b";", 1)[0].rstrip(b" \t")
        if not HEX_RE.fullmatch(size_text):
            raise HttpError(400, "invalid chunk size line", "bad_chunk")
        size = int(size_text, 16)
        if size == 0:
            break
        if req.size + size > limit:
            raise HttpError(413, "request body larger than %d bytes" % limit, "body_too_large")
        while size:
            data = inp.some(size)
            size -= len(data)
            req.size += len(data)
            feed(data)
        if inp.exact(2) != b"\r\n":
            raise HttpError(400, "chunk data not followed by CRLF", "bad_chunk")
    total = 0
    while True:                                   # trailer section
        line = inp.line(MAX_TRAILERS)
        if not line:
            return
        total += len(line) + 2
        if total > MAX_TRAILERS:
            raise HttpError(431, "trailer section too large", "head_too_large")
        name, colon, _ = line.partition(b":")
        if not colon or not TOKEN_RE.fullmatch(name):
            raise HttpError(400, "malformed trailer field", "bad_chunk")


# --------------------------------------------------------------------------
# Responses
# --------------------------------------------------------------------------

class Response:
    def __init__(self, status, body=None, headers=()):
        self.status = status
        self.body = body
        self.headers = list(headers)
        self.data = b""

    def freeze(self):
        """Serialise now (called with the state lock held)."""
        if self.status not in (204, 304) and self.body is not None:
            self.data = json.dumps(self.body).encode("utf-8")
        return self

    def lines(self, keep_alive):
        out = ["HTTP/1.1 %d %s" % (self.status, reason_phrase(self.status))]
        if self.status not in (204, 304):
            out.append("Content-Type: application/json")
            out.append("Content-Length: %d" % len(self.data))
        out.append("Connection: %s" % ("keep-alive" if keep_alive else "close"))
        out.append("Date: %s" % formatdate(usegmt=True))
        out.extend("%s: %s" % hv for hv in self.headers)
        return out


def problem(status, problem_code, message, **extra):
    body = {"error": message, "problem": problem_code}
    body.update(extra)
    return Response(status, body)


# --------------------------------------------------------------------------
# Body sinks
# --------------------------------------------------------------------------

class Discard:
    def feed(self, data):
        pass


class Buffer:
    def __init__(self):
        self.data = bytearray()

    def feed(self, data):
        self.data += data


class Digest:
    """Streaming sha256 + size + leading bytes; the body is never stored."""

    def __init__(self):
        self.sha = hashlib.sha256()
        self.size = 0
        self.head = b""

    def feed(self, data):
        self.sha.update(data)
        self.size += len(data)
        if len(self.head) < HEAD_KEEP:
            self.head += data[:HEAD_KEEP - len(self.head)]


class MultipartFeed:
    """Feeds the email parser a synthesized header, then the body as it
    arrives."""

    def __init__(self, content_type):
        self.parser = BytesFeedParser(policy=email_policy.HTTP)
        self.parser.feed(b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n")
        self.failure = None

    def feed(self, data):
        if self.failure is None:
            try:
                self.parser.feed(data)
            except Exception as exc:          # the parser should never raise
                self.failure = "%s: %s" % (type(exc).__name__, exc)

    def close(self):
        parser, self.parser = self.parser, None
        if self.failure is None:
            try:
                return parser.close()
            except Exception as exc:
                self.failure = "%s: %s" % (type(exc).__name__, exc)
        return None


def parse_media_type(value):
    """-> (lower-case type/subtype, params dict, defects) via email's header
    registry, or (None, {}, []) if there is no value."""
    if value is None:
        return None, {}, []
    try:
        header = email_policy.HTTP.header_factory("content-type", value)
        return header.content_type, dict(header.params), list(header.defects)
    except Exception as exc:                    # should not happen
        return "invalid/invalid", {}, [exc]


def defect_names(defects):
    return sorted({type(d).__name__ for d in defects})


# --------------------------------------------------------------------------
# multipart/form-data analysis (RFC 7578)
# --------------------------------------------------------------------------

class Rejected(Exception):
    def __init__(self, status, problem_code, message):
        super().__init__(message)
        self.response = problem(status, problem_code, message)


def analyse_form_data(msg):
    """-> (file_bytes, filename, file_content_type, fields) or raise Rejected."""
    if msg.defects:
        raise Rejected(400, "malformed_multipart",
                       "malformed multipart body: " + ", ".join(defect_names(msg.defects)))
    if not msg.is_multipart():
        raise Rejected(400, "malformed_multipart", "no body parts found")
    files = []
    fields = {}
    for index, part in enumerate(msg.get_payload(), 1):
        where = "part %d" % index
        if part.defects:
            raise Rejected(400, "malformed_multipart", "%s is malformed: %s"
                           % (where, ", ".join(defect_names(part.defects))))
        dispositions = part.get_all("content-disposition") or []
        if len(dispositions) != 1:
            raise Rejected(400, "bad_content_disposition",
                           "%s needs exactly one Content-Disposition header" % where)
        cd = dispositions[0]
        bad = [d for d in cd.defects if type(d).__name__ != "UndecodableBytesDefect"]
        if bad:
            raise Rejected(400, "bad_content_disposition", "%s has a malformed "
                           "Content-Disposition: %s" % (where, ", ".join(defect_names(bad))))
        if (cd.content_disposition or "").lower() != "form-data":
            raise Rejected(400, "bad_content_disposition",
                           "%s: disposition must be form-data" % where)
        params = dict(cd.params)
        name = params.get("name")
        if name is None:
            raise Rejected(400, "bad_content_disposition", "%s has no name parameter" % where)
        where = "part %d (%r)" % (index, name)
        ct_headers = part.get_all("content-type") or []
        if len(ct_headers) > 1:
            raise Rejected(400, "bad_part_content_type", "%s has several Content-Type headers" % where)
        ct = ct_headers[0] if ct_headers else None
        if ct is not None and ct.defects:
            raise Rejected(400, "bad_part_content_type", "%s has a malformed Content-Type: %s"
                           % (where, ", ".join(defect_names(ct.defects))))
        if ct is not None and ct.maintype in ("multipart", "message"):
            # email parses these as nested messages; RFC 7578 4.3 deprecates
            # multipart/mixed inside form-data.  Not supported by this target.
            raise Rejected(400, "unsupported_part_type",
                           "%s: Content-Type %s is not supported" % (where, ct.content_type))
        cte = part.get("content-transfer-encoding")
        if cte is not None and str(cte).strip().lower() not in IDENTITY_CTES:
            # RFC 7578 4.7: senders MUST NOT use a Content-Transfer-Encoding.
            raise Rejected(400, "content_transfer_encoding",
                           "%s: Content-Transfer-Encoding %s is not accepted" % (where, cte))
        data = part.get_payload(decode=True)      # identity CTE: the exact bytes
        if data is None:
            data = b""
        if name == "file":
            files.append((data, params.get("filename"), ct))
            continue
        if "filename" in params:
            raise Rejected(400, "unexpected_file_part",
                           "%s has a filename; the only file part must be named 'file'" % where)
        charset = (ct.params.get("charset") if ct is not None else None) or "utf-8"
        try:
            value = data.decode(charset)
        except LookupError:
            raise Rejected(400, "bad_field", "%s: unknown charset %r" % (where, charset))
        except UnicodeDecodeError:
            raise Rejected(400, "bad_field", "%s: value is not valid %s" % (where, charset))
        if name in fields:
            raise Rejected(400, "duplicate_field", "field %r occurs more than once" % name)
        fields[name] = value
    if not files:
        raise Rejected(400, "missing_file_part", "no part named 'file'")
    if len(files) > 1:
        raise Rejected(400, "duplicate_file_part", "%d parts named 'file'" % len(files))
    data, filename, ct = files[0]
    if not filename:
        raise Rejected(400, "missing_filename", "the 'file' part has no (or an empty) filename")
    if ct is None:
        raise Rejected(400, "missing_file_content_type", "the 'file' part has no Content-Type")
    return data, filename, str(ct), fields


# --------------------------------------------------------------------------
# State
# --------------------------------------------------------------------------

class State:
    """All mutable state; every access holds self.lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.clear()

    def clear(self):
        self.docs = {}            # id -> metadata (insertion order = age)
        self.doc_seq = 0
        self.forms = {}
        self.form_seq = 0
        self.uploads = 0
        self.by_sha256 = {}
        self.deletes = 0
        self.bad_requests = 0
        self.log = deque(maxlen=LOG_KEEP)
        self.requests_total = 0
        self.faults = {r: deque() for r in FAULT_ROUTES}

    def take_shape(self, route):
        queue = self.faults[route]
        return queue.popleft() if queue else "ok"

    def add_document(self, meta):
        self.doc_seq += 1
        doc_id = "DOC-%d" % self.doc_seq
        meta = dict(meta, id=doc_id, location="/dms/documents/" + doc_id)
        self.docs[doc_id] = {"meta": meta, "deleted": False}
        self.uploads += 1
        self.by_sha256[meta["sha256"]] = self.by_sha256.get(meta["sha256"], 0) + 1
        return meta

    def live(self):
        return [d["meta"] for d in self.docs.values() if not d["deleted"]]


def document_created(meta, keys):
    body = {k: meta[k] for k in keys}
    return Response(201, body, [("Location", meta["location"])])


# --------------------------------------------------------------------------
# Operations: one object per request; sink receives the body, finish()
# runs outside the lock and returns (response, commit) where commit, if not
# None, is called with the lock held and returns the response.
# --------------------------------------------------------------------------

class Operation:
    fault_route = None
    control = False

    def __init__(self, server, req, params):
        self.server = server
        self.req = req
        self.params = params
        self.limit = CONTROL_BODY_LIMIT if self.control else server.max_body
        self.sink = Discard()

    def finish(self):
        raise NotImplementedError


class Fixed(Operation):
    def __init__(self, server, req, params, response, control=False):
        self.control = control
        super().__init__(server, req, params)
        self.response = response

    def finish(self):
        return self.response, None


class Upload(Operation):
    fault_route = "upload"

    def __init__(self, server, req, params):
        super().__init__(server, req, params)
        self.early = None
        mtype, mparams, defects = parse_media_type(req.content_type)
        boundary = mparams.get("boundary")
        if mtype != "multipart/form-data":
            self.early = problem(415, "unsupported_media_type",
                                 "Content-Type must be multipart/form-data",
                                 content_type=req.content_type)
        elif not boundary:
            self.early = problem(400, "missing_boundary",
                                 "multipart/form-data without a boundary parameter")
        elif not BOUNDARY_RE.fullmatch(boundary):
            self.early = problem(400, "invalid_boundary",
                                 "boundary is not valid per RFC 2046 5.1.1", boundary=boundary)
        elif defects:
            self.early = problem(400, "bad_content_type", "malformed Content-Type: "
                                 + ", ".join(defect_names(defects)))
        else:
            self.sink = MultipartFeed(req.content_type)

    def finish(self):
        if self.early is not None:
            return self.early, None
        msg = self.sink.close()
        failure = self.sink.failure
        self.sink = None
        if msg is None:
            return problem(400, "malformed_multipart", "multipart parser failed: %s" % failure), None
        try:
            data, filename, file_type, fields = analyse_form_data(msg)
        except Rejected as exc:
            return exc.response, None
        finally:
            del msg
        meta = {
            "kind": "multipart",
            "name": None,
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
            "filename": filename,
            "content_type": file_type,
            "fields": fields,
            "idempotency_key": self.req.idempotency_key,
            "head_hex": data[:HEAD_KEEP].hex(),
            "chunked": self.req.chunked,
        }
        del data

        def commit(state):
            created = state.add_document(meta)
            return document_created(created, ("id", "location", "sha256", "size", "filename",
                                              "content_type", "fields"))
        return None, commit


class RawPut(Operation):
    fault_route = "raw"

    def __init__(self, server, req, params):
        super().__init__(server, req, params)
        self.sink = Digest()

    def finish(self):
        d = self.sink
        meta = {
            "kind": "raw",
            "name": self.params[0],
            "sha256": d.sha.hexdigest(),
            "size": d.size,
            "filename": None,
            "content_type": self.req.content_type,
            "fields": {},
            "idempotency_key": self.req.idempotency_key,
            "head_hex": d.head.hex(),
            "chunked": self.req.chunked,
        }

        def commit(state):
            created = state.add_document(meta)
            return document_created(created, ("id", "location", "sha256", "size",
                                              "content_type", "name"))
        return None, commit


class FormPost(Operation):
    fault_route = "form"

    def __init__(self, server, req, params):
        super().__init__(server, req, params)
        mtype, _, _ = parse_media_type(req.content_type)
        self.ok = mtype == "application/x-www-form-urlencoded"
        if self.ok:
            self.sink = Buffer()

    def finish(self):
        if not self.ok:
            return problem(415, "unsupported_media_type",
                           "Content-Type must be application/x-www-form-urlencoded",
                           content_type=self.req.content_type), None
        # WHATWG: percent-decoded bytes are UTF-8 decoded with replacement.
        text = bytes(self.sink.data).decode("utf-8", "replace")
        parsed = parse_qs(text, keep_blank_values=True, encoding="utf-8", errors="replace")
        fields = {k: (v[0] if len(v) == 1 else v) for k, v in parsed.items()}
        key = self.req.idempotency_key
        ctype = self.req.content_type

        def commit(state):
            state.form_seq += 1
            form_id = "FORM-%d" % state.form_seq
            state.forms[form_id] = {"id": form_id, "fields": fields,
                                    "idempotency_key": key, "content_type": ctype}
            return Response(201, {"id": form_id, "fields": fields})
        return None, commit


class Search(Operation):
    fault_route = "search"

    def finish(self):
        sha = self.req.query.get("sha256")
        ref = self.req.query.get("ref")
        if sha is None and ref is None:
            return problem(400, "missing_query", "sha256 and/or ref query parameter required"), None
        sha = sha[0].strip().lower() if sha is not None else None
        ref = ref[0] if ref is not None else None

        def commit(state):
            items = [dict(m) for m in state.live()
                     if (sha is None or m["sha256"] == sha)
                     and (ref is None or m["fields"].get("ref") == ref)]
            return Response(200, {"items": items})
        return None, commit


class GetDocument(Operation):
    def finish(self):
        doc_id = self.params[0]

        def commit(state):
            doc = state.docs.get(doc_id)
            if doc is None:
                return problem(404, "not_found", "no such document", id=doc_id)
            if doc["deleted"]:
                return problem(404, "deleted", "document was deleted", id=doc_id)
            return Response(200, dict(doc["meta"]))
        return None, commit


class DeleteDocument(Operation):
    fault_route = "delete"

    def finish(self):
        doc_id = self.params[0]

        def commit(state):
            doc = state.docs.get(doc_id)
            if doc is None:
                return problem(404, "not_found", "no such document", id=doc_id)
            if doc["deleted"]:
                return problem(404, "deleted", "document was already deleted", id=doc_id)
            doc["deleted"] = True
            state.deletes += 1
            return Response(204)
        return None, commit


class GetForm(Operation):
    def finish(self):
        form_id = self.params[0]

        def commit(state):
            form = state.forms.get(form_id)
            if form is None:
                return problem(404, "not_found", "no such form", id=form_id)
            return Response(200, dict(form))
        return None, commit


# ---- control routes -------------------------------------------------------

def check_shape(shape):
    if not isinstance(shape, str):
        raise ValueError("a shape must be a string")
    m = SHAPE_RE.fullmatch(shape)
    if not m:
        raise ValueError("unknown shape %r" % shape)
    if m.group("stall") is not None and int(m.group("stall")) > MAX_STALL_MS:
        raise ValueError("stall_ms must be at most %d" % MAX_STALL_MS)
    if m.group("status") is not None:
        code = int(m.group("status"))
        if not 200 <= code <= 599 or code in (204, 205, 304):
            raise ValueError("status must be 200-599 and not 204/205/304")
    return shape


def faults_view(state):
    return {"faults": {r: {"next": list(q)} for r, q in state.faults.items()}}


class Control(Operation):
    control = True


class FaultsGet(Control):
    def finish(self):
        return None, lambda state: Response(200, faults_view(state))


class FaultsPost(Control):
    def __init__(self, server, req, params):
        super().__init__(server, req, params)
        self.sink = Buffer()

    def finish(self):
        try:
            data = json.loads(bytes(self.sink.data).decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return problem(400, "bad_json", "body is not valid JSON"), None
        if not isinstance(data, dict):
            return problem(400, "bad_json", "body must be a JSON object"), None
        reset = data.get("reset", False)
        new = {}
        try:
            if not isinstance(reset, bool):
                raise ValueError("reset must be a boolean")
            for route, spec in data.items():
                if route == "reset":
                    continue
                if route not in FAULT_ROUTES:
                    raise ValueError("unknown route %r (known: %s)" % (route, ", ".join(FAULT_ROUTES)))
                if spec is None:
                    new[route] = []
                    continue
                if not isinstance(spec, dict) or set(spec) - {"next"}:
                    raise ValueError("settings for %s must be {\"next\": [shape, ...]}" % route)
                nxt = spec.get("next", [])
                if not isinstance(nxt, list):
                    raise ValueError("next must be a list")
                new[route] = [check_shape(s) for s in nxt]
        except ValueError as exc:
            return problem(400, "bad_faults", str(exc)), None

        def commit(state):
            if reset:
                for q in state.faults.values():
                    q.clear()
            for route, shapes in new.items():
                state.faults[route] = deque(shapes)
            return Response(200, faults_view(state))
        return None, commit


class Stats(Control):
    def finish(self):
        def commit(state):
            return Response(200, {
                "documents": len(state.live()),
                "uploads": state.uploads,
                "by_sha256": dict(state.by_sha256),
                "deletes": state.deletes,
                "forms": len(state.forms),
                "bad_requests": state.bad_requests,
                "requests_total": state.requests_total,
                "requests": [dict(e) for e in state.log],
            })
        return None, commit


class Reset(Control):
    def finish(self):
        def commit(state):
            state.clear()
            return Response(200, {"reset": True})
        return None, commit


VAR = object()
ROUTE_TABLE = [
    (("dms", "documents"), {"POST": Upload, "GET": Search}),
    (("dms", "documents", VAR), {"GET": GetDocument, "DELETE": DeleteDocument}),
    (("dms", "raw", VAR), {"PUT": RawPut}),
    (("dms", "forms"), {"POST": FormPost}),
    (("dms", "forms", VAR), {"GET": GetForm}),
    (("_target", "faults"), {"GET": FaultsGet, "POST": FaultsPost}),
    (("_target", "stats"), {"GET": Stats}),
    (("_target", "reset"), {"POST": Reset}),
]


def make_operation(server, req):
    control = req.segments[:1] == ["_target"]
    for pattern, methods in ROUTE_TABLE:
        if len(pattern) != len(req.segments):
            continue
        params = []
        for pat, seg in zip(pattern, req.segments):
            if pat is VAR:
                if not seg:
                    break
                params.append(seg)
            elif pat != seg:
                break
        else:
            cls = methods.get(req.method)
            if cls is None:
                allow = ", ".join(sorted(methods))
                resp = problem(405, "method_not_allowed", "method not allowed", allow=sorted(methods))
                resp.headers.append(("Allow", allow))
                return Fixed(server, req, params, resp, control)
            return cls(server, req, params)
    return Fixed(server, req, [], problem(404, "no_route", "no such route", path=req.path), control)


# --------------------------------------------------------------------------
# Connections
# --------------------------------------------------------------------------

class Connection:
    def __init__(self, server, sock):
        self.server = server
        self.state = server.state
        self.sock = sock
        self.closed = False

    # ---- endings -------------------------------------------------------

    def end_fin(self):
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def end_rst(self):
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.sock.close()

    def end_graceful(self):
        """After a complete answer: send FIN, then read (and drop) what the
        client is still sending for a moment, so that closing with unread
        input does not turn into an RST that destroys the answer."""
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + DRAIN_SECONDS
            drained = 0
            while drained < DRAIN_BYTES:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.sock.settimeout(left)
                data = self.sock.recv(RECV_SIZE)
                if not data:
                    break
                drained += len(data)
        except OSError:
            pass
        self.sock.close()

    # ---- loop ----------------------------------------------------------

    def serve(self):
        inp = Input(self.sock)
        try:
            self.sock.settimeout(IDLE_TIMEOUT)
            while not self.closed:
                req = None
                op = None
                try:
                    head = inp.head()
                    if head is None:
                        break
                    req = parse_head(head)
                    op = make_operation(self.server, req)
                    read_body(inp, self.sock, req, op.limit, op.sink.feed)
                except HttpError as exc:
                    self.reject(exc, req or exc.req, op)
                    break
                if not self.answer(req, op):
                    break
        except (ClientGone, OSError):
            pass
        except Exception:
            traceback.print_exc()
        finally:
            self.end_fin()

    def log_entry(self, req, op, shape, status):
        return {
            "method": req.method if req else None,
            "path": req.path if req else None,
            "query": req.target.partition("?")[2] if req else None,
            "route": op.fault_route if op else None,
            "chunked": req.chunked if req else False,
            "size": req.size if req else 0,
            "content_type": req.content_type if req else None,
            "idempotency_key": req.idempotency_key if req else None,
            "shape": shape,
            "status": status,
        }

    def reject(self, exc, req, op):
        resp = problem(exc.status, exc.problem, exc.message)
        control = req is not None and req.segments[:1] == ["_target"]
        with self.state.lock:
            resp.freeze()
            if not control:
                self.state.bad_requests += 1
                self.state.requests_total += 1
                self.state.log.append(self.log_entry(req, op, "ok", exc.status))
        try:
            self.sock.sendall(self.render(resp, False, req is not None and req.method == "HEAD"))
        except OSError:
            pass
        self.end_graceful()

    @staticmethod
    def render(resp, keep_alive, head_only):
        head = ("\r\n".join(resp.lines(keep_alive)) + "\r\n\r\n").encode("latin-1")
        return head if head_only else head + resp.data

    def answer(self, req, op):
        """Finish, commit, record and write one fully read request.
        Returns True to read the next request on this connection."""
        try:
            response, commit = op.finish()          # heavy parsing: no lock
        except Exception:
            traceback.print_exc()
            response, commit = problem(500, "internal", "bug in the test target"), None
        op.sink = None                               # drop buffered bodies
        state = self.state
        shape = "ok"
        with state.lock:
            injected = False
            if op.fault_route is not None and not op.control:
                shape = state.take_shape(op.fault_route)
            if shape.startswith("status:"):
                injected = True
                code = int(shape.split(":", 1)[1])
                extra = [("Retry-After", "0")] if code in (429, 503) else []
                response = Response(code, {"error": "injected"}, extra)
            elif commit is not None:
                try:
                    response = commit(state)
                except Exception:
                    traceback.print_exc()
                    response = problem(500, "internal", "bug in the test target")
            response.freeze()
            if not op.control:
                if not injected and response.status in REJECT_STATUSES:
                    state.bad_requests += 1
                state.requests_total += 1
                written = None if shape in ("close_before_bytes", "reset") else response.status
                state.log.append(self.log_entry(req, op, shape, written))
        return self.write(req, response, shape)

    def write(self, req, response, shape):
        keep_alive = req.keep_alive
        if shape == "close_before_bytes":
            self.end_fin()
            return False
        if shape == "reset":
            self.end_rst()
            return False
        lines = response.lines(keep_alive)
        if shape == "partial_headers":
            self.sock.sendall((lines[0] + "\r\n" + lines[1] + "\r\n").encode("latin-1"))
            self.end_fin()
            return False
        if shape.startswith("stall_ms:"):
            time.sleep(int(shape.split(":", 1)[1]) / 1000.0)
        self.sock.sendall(self.render(response, keep_alive, req.method == "HEAD"))
        if not keep_alive:
            self.end_graceful()
            return False
        return True


# --------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------

class Server:
    def __init__(self, listener, max_body):
        self.listener = listener
        self.max_body = max_body
        self.state = State()

    def serve_forever(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except socket.timeout:
                continue        # lets the main thread run a pending signal handler
            except OSError:
                time.sleep(0.05)
                continue
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            conn = Connection(self, sock)
            threading.Thread(target=conn.serve, daemon=True).start()


ACCEPT_POLL = 0.2   # seconds the main thread may sleep in accept()


class Stop(BaseException):
    pass


def on_signal(signum, frame):
    raise Stop()


def loopback(host):
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise SystemExit("dms_target: --host must be a loopback IP address")
    if not ip.is_loopback:
        raise SystemExit("dms_target: refusing to listen on non-loopback %s" % host)
    return (socket.AF_INET6 if ip.version == 6 else socket.AF_INET), host


def main(argv=None):
    ap = argparse.ArgumentParser(description="Independent document-store (DMS) test target")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--max-body-mb", type=float, default=256.0,
                    help="largest accepted request body in MiB (default 256)")
    args = ap.parse_args(argv)
    if args.max_body_mb <= 0:
        raise SystemExit("dms_target: --max-body-mb must be positive")
    family, host = loopback(args.host)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
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
        Server(listener, int(args.max_body_mb * 1024 * 1024)).serve_forever()
    except Stop:
        pass
    finally:
        listener.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
