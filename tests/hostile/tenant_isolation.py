#!/usr/bin/env python3
"""Tenant isolation: an outsider's adversarial test suite for `waystone serve`.

Written from docs/*.md, README.md and examples/ only (no product code, no product tests). Starts
a real `waystone serve` (SQLite in a temp dir, 127.0.0.1) and its own downstream HTTP servers,
which COUNT what they receive, then checks four holes of a security finding:

  1. destination_*   a request's destination (scheme, host, port) is never chosen by data
                     (input, an earlier answer); `waystone lint` refuses such definitions.
  2. files_*         a tenant's files step reads only that tenant's folder (files_dir/<tenant>/).
  3. four_eyes_*     the token that revised the material data, or started the instance, may not
                     approve it.
  4. idle_*          ~1,030 idle TCP connections starve neither /healthz nor /v1/me, and the
                     server closes connections that never sent a byte.

  python3 tests/hostile/tenant_isolation.py --waystone PATH/waystone [--only a,b] [--keep]

Checks (--only takes these names, or the groups destination_by_data, files_per_tenant,
four_eyes, idle): lint_destination, lint_destination_ok, destination_userinfo, destination_port,
destination_compensation, destination_legit, destination_encoding, files_per_tenant,
files_own_tenant, four_eyes_control, four_eyes_revise_first, four_eyes_revise_event,
four_eyes_starter, four_eyes_requester_from_input, idle_sockets, idle_close.
`*_legit`, `*_ok`, `*_control` and `files_own_tenant` show that legitimate calls still arrive.
A definition the server refuses at load (a fixed build refusing the hostile URL forms) is
reported, dropped and the server started again without it; that counts as a refusal.

Prints `PASS name` / `FAIL name: why` per check; exits 0 only if every check passed.
Python 3 standard library only.
"""
import argparse, http.client, json, os, re, resource, secrets, select, shutil, signal, socket
import subprocess, sys, tempfile, threading, time, urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# ================================================================ names guessed (adjust here)
#
# Everything below is read from docs/ (http-api.md, approvals.md, definition-reference.md,
# operations.md, cli.md); where the docs leave a name open, the guess is here.

# serve config: the files folder (operations.md "Uploading documents": `files_dir:`). Files of
# tenant T live in <files_dir>/<T>/ and a definition's `path` is relative to that folder
# (definition-reference.md "Uploads", operations.md).
FILES_DIR_KEY = "files_dir"
def tenant_files_dir(files_root, tenant):
    return os.path.join(files_root, tenant)

# serve config: approver groups (http-api.md "Approvals", approvals.md "Decisions").
def groups_yaml(tenant, group, tokens):
    return f"groups:\n  - {{ tenant: {tenant}, name: {group}, tokens: [{', '.join(tokens)}] }}\n"

# CLI: token creation (cli.md), token printed once as wst_...
def token_create_cmd(db, name, tenant, role):
    return ["token", "create", "--db", db, "--tenant", tenant, "--role", role, "--name", name]
TOKEN_RE = re.compile(r"wst_[A-Za-z0-9_\-]+")

# The instance view (GET /v1/instances/{key}): openapi.json's Approval schema.
def find_approval(view, step):
    for a in (view or {}).get("approvals") or []:
        if a.get("step") == step:
            return a
    return None

def approval_data_version(entry):
    """The data version a decision must quote: the open request's, or (not open yet, shown
    with next_request) the one of the instance's input now."""
    if not entry:
        return None
    dv = entry.get("data_version")
    if not dv and isinstance(entry.get("next_request"), dict):
        dv = entry["next_request"].get("data_version")
    return dv

def approval_is_open(entry):
    return bool(entry) and isinstance(entry.get("request"), int) and entry.get("state") == "waiting" \
        and not entry.get("decision")

def approval_decided_by(entry):
    d = (entry or {}).get("decision") or {}
    return d.get("by")

def step_of(view, name):
    for s in (view or {}).get("steps") or []:
        if s.get("name") == name:
            return s
    return None

def step_error_text(step):
    if not step:
        return ""
    parts = [str(step.get(k)) for k in ("state", "error_class", "error", "error_message", "last_error",
                                         "status_reason") if step.get(k)]
    for r in (step.get("requests") or [])[-2:]:
        if r.get("detail"):
            parts.append(str(r.get("detail")))
    return " | ".join(parts)[:400]

REST_STATES = {"completed", "compensated", "failed", "closed", "needs_attention"}

# lint: "every problem is reported as `FILE:LINE: step 'NAME': message`" (definition-reference.md)
def lint_problem_re(basename):
    return re.compile(r"(?P<file>\S*" + re.escape(basename) + r"):(?P<line>\d+):\s*step '(?P<step>[^']+)'")

# CloudEvents routes of the serve config (http-api.md "Approvals", "Events").
EV_GO = "com.tenantiso.go"            # signal: completes the `hold` wait step
EV_REVISED = "com.tenantiso.revised"  # revise: { key: /order_ref }, data: order_ref, input, reason

# /v1/me probes during the idle flood: how many of 40 must be 200.
ME_MIN_OK = 38
IDLE_COUNT = 1030
# Idle connections that never sent a byte: closed within api.read_timeout ("the whole request
# not in within api.read_timeout: the connection is closed", http-api.md; default 10s) plus slack.
READ_TIMEOUT_S = 10
IDLE_DEADLINE_S = READ_TIMEOUT_S + 5
IDLE_WATCH_MAX_S = 60

# Characters of a value rendered in a URL path that must arrive percent-encoded
# (definition-reference.md: in the path only A-Z a-z 0-9 - . _ ~ stay; `/`, `@`, `:` are encoded).
PATH_MUST_ENCODE = "@:/"

# ================================================================ small HTTP client

class Resp:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body
    def header(self, name):
        return self.headers.get(name.lower())
    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            return None
    def __repr__(self):
        return f"{self.status} {self.body[:300]!r}"

def hreq(port, method, path, body=None, token=None, headers=None, timeout=10.0):
    """One request on a fresh connection."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Connection": "close"}
    if token:
        h["Authorization"] = "Bearer " + token
    if body is not None and not isinstance(body, (bytes, str)):
        body = json.dumps(body)
        h["Content-Type"] = "application/json"
    h.update(headers or {})
    try:
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        return Resp(r.status, {k.lower(): v for k, v in r.getheaders()}, data)
    finally:
        c.close()

def problem_why(r, status):
    """None if r is an RFC 9457 problem+json with this status, else why not."""
    want = status if isinstance(status, tuple) else (status,)
    if r.status not in want:
        return f"status {r.status} (want {'/'.join(map(str, want))}) body {r.body[:240]!r}"
    ct = (r.header("content-type") or "").lower()
    if not ct.startswith("application/problem+json"):
        return f"{r.status} with Content-Type {ct!r}"
    j = r.json()
    if not isinstance(j, dict) or not str(j.get("type", "")).startswith("urn:waystone:problem:"):
        return f"{r.status} body is not a waystone problem: {r.body[:200]!r}"
    return None

def kpath(key):
    return urllib.parse.quote(key, safe=":")

def rid():
    return secrets.token_hex(4)

def wait_for(fn, timeout, interval=0.25):
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(interval)

# ================================================================ downstreams that count

class Recorder:
    """An http.server downstream that records every request (raw request-target, headers, body)
    and answers through `respond(rec, method, path, headers, body) -> (status, dict)`."""

    def __init__(self, name, respond=None):
        self.name, self.records, self.lock, self.connections = name, [], threading.Lock(), 0
        self.respond = respond or (lambda *a: (200, {"id": "OK-1"}))
        rec = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"
            def log_message(self, *a):
                pass
            def setup(self):
                with rec.lock:
                    rec.connections += 1
                super().setup()
            def _any(self):
                te = (self.headers.get("Transfer-Encoding") or "").lower()
                if "chunked" in te:
                    body = bytearray()
                    while True:
                        n = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if n == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            break
                        body += self.rfile.read(n)
                        self.rfile.readline()
                    body = bytes(body)
                else:
                    n = int(self.headers.get("Content-Length") or 0)
                    body = self.rfile.read(n) if n else b""
                hd = {k.lower(): v for k, v in self.headers.items()}
                with rec.lock:
                    rec.records.append({"method": self.command, "path": self.path, "headers": hd,
                                        "body": body, "at": time.monotonic()})
                try:
                    status, doc = rec.respond(rec, self.command, self.path, hd, body)
                except Exception as e:     # a bug of ours: answer 500 and say so
                    status, doc = 500, {"error": repr(e)}
                out = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _any

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def url(self, path=""):
        return f"http://127.0.0.1:{self.port}{path}"

    def snapshot(self):
        with self.lock:
            return list(self.records)

    def for_ref(self, ref):
        return [r for r in self.snapshot() if r["headers"].get("x-ref") == ref or ref.encode() in r["body"]]

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


class RawRecorder:
    """The evil downstream: a raw TCP listener that counts connections and every byte it is
    sent (so even a request it could not parse counts), answering a plausible 200."""

    def __init__(self, name, port=0):
        self.name, self.conns, self.lock = name, [], threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped:
            try:
                s, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(s,), daemon=True).start()

    def _conn(self, s):
        entry = {"data": bytearray(), "at": time.monotonic()}
        with self.lock:
            self.conns.append(entry)
        s.settimeout(2.0)
        try:
            while True:
                buf = bytes(entry["data"])
                if b"\r\n\r\n" in buf:
                    head, rest = buf.split(b"\r\n\r\n", 1)
                    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                    if len(rest) >= (int(m.group(1)) if m else 0):
                        break
                d = s.recv(65536)
                if not d:
                    break
                entry["data"] += d
            out = json.dumps({"id": "EVIL-1", "location": "/evil/1"}).encode()
            s.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                      + str(len(out)).encode() + b"\r\nConnection: close\r\n\r\n" + out)
        except OSError:
            pass
        finally:
            s.close()

    secrets_to_spot = {}    # name -> value: reported when a connection carried it

    def summary(self, ref=None):
        with self.lock:
            conns = [bytes(c["data"]) for c in self.conns]
        if ref is not None:
            conns = [c for c in conns if ref.encode() in c]
        out = []
        for c in conns:
            first = c.split(b"\r\n", 1)[0][:120].decode("latin-1")
            auth = re.search(rb"(?im)^authorization:\s*(\S+)", c)
            xref = re.search(rb"(?im)^x-ref:\s*(\S+)", c)
            extra = []
            if auth:
                extra.append("Authorization: " + auth.group(1).decode("latin-1") + " …")
            extra += [f"carrying {n}" for n, v in self.secrets_to_spot.items() if v.encode() in c]
            if xref:
                extra.append("X-Ref " + xref.group(1).decode("latin-1"))
            out.append(first + (" [" + ", ".join(extra) + "]" if extra else ""))
        return out

    def count(self):
        with self.lock:
            return len(self.conns)

    def close(self):
        self.stopped = True
        try:
            self.sock.close()
        except OSError:
            pass

# ================================================================ definitions

DEFS = {
    # --- 1. destinations --------------------------------------------------------------------
    # the brief's form: the base comes from env, the input is glued right after it. With a base
    # that has no path (DMS_BASE = http://127.0.0.1:GOOD), path "@127.0.0.1:EVIL" makes the good
    # host a user name and sends the request (and its Bearer token) to EVIL.
    "dest-userinfo.yaml": ("dest-userinfo", "call", """\
workflow: dest-userinfo
key: "du:{{input.id}}"
steps:
  - name: call
    idempotency: { honored: true }
    request:
      method: POST
      url: "{{env.DMS_BASE}}{{input.path}}"
      headers: { Authorization: "Bearer {{secret.DMS_TOKEN}}", X-Ref: "{{instance.ref}}" }
      body: { ref: "{{instance.ref}}" }
      timeout: 3s
    retry: { max_attempts: 1 }
"""),
    # the same with a base that carries a path (DMS_URL = http://127.0.0.1:GOOD/docs)
    "dest-userinfo-docs.yaml": ("dest-userinfo-docs", "call", """\
workflow: dest-userinfo-docs
key: "dd:{{input.id}}"
steps:
  - name: call
    idempotency: { honored: true }
    request:
      method: POST
      url: "{{env.DMS_URL}}{{input.path}}"
      headers: { Authorization: "Bearer {{secret.DMS_TOKEN}}", X-Ref: "{{instance.ref}}" }
      body: { ref: "{{instance.ref}}" }
      timeout: 3s
    retry: { max_attempts: 1 }
"""),
    # the input chooses the port
    "dest-port.yaml": ("dest-port", "call", """\
workflow: dest-port
key: "dp:{{input.id}}"
steps:
  - name: call
    idempotency: { honored: true }
    request:
      method: POST
      url: "http://{{env.DMS_HOST}}:{{input.port}}/x"
      headers: { Authorization: "Bearer {{secret.DMS_TOKEN}}", X-Ref: "{{instance.ref}}" }
      body: { ref: "{{instance.ref}}" }
      timeout: 3s
    retry: { max_attempts: 1 }
"""),
    # the input appends digits to the base's port (DMS_BASE_P = http://127.0.0.1:P, EVIL on P*10+d)
    "dest-portappend.yaml": ("dest-portappend", "call", """\
workflow: dest-portappend
key: "dpa:{{input.id}}"
steps:
  - name: call
    idempotency: { honored: true }
    request:
      method: POST
      url: "{{env.DMS_BASE_P}}{{input.path}}"
      headers: { Authorization: "Bearer {{secret.DMS_TOKEN}}", X-Ref: "{{instance.ref}}" }
      body: { ref: "{{instance.ref}}" }
      timeout: 3s
    retry: { max_attempts: 1 }
"""),
    # compensation URL built from the earlier answer, glued to the base (the form the docs'
    # invoice example used): the good DMS answers id "@127.0.0.1:EVIL/x"
    "dest-comp.yaml": ("dest-comp", "upload", """\
workflow: dest-comp
key: "dc:{{input.id}}"
steps:
  - name: upload
    recovery: compensable
    idempotency: { honored: true }
    request:
      method: POST
      url: "{{env.DMS_URL}}/upload/{{input.mode}}"
      headers: { Authorization: "Bearer {{secret.DMS_TOKEN}}", X-Ref: "{{instance.ref}}" }
      body: { ref: "{{instance.ref}}" }
      timeout: 3s
    result: { external_id: /id }
    retry: { max_attempts: 1 }
    compensate:
      request:
        method: DELETE
        url: "{{env.DMS_BASE}}{{steps.upload.external_id}}"
        headers: { Authorization: "Bearer {{secret.DMS_TOKEN}}", X-Ref: "{{instance.ref}}" }
        timeout: 3s
      retry: { max_attempts: 1 }
  - name: refused
    idempotency: { honored: true }
    request:
      method: POST
      url: "{{env.DMS_URL}}/fail"
      headers: { X-Ref: "{{instance.ref}}" }
      timeout: 3s
    retry: { max_attempts: 1 }
"""),
    # the legitimate form of the same: a literal `/` after the base, the id a path segment
    "dest-comp-slash.yaml": ("dest-comp-slash", None, """\
workflow: dest-comp-slash
key: "dcs:{{input.id}}"
steps:
  - name: upload
    recovery: compensable
    idempotency: { honored: true }
    request:
      method: POST
      url: "{{env.DMS_URL}}/upload/{{input.mode}}"
      headers: { Authorization: "Bearer {{secret.DMS_TOKEN}}", X-Ref: "{{instance.ref}}" }
      body: { ref: "{{instance.ref}}" }
      timeout: 3s
    result: { external_id: /id }
    retry: { max_attempts: 1 }
    compensate:
      request:
        method: DELETE
        url: "{{env.DMS_URL}}/{{steps.upload.external_id}}"
        headers: { Authorization: "Bearer {{secret.DMS_TOKEN}}", X-Ref: "{{instance.ref}}" }
        timeout: 3s
      retry: { max_attempts: 1 }
  - name: refused
    idempotency: { honored: true }
    request:
      method: POST
      url: "{{env.DMS_URL}}/fail"
      headers: { X-Ref: "{{instance.ref}}" }
      timeout: 3s
    retry: { max_attempts: 1 }
"""),
    # the legitimate form: the input is one path segment after a literal `/`
    "dest-segment.yaml": ("dest-segment", None, """\
workflow: dest-segment
key: "dsg:{{input.id}}"
steps:
  - name: call
    idempotency: { honored: true }
    request:
      method: POST
      url: "{{env.DMS_URL}}/{{input.path}}"
      headers: { Authorization: "Bearer {{secret.DMS_TOKEN}}", X-Ref: "{{instance.ref}}" }
      body: { ref: "{{instance.ref}}" }
      timeout: 3s
    retry: { max_attempts: 1 }
"""),
    # --- 2. files ---------------------------------------------------------------------------
    "upload-doc.yaml": ("upload-doc", None, """\
workflow: upload-doc
key: "doc:{{input.id}}"
steps:
  - name: upload
    idempotency: { honored: true }
    request:
      method: POST
      url: "{{env.FILES_DMS_URL}}/dms/documents"
      headers: { X-Ref: "{{instance.ref}}" }
      multipart:
        fields: { ref: "{{instance.ref}}" }
        files:
          file:
            path: "{{input.file}}"
            content_type: application/pdf
      timeout: 5s
    retry: { max_attempts: 1 }
"""),
    "upload-raw.yaml": ("upload-raw", None, """\
workflow: upload-raw
key: "raw:{{input.id}}"
steps:
  - name: upload
    idempotency: { honored: true }
    request:
      method: PUT
      url: "{{env.FILES_DMS_URL}}/objects/{{input.id}}"
      headers: { X-Ref: "{{instance.ref}}" }
      body_file:
        path: "{{input.file}}"
        content_type: application/pdf
      timeout: 5s
    retry: { max_attempts: 1 }
"""),
    # --- 3. four eyes -----------------------------------------------------------------------
    "fe-revise.yaml": ("fe-revise", None, """\
workflow: fe-revise
key: "fer:{{input.order_id}}"
steps:
  - name: hold
    wait: { event: com.tenantiso.go }
  - name: approve
    approval:
      material: [/amount]
      summary: "Order {{input.order_id}}: {{input.amount}} EUR"
      approvers: { group: finance }
      on_reject: close
  - name: create-order
    idempotency: { honored: true }
    request:
      method: POST
      url: "{{env.ERP_URL}}/erp/orders"
      headers: { X-Ref: "{{instance.ref}}" }
      body: { ref: "{{instance.ref}}", amount: "{{input.amount}}", approved_by: "{{steps.approve.response.decision.by}}" }
      timeout: 3s
    retry: { max_attempts: 2 }
"""),
    "fe-plain.yaml": ("fe-plain", None, """\
workflow: fe-plain
key: "fep:{{input.order_id}}"
steps:
  - name: approve
    approval:
      material: [/amount]
      summary: "Order {{input.order_id}}: {{input.amount}} EUR"
      approvers: { group: finance }
      on_reject: close
  - name: create-order
    idempotency: { honored: true }
    request:
      method: POST
      url: "{{env.ERP_URL}}/erp/orders"
      headers: { X-Ref: "{{instance.ref}}" }
      body: { ref: "{{instance.ref}}", amount: "{{input.amount}}", approved_by: "{{steps.approve.response.decision.by}}" }
      timeout: 3s
    retry: { max_attempts: 2 }
"""),
    "fe-req.yaml": ("fe-req", None, """\
workflow: fe-req
key: "fer2:{{input.order_id}}"
steps:
  - name: approve
    approval:
      material: [/amount]
      summary: "Order {{input.order_id}}: {{input.amount}} EUR"
      requester: "{{input.submitted_by}}"
      approvers: { group: finance }
      on_reject: close
  - name: create-order
    idempotency: { honored: true }
    request:
      method: POST
      url: "{{env.ERP_URL}}/erp/orders"
      headers: { X-Ref: "{{instance.ref}}" }
      body: { ref: "{{instance.ref}}", amount: "{{input.amount}}", approved_by: "{{steps.approve.response.decision.by}}" }
      timeout: 3s
    retry: { max_attempts: 2 }
"""),
}
ACME_WORKFLOWS = [v[0] for v in DEFS.values()]
GLOBEX_WORKFLOWS = ["upload-doc", "upload-raw"]

# ================================================================ the harness

class Ctx:
    def __init__(self, exe, tmp):
        self.exe, self.tmp = exe, tmp
        self.db = os.path.join(tmp, "w.db")
        self.defs_dir = os.path.join(tmp, "defs")
        self.lint_dir = os.path.join(tmp, "lint")
        self.files_root = os.path.join(tmp, "files")
        self.config = os.path.join(tmp, "waystone.yaml")
        self.out_path = os.path.join(tmp, "server.stdout")
        self.err_path = os.path.join(tmp, "server.stderr")
        self.proc, self.port = None, None
        self.tokens = {}
        self.refused_at_load = {}       # workflow -> the server's words
        self.active = dict(DEFS)        # file -> (workflow, step, text) the server loads
        self.secret = {"acme": secrets.token_hex(16), "globex": secrets.token_hex(16)}
        self.marker = {"acme": "CONFIDENTIAL-ACME-" + secrets.token_hex(12),
                       "globex": "GLOBEX-OWN-" + secrets.token_hex(12)}
        self.downs = []
        self.idle_result = None

    # ---------------------------------------------------------- downstreams
    def start_downstreams(self):
        self.evil = RawRecorder("evil")
        evil_port = self.evil.port

        def good_respond(rec, method, path, hd, body):
            p = path.split("?")[0]
            if method == "POST" and p.endswith("/upload/evil"):
                return 200, {"id": f"@127.0.0.1:{evil_port}"}
            if method == "POST" and p.endswith("/upload/evilx"):
                return 200, {"id": f"@127.0.0.1:{evil_port}/x"}
            if method == "POST" and p.endswith("/upload/evil2"):
                return 200, {"id": f"@127.0.0.1:{evil_port}"}
            if method == "POST" and p.endswith("/upload/good"):
                return 200, {"id": "DOC-7"}
            if p.endswith("/fail"):
                return 422, {"error": "refused, as asked"}
            return 200, {"id": "OK-1"}
        self.good = Recorder("good", good_respond)

        # a good/evil pair where evil listens on goodport*10 + 7 (the input appends a digit)
        self.goodp = self.evilp = None
        for _ in range(200):
            p = secrets.randbelow(6553 - 2000) + 2000
            try:
                s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", p)); s.close()
                self.evilp = RawRecorder("evil-port-append", p * 10 + 7)
            except OSError:
                self.evilp = None
                continue
            try:
                gp = RawRecorder("good-port-append", p)
                self.goodp = gp
                break
            except OSError:
                self.evilp.close(); self.evilp = None
        if not self.goodp:
            raise RuntimeError("could not bind a port pair P, P*10+7 for the port-append case")

        def dms_respond(rec, method, path, hd, body):
            n = len(rec.records)
            return 201, {"id": f"D-{n}", "location": f"/dms/documents/D-{n}"}
        self.acme_dms = Recorder("acme-dms", dms_respond)
        self.globex_dms = Recorder("globex-dms", dms_respond)

        def erp_respond(rec, method, path, hd, body):
            return 201, {"id": f"SO-{len(rec.records)}"}
        self.erp = Recorder("erp", erp_respond)
        for e in (self.evil, self.evilp):
            e.secrets_to_spot = {"acme's DMS_TOKEN secret": self.secret["acme"]}
        self.downs = [self.evil, self.good, self.goodp, self.evilp, self.acme_dms, self.globex_dms, self.erp]

    # ---------------------------------------------------------- files, config
    def write_files(self):
        os.makedirs(self.defs_dir); os.makedirs(self.lint_dir)
        for name, (_, _, text) in DEFS.items():
            for d in (self.defs_dir, self.lint_dir):
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)
        for t in ("acme", "globex"):
            d = tenant_files_dir(self.files_root, t)
            os.makedirs(d)
        acme_pdf = ("%PDF-1.4\n% " + self.marker["acme"] + " salary list, do not share\n" +
                    "x" * 2000 + "\n%%EOF\n").encode()
        globex_pdf = ("%PDF-1.4\n% " + self.marker["globex"] + "\n" + "y" * 500 + "\n%%EOF\n").encode()
        with open(os.path.join(tenant_files_dir(self.files_root, "acme"), "INV-1.pdf"), "wb") as f:
            f.write(acme_pdf)
        with open(os.path.join(tenant_files_dir(self.files_root, "globex"), "G-1.pdf"), "wb") as f:
            f.write(globex_pdf)
        self.sec_files = {}
        for t in ("acme", "globex"):
            p = os.path.join(self.tmp, f"{t}.secrets")
            with open(p, "w") as f:
                f.write(f"DMS_TOKEN={self.secret[t]}\nERP_TOKEN={self.secret[t]}x\n")
            os.chmod(p, 0o600)
            self.sec_files[t] = p

    def write_config(self):
        acme_wf = [v[0] for v in self.active.values()]
        globex_wf = [w for w in GLOBEX_WORKFLOWS if w in acme_wf]
        text = (f"database: {self.db}\nlisten: 127.0.0.1:8080\nworkers: 4\n"
                f"definitions: {self.defs_dir}\n"
                f"{FILES_DIR_KEY}: {self.files_root}\n"
                "tenants:\n"
                "  acme:\n"
                f"    workflows: [{', '.join(acme_wf)}]\n"
                f"    secrets_file: {self.sec_files['acme']}\n"
                f"    env: {{ FILES_DMS_URL: \"{self.acme_dms.url()}\" }}\n"
                "  globex:\n"
                f"    workflows: [{', '.join(globex_wf)}]\n"
                f"    secrets_file: {self.sec_files['globex']}\n"
                f"    env: {{ FILES_DMS_URL: \"{self.globex_dms.url()}\" }}\n"
                + groups_yaml("acme", "finance", ["alice", "dave"]))
        if "fe-revise" in acme_wf:
            text += ("events:\n"
                     f"  - type: {EV_GO}\n    signal: {{ key: /order_ref }}\n"
                     f"  - type: {EV_REVISED}\n    revise: {{ key: /order_ref }}\n")
        with open(self.config, "w") as f:
            f.write(text)

    # ---------------------------------------------------------- processes
    def clean_env(self, **extra):
        env = {k: v for k, v in os.environ.items() if not k.startswith("WAYSTONE_")}
        env.update(extra)
        return env

    def server_env(self):
        return self.clean_env(
            DMS_BASE=self.good.url(), DMS_URL=self.good.url("/docs"), DMS_HOST="127.0.0.1",
            DMS_BASE_P=f"http://127.0.0.1:{self.goodp.port}", ERP_URL=self.erp.url(),
            WAYSTONE_LOG="info")

    def cli(self, *args, timeout=60):
        p = subprocess.run([self.exe, *args], capture_output=True, timeout=timeout, env=self.clean_env())
        return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")

    def logs(self):
        data = b""
        for p in (self.out_path, self.err_path):
            if os.path.exists(p):
                with open(p, "rb") as f:
                    data += f.read()
        return data.decode("utf-8", "replace")

    def _spawn(self):
        s = socket.socket(); s.bind(("127.0.0.1", 0)); self.port = s.getsockname()[1]; s.close()
        mark = len(self.logs())
        self.proc = subprocess.Popen(
            [self.exe, "serve", "--config", self.config, "--listen", f"127.0.0.1:{self.port}"],
            stdout=open(self.out_path, "ab"), stderr=open(self.err_path, "ab"),
            env=self.server_env(), start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return self.logs()[mark:]
            try:
                if hreq(self.port, "GET", "/healthz", timeout=1).status == 200:
                    return None
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("server did not answer /healthz in 30 s")

    def start_server(self):
        """Starts the server; a definition the server refuses at load (what a fixed product does
        with the hostile destination forms) is recorded, removed, and the server started again."""
        for _ in range(len(DEFS) + 1):
            self.write_config()
            died = self._spawn()
            if died is None:
                return
            def named(word, text):
                return re.search(r"(?<![\w-])" + re.escape(word) + r"(?![\w-])", text)
            hits = [f for f in self.active if named(f, died)]
            if not hits:
                hits = [f for f, (wf, _, _) in self.active.items() if named(wf, died)]
            if not hits:
                raise RuntimeError(f"server exited {self.proc.returncode}: {died[-1500:]}")
            for hit in hits:
                wf = self.active.pop(hit)[0]
                self.refused_at_load[wf] = " ".join(l.strip() for l in died.splitlines()
                                                    if named(hit, l) or named(wf, l))[:300]
                os.remove(os.path.join(self.defs_dir, hit))
                print(f"  (server refused {hit} at load: {self.refused_at_load[wf][:200]}; starting without it)",
                      flush=True)
        raise RuntimeError("server refused every start")

    def ensure_server(self):
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:
                print(f"  (server had exited with {self.proc.returncode}; restarting it)", flush=True)
            self.start_server()
            if not self.tokens:
                self.make_tokens()

    def stop_server(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill(); self.proc.wait()

    def make_tokens(self):
        for name, tenant, role in (("ops", "acme", "operator"), ("alice", "acme", "operator"),
                                   ("dave", "acme", "operator"), ("globex-ops", "globex", "operator")):
            rc, out, err = self.cli(*token_create_cmd(self.db, name, tenant, role))
            words = TOKEN_RE.findall(out)
            if rc != 0 or not words:
                raise RuntimeError(f"token create {name} failed ({rc}): {out[-300:]} {err[-300:]}")
            self.tokens[name] = words[-1]

    # ---------------------------------------------------------- API shortcuts
    def req(self, method, path, body=None, token=None, headers=None, timeout=10.0):
        return hreq(self.port, method, path, body, token, headers, timeout)

    def start(self, token, workflow, input_):
        return self.req("POST", "/v1/instances", {"workflow": workflow, "input": input_}, token)

    def view(self, token, key):
        r = self.req("GET", "/v1/instances/" + kpath(key), token=token)
        return r.json() if r.status == 200 else None

    def settle(self, token, keys, timeout=20):
        """Waits until each instance rests; returns key -> view."""
        out = {}
        def done():
            for k in keys:
                if k in out and out[k].get("state") in REST_STATES:
                    continue
                v = self.view(token, k)
                if v is not None:
                    out[k] = v
            return all(k in out and out[k].get("state") in REST_STATES for k in keys)
        wait_for(done, timeout, 0.3)
        return out

    def event(self, token, typ, data):
        h = {"Content-Type": "application/json", "ce-specversion": "1.0", "ce-id": "ti-" + rid(),
             "ce-source": "/tenant-isolation", "ce-type": typ}
        return self.req("POST", "/v1/events", json.dumps(data), token, h)

    def decide(self, token, key, entry, decision="approve", early=False):
        doc = {"step": "approve", "data_version": approval_data_version(entry), "decision": decision,
               "comment": "four eyes test"}
        if not early:
            doc["request"] = entry.get("request")
        return self.req("POST", f"/v1/instances/{kpath(key)}/decide", doc, token)

    def loaded(self, workflow):
        return workflow not in self.refused_at_load

    def close(self):
        self.stop_server()
        for d in self.downs:
            if d:
                try:
                    d.close()
                except Exception:
                    pass

# ================================================================ 1. destinations

def expected_key(wf, inp):
    """The business key the definition's `key:` template gives this input."""
    m = re.search(r'^key: "([\w-]+):\{\{input\.(\w+)\}\}"', DEFS_BY_WF[wf][2], re.M)
    return f"{m.group(1)}:{inp[m.group(2)]}" if m else None


def _start_or_refusal(c, tok, wf, inp):
    """(key or None, note). A refusal (at load or at start) must be a clear problem+json and
    must create nothing."""
    if not c.loaded(wf):
        return None, f"refused at load ({c.refused_at_load[wf][:120]})"
    r = c.start(tok, wf, inp)
    if r.status in (200, 201):
        return (r.json() or {}).get("key"), None
    why = problem_why(r, (400, 403, 409, 422))
    if why:
        return None, f"start answered unclearly: {why}"
    k = expected_key(wf, inp)
    if k and c.req("GET", "/v1/instances/" + kpath(k), token=tok).status != 404:
        return None, f"start answered unclearly: refused with {r.status} yet instance {k} exists"
    return None, f"start refused: {r.status} {(r.json() or {}).get('detail', '')[:120]}"


def _destination_case(c, wf, inputs, evil_recs, good_recs=()):
    """Starts wf with each input, waits for them to rest, returns failures: any connection the
    evil servers got for these instances, and any unclear refusal."""
    fails, keys, refs = [], [], {}
    tok = c.tokens["ops"]
    before = {e.name: e.count() for e in evil_recs}
    for inp in inputs:
        key, note = _start_or_refusal(c, tok, wf, inp)
        if key:
            keys.append(key); refs[key] = inp
        elif note and "unclearly" in note:
            fails.append(f"{wf} {inp}: {note}")
        else:
            print(f"  {wf} {json.dumps(inp)}: {note}", flush=True)
    views = c.settle(tok, keys, 20) if keys else {}
    time.sleep(0.5)
    for e in evil_recs:
        got = e.count() - before[e.name]
        if got:
            fails.append(f"{wf}: the {e.name} server on port {e.port} received {got} connection(s): "
                         + "; ".join(e.summary()[-got:])[:500])
    for k in keys:
        v = views.get(k) or {}
        st = step_of(v, DEFS_BY_WF[wf][1] or ("upload" if wf.startswith("dest-comp") else "call"))
        print(f"  {wf} {json.dumps(refs[k])}: instance {v.get('state')!r}; step: {step_error_text(st)[:200]}",
              flush=True)
    return fails, keys


def check_destination_userinfo(c):
    ev = c.evil.port
    fails = []
    f, _ = _destination_case(c, "dest-userinfo", [
        {"id": rid(), "path": f"@127.0.0.1:{ev}"},
        {"id": rid(), "path": f"@127.0.0.1:{ev}/x"},
        {"id": rid(), "path": f":1@127.0.0.1:{ev}/x"}], [c.evil])
    fails += f
    f, keys = _destination_case(c, "dest-userinfo-docs", [{"id": rid(), "path": f"@127.0.0.1:{ev}"}], [c.evil])
    fails += f
    # if a call of these was made at all, it reached GOOD with the value encoded inside the path
    for rec in c.good.snapshot():
        if rec["headers"].get("x-ref", "").startswith(("acme:du:", "acme:dd:")):
            raw = rec["path"].split("?")[0]
            if "@" in raw or raw.count(":") > 0:
                fails.append(f"GOOD received {rec['method']} {raw!r}: '@'/':' of the value not percent-encoded")
    return fails


def check_destination_port(c):
    fails = []
    f, _ = _destination_case(c, "dest-port", [{"id": rid(), "port": str(c.evil.port)},
                                              {"id": rid(), "port": c.evil.port}], [c.evil])
    fails += f
    f, _ = _destination_case(c, "dest-portappend", [{"id": rid(), "path": "7"},
                                                    {"id": rid(), "path": "7/x"}], [c.evilp])
    fails += f
    return fails


def check_destination_compensation(c):
    fails = []
    ev_before = c.evil.count()
    f, keys = _destination_case(c, "dest-comp", [{"id": rid(), "mode": "evil"}, {"id": rid(), "mode": "evilx"}],
                                [c.evil])
    fails += f
    for k in keys:
        ups = [r for r in c.good.for_ref("acme:" + k) if "/upload/evil" in r["path"]]
        if not ups:
            fails.append(f"harness: GOOD never got the upload of {k} (so the compensation was not exercised)")
    f, keys = _destination_case(c, "dest-comp-slash", [{"id": rid(), "mode": "evil2"}], [c.evil])
    fails += f
    deletes = [s for s in c.evil.summary() if s.startswith("DELETE")]
    if c.evil.count() > ev_before and deletes:
        fails.append(f"EVIL received DELETE(s): {deletes[-3:]}")
    # the legitimate compensation still reaches GOOD, with the id as a path segment
    if not c.loaded("dest-comp-slash"):
        return fails + [f"dest-comp-slash (legitimate form) was refused at load: {c.refused_at_load['dest-comp-slash']}"]
    k, note = _start_or_refusal(c, c.tokens["ops"], "dest-comp-slash", {"id": rid(), "mode": "good"})
    if not k:
        return fails + [f"legitimate compensation: {note}"]
    v = c.settle(c.tokens["ops"], [k], 20).get(k) or {}
    dels = [r for r in c.good.for_ref("acme:" + k) if r["method"] == "DELETE"]
    if [r["path"] for r in dels] != ["/docs/DOC-7"]:
        fails.append(f"legitimate compensation: GOOD got DELETEs {[r['path'] for r in dels]} (want ['/docs/DOC-7']); "
                     f"instance {v.get('state')!r}, upload: {step_error_text(step_of(v, 'upload'))[:200]}")
    elif dels[0]["headers"].get("authorization") != "Bearer " + c.secret["acme"]:
        fails.append("legitimate compensation reached GOOD without acme's Bearer token")
    return fails


def _segment_runs(c, values):
    out = {}
    ids = {}
    for val in values:
        i = rid()
        key, note = _start_or_refusal(c, c.tokens["ops"], "dest-segment", {"id": i, "path": val})
        if not key:
            out[val] = (None, note, None)
        else:
            ids[key] = val
    views = c.settle(c.tokens["ops"], list(ids), 20)
    time.sleep(0.3)
    for key, val in ids.items():
        recs = c.good.for_ref("acme:" + key)
        out[val] = (key, recs, views.get(key))
    return out


def check_destination_legit(c):
    """A legitimate path segment still reaches GOOD, with the right path and the Bearer token."""
    if not c.loaded("dest-segment"):
        return [f"the legitimate form {{{{env.DMS_URL}}}}/{{{{input.path}}}} was refused at load: "
                f"{c.refused_at_load['dest-segment']}"]
    fails = []
    for val, want in (("INV-1", "/docs/INV-1"), ("a/b", "/docs/a%2Fb"), ("x y", "/docs/x%20y")):
        key, recs, v = _segment_runs(c, [val])[val]
        if key is None:
            fails.append(f"{val!r}: {recs}"); continue
        paths = [r["path"] for r in recs]
        if paths != [want]:
            fails.append(f"{val!r}: GOOD received {paths} (want exactly [{want!r}]); instance "
                         f"{(v or {}).get('state')!r} {step_error_text(step_of(v, 'call'))[:200]}")
        elif recs[0]["headers"].get("authorization") != "Bearer " + c.secret["acme"]:
            fails.append(f"{val!r}: arrived without acme's Bearer token")
    return fails


def check_destination_encoding(c):
    """`@`, `:` and `/` in a value rendered into the path arrive percent-encoded at GOOD (if the
    call is made), and EVIL gets nothing."""
    if not c.loaded("dest-segment"):
        return [f"dest-segment refused at load: {c.refused_at_load['dest-segment']}"]
    ev = c.evil.port
    before = c.evil.count()
    fails = []
    vals = [f"@127.0.0.1:{ev}", f"a@127.0.0.1:{ev}/b", f"..@127.0.0.1:{ev}"]
    for val, (key, recs, v) in _segment_runs(c, vals).items():
        if key is None:
            print(f"  {val!r}: {recs}", flush=True); continue
        for r in recs:
            raw = r["path"].split("?")[0]
            if not raw.startswith("/docs/"):
                fails.append(f"{val!r}: GOOD received path {raw!r}, not under /docs/"); continue
            seg = raw[len("/docs/"):]
            bad = [ch for ch in PATH_MUST_ENCODE if ch in seg]
            if bad:
                fails.append(f"{val!r}: GOOD received path {raw!r}: {bad} not percent-encoded")
            elif urllib.parse.unquote(seg) != val:
                fails.append(f"{val!r}: GOOD received path {raw!r}, which does not decode to the value")
        if not recs:
            print(f"  {val!r}: no call made; instance {(v or {}).get('state')!r} "
                  f"{step_error_text(step_of(v, 'call'))[:160]}", flush=True)
    if c.evil.count() > before:
        fails.append(f"EVIL received {c.evil.count() - before} connection(s): {c.evil.summary()[-2:]}")
    return fails


def _lint_line_range(text, step):
    lines = text.splitlines()
    start = None
    for i, ln in enumerate(lines, 1):
        if re.match(r"\s*-\s*name:\s*" + re.escape(step) + r"\s*$", ln):
            start = i
        elif start and re.match(r"\s*-\s*name:\s*", ln) and re.match(r"^  -", ln):
            return start, i - 1
    return start, len(lines)


def check_lint_destination(c):
    fails = []
    for fname in ("dest-userinfo.yaml", "dest-userinfo-docs.yaml", "dest-port.yaml",
                  "dest-portappend.yaml", "dest-comp.yaml"):
        wf, step, text = DEFS[fname]
        path = os.path.join(c.lint_dir, fname)
        rc, out, err = c.cli("lint", path)
        words = (out + err).strip()
        if rc == 0:
            fails.append(f"{fname}: lint exit 0 (want a refusal): {words[:200]!r}")
            continue
        m = lint_problem_re(fname).search(words)
        if not m:
            fails.append(f"{fname}: lint exit {rc} but no 'FILE:LINE: step ...' line: {words[:300]!r}")
            continue
        lo, hi = _lint_line_range(text, step)
        line = int(m.group("line"))
        if m.group("step") != step:
            fails.append(f"{fname}: lint names step {m.group('step')!r} (want {step!r}): {words[:200]!r}")
        elif not (lo and lo <= line <= hi):
            fails.append(f"{fname}: lint names line {line}, outside step {step!r} (lines {lo}-{hi})")
        else:
            print(f"  lint {fname}: exit {rc}: {words.splitlines()[0][:200]}", flush=True)
    return fails


def check_lint_destination_ok(c):
    """The legitimate forms lint clean (exit 0), so the rule did not just refuse every URL."""
    fails = []
    for fname in ("dest-segment.yaml", "dest-comp-slash.yaml"):
        rc, out, err = c.cli("lint", os.path.join(c.lint_dir, fname))
        if rc != 0:
            fails.append(f"{fname}: lint exit {rc}: {(out + err).strip()[:300]!r}")
    return fails

# ================================================================ 2. files

def check_files_per_tenant(c):
    """globex names acme's file every way the docs allow a path to be written: acme's bytes
    must never reach globex's DMS (nor any downstream but acme's)."""
    tok = c.tokens["globex-ops"]
    acme_abs = os.path.join(tenant_files_dir(c.files_root, "acme"), "INV-1.pdf")
    variants = [("upload-doc", "acme/INV-1.pdf"), ("upload-doc", "./acme/INV-1.pdf"),
                ("upload-doc", "acme//INV-1.pdf"), ("upload-doc", "../acme/INV-1.pdf"),
                ("upload-doc", "acme/./INV-1.pdf"), ("upload-doc", acme_abs),
                ("upload-raw", "acme/INV-1.pdf"), ("upload-raw", "./acme/INV-1.pdf"),
                ("upload-raw", "../acme/INV-1.pdf")]
    fails, keys = [], {}
    for wf, path in variants:
        if not c.loaded(wf):
            fails.append(f"harness: {wf} refused at load: {c.refused_at_load[wf]}"); continue
        key, note = _start_or_refusal(c, tok, wf, {"id": rid(), "file": path})
        if key:
            keys[key] = (wf, path)
        elif "unclearly" in note:
            fails.append(f"{wf} {path!r}: {note}")
        else:
            print(f"  globex {wf} {path!r}: {note}", flush=True)
    views = c.settle(tok, list(keys), 20)
    time.sleep(0.5)
    marker = c.marker["acme"].encode()
    for d in (c.globex_dms, c.good, c.erp):
        leaked = [r for r in d.snapshot() if marker in r["body"]]
        for r in leaked:
            ref = r["headers"].get("x-ref", "")
            which = keys.get(ref.split(":", 1)[1] if ":" in ref else "", ("?", "?"))
            fails.append(f"{d.name} received acme's confidential file: {r['method']} {r['path']} "
                         f"({len(r['body'])} bytes) from globex's {which[0]} path={which[1]!r}")
    for k, (wf, path) in keys.items():
        v = views.get(k) or {}
        print(f"  globex {wf} {path!r}: {v.get('state')!r}; {step_error_text(step_of(v, 'upload'))[:160]}",
              flush=True)
    if c.evil.summary(c.marker["acme"]):
        fails.append("the evil server received acme's file")
    return fails


def check_files_own_tenant(c):
    """Each tenant's own file, named relative to its own folder, reaches its own DMS."""
    fails = []
    for tenant, tok, fname, dms, other in (("acme", c.tokens["ops"], "INV-1.pdf", c.acme_dms, c.globex_dms),
                                           ("globex", c.tokens["globex-ops"], "G-1.pdf", c.globex_dms, c.acme_dms)):
        for wf in ("upload-doc", "upload-raw"):
            r = c.start(tok, wf, {"id": rid(), "file": fname})
            if r.status not in (200, 201):
                fails.append(f"{tenant} {wf} {fname}: start answered {r!r}"); continue
            key = (r.json() or {}).get("key")
            v = c.settle(tok, [key], 20).get(key) or {}
            got = [x for x in dms.for_ref(f"{tenant}:{key}") if c.marker[tenant].encode() in x["body"]]
            if not got:
                fails.append(f"{tenant} {wf} {fname!r}: its own DMS got no upload with the file's bytes; "
                             f"instance {v.get('state')!r}: {step_error_text(step_of(v, 'upload'))[:200]}")
            if [x for x in other.for_ref(f"{tenant}:{key}") if c.marker[tenant].encode() in x["body"]]:
                fails.append(f"{tenant}'s own upload reached the other tenant's DMS")
    return fails

# ================================================================ 3. four eyes

def _wait_approval(c, key, pred, timeout=15):
    box = {}
    def ok():
        v = c.view(c.tokens["ops"], key)
        box["v"] = v
        e = find_approval(v, "approve")
        box["e"] = e
        return pred(e, v)
    wait_for(ok, timeout, 0.25)
    return box.get("e"), box.get("v")


def _erp_calls(c, key):
    out = []
    for r in c.erp.for_ref("acme:" + key):
        try:
            out.append(json.loads(r["body"]))
        except ValueError:
            out.append({"raw": r["body"][:100]})
    return out


def _approval_state(e):
    e = dict(e or {})
    for k in ("next_deadline_in_seconds", "remind_at", "escalate_at", "times_out_at"):
        e.pop(k, None)
    return e


def _refused_then_control(c, key, token_name, resp, entry_before, amount, fails, label):
    """After a decision by token_name that must have been refused: it was a clear 403, changed
    nothing, the ERP got nothing approved by token_name; then dave (the control) approves and the
    ERP gets the order approved by dave."""
    why = problem_why(resp, 403)
    if why:
        fails.append(f"{label}: {token_name}'s approval was not refused with 403: {why}")
    # give an accepted decision time to reach the ERP
    wait_for(lambda: _erp_calls(c, key), 6 if resp.status == 200 else 2, 0.25)
    calls = _erp_calls(c, key)
    bad = [x for x in calls if x.get("approved_by") == token_name]
    if bad:
        fails.append(f"{label}: the ERP received the order approved by {token_name}: {bad}")
    e_after, v_after = _wait_approval(c, key, lambda e, v: True, 0)
    if approval_decided_by(e_after) == token_name:
        fails.append(f"{label}: the approval is decided by {token_name}: {json.dumps((e_after or {}).get('decision'))}")
    if not why and _approval_state(e_after) != _approval_state(entry_before):
        fails.append(f"{label}: the refusal changed the approval: {json.dumps(_approval_state(entry_before))[:200]} "
                     f"-> {json.dumps(_approval_state(e_after))[:200]}")
    if fails:
        return
    # control: another member of the group approves; the order reaches the ERP, approved by dave
    e, _ = _wait_approval(c, key, lambda e, v: approval_is_open(e), 10)
    r = c.decide(c.tokens["dave"], key, e)
    if r.status != 200:
        fails.append(f"{label} (harness control): dave's approval answered {r!r}"); return
    wait_for(lambda: _erp_calls(c, key), 10, 0.25)
    calls = _erp_calls(c, key)
    if not any(x.get("approved_by") == "dave" and x.get("amount") == amount for x in calls):
        fails.append(f"{label} (harness control): after dave's approval the ERP got {calls} "
                     f"(want amount {amount} approved_by dave)")


def check_four_eyes_revise_first(c):
    """alice revises the amount 100 -> 99999 before the request opens, then approves it."""
    if not c.loaded("fe-revise"):
        return [f"harness: fe-revise refused at load: {c.refused_at_load['fe-revise']}"]
    fails, oid = [], rid()
    inp = {"order_id": oid, "amount": 100}
    r = c.start(c.tokens["ops"], "fe-revise", inp)
    if r.status not in (200, 201):
        return [f"harness: start answered {r!r}"]
    key = (r.json() or {}).get("key")
    wait_for(lambda: (step_of(c.view(c.tokens["ops"], key), "hold") or {}).get("state") == "waiting", 10)
    r = c.req("POST", f"/v1/instances/{kpath(key)}/revise",
              {"input": dict(inp, amount=99999), "reason": "customer called (alice)"}, c.tokens["alice"])
    if r.status != 200:
        return [f"harness: alice's revision answered {r!r}"]
    r = c.event(c.tokens["ops"], EV_GO, {"order_ref": key})
    if r.status != 200:
        return [f"harness: the go event answered {r!r}"]
    e, v = _wait_approval(c, key, lambda e, v: approval_is_open(e), 15)
    if not approval_is_open(e):
        return [f"harness: the approval request did not open: {json.dumps(e)[:300]} state {(v or {}).get('state')!r}"]
    if (e.get("snapshot") or {}).get("fields", {}).get("/amount") not in (99999, None):
        fails.append(f"harness: the request's snapshot is not on the revised amount: {e.get('snapshot')}")
    resp = c.decide(c.tokens["alice"], key, e)
    print(f"  alice (who revised) approves request {e.get('request')}: {resp.status} {resp.body[:160]!r}", flush=True)
    _refused_then_control(c, key, "alice", resp, e, 99999, fails, "revise via API")
    return fails


def check_four_eyes_revise_event(c):
    """alice revises through the `revise:` event route, decides early, then the request opens."""
    if not c.loaded("fe-revise"):
        return [f"harness: fe-revise refused at load: {c.refused_at_load['fe-revise']}"]
    fails, oid = [], rid()
    inp = {"order_id": oid, "amount": 100}
    r = c.start(c.tokens["ops"], "fe-revise", inp)
    if r.status not in (200, 201):
        return [f"harness: start answered {r!r}"]
    key = (r.json() or {}).get("key")
    wait_for(lambda: (step_of(c.view(c.tokens["ops"], key), "hold") or {}).get("state") == "waiting", 10)
    r = c.event(c.tokens["alice"], EV_REVISED, {"order_ref": key, "input": dict(inp, amount=99999),
                                                 "reason": "portal change (alice)"})
    outcome = ((r.json() or {}).get("results") or [{}])[0].get("outcome") if r.status == 200 else None
    if outcome != "revised":
        return [f"harness: alice's revise event answered {r!r}"]
    e, v = _wait_approval(c, key, lambda e, v: bool(approval_data_version(e)), 10)
    if not approval_data_version(e):
        return [f"harness: no data version shown before the request opens: approvals={json.dumps((v or {}).get('approvals'))[:300]}"]
    early = c.decide(c.tokens["alice"], key, e, early=True)
    print(f"  alice (who revised) decides early: {early.status} {early.body[:160]!r}", flush=True)
    if early.status != 200:
        why = problem_why(early, 403)
        if why:
            fails.append(f"alice's early decision: neither kept nor a clear 403: {why}")
    r = c.event(c.tokens["ops"], EV_GO, {"order_ref": key})
    if r.status != 200:
        return fails + [f"harness: the go event answered {r!r}"]
    e2, v2 = _wait_approval(c, key, lambda e, v: approval_is_open(e) or (v or {}).get("state") in REST_STATES
                            or approval_decided_by(e), 15)
    wait_for(lambda: _erp_calls(c, key), 4, 0.25)
    bad = [x for x in _erp_calls(c, key) if x.get("approved_by") == "alice"]
    if bad:
        fails.append(f"the ERP received the order approved by alice (her kept early decision was applied): {bad}")
    if approval_decided_by(e2) == "alice":
        fails.append(f"the approval is decided by alice: {json.dumps(e2.get('decision'))}")
    if fails:
        return fails
    if not approval_is_open(e2):
        return [f"harness: the request did not open: {json.dumps(e2)[:300]}"]
    # now alice tries again on the open request: refused as well
    resp = c.decide(c.tokens["alice"], key, e2)
    print(f"  alice approves the open request {e2.get('request')}: {resp.status} {resp.body[:160]!r}", flush=True)
    _refused_then_control(c, key, "alice", resp, e2, 99999, fails, "revise via event")
    return fails


def check_four_eyes_control(c):
    """The harness's own path, which must pass on any build: ops (not in the group) is refused
    with 403 and that changes nothing; dave (in the group, neither starter, requester nor
    reviser) approves and the ERP receives the order approved by dave."""
    if not c.loaded("fe-plain"):
        return [f"harness: fe-plain refused at load: {c.refused_at_load['fe-plain']}"]
    fails = []
    r = c.start(c.tokens["ops"], "fe-plain", {"order_id": rid(), "amount": 4200})
    if r.status not in (200, 201):
        return [f"start answered {r!r}"]
    key = (r.json() or {}).get("key")
    e, v = _wait_approval(c, key, lambda e, v: approval_is_open(e), 15)
    if not approval_is_open(e):
        return [f"the request did not open: {json.dumps(e)[:300]}"]
    resp = c.decide(c.tokens["ops"], key, e)
    print(f"  ops (not in finance) approves: {resp.status} {resp.body[:160]!r}", flush=True)
    _refused_then_control(c, key, "ops", resp, e, 4200, fails, "control")
    return fails


def check_four_eyes_starter(c):
    """The token that started the instance (no `requester` in the definition) may not approve it."""
    if not c.loaded("fe-plain"):
        return [f"harness: fe-plain refused at load: {c.refused_at_load['fe-plain']}"]
    fails = []
    r = c.start(c.tokens["alice"], "fe-plain", {"order_id": rid(), "amount": 100})
    if r.status not in (200, 201):
        return [f"harness: alice's start answered {r!r}"]
    key = (r.json() or {}).get("key")
    e, v = _wait_approval(c, key, lambda e, v: approval_is_open(e), 15)
    if not approval_is_open(e):
        return [f"harness: the request did not open: {json.dumps(e)[:300]}"]
    # harness sanity: a token outside the group is refused (so a 403 is something this server says)
    r = c.decide(c.tokens["ops"], key, e)
    if problem_why(r, 403):
        fails.append(f"harness: ops (not in finance) was not refused: {problem_why(r, 403)}")
    resp = c.decide(c.tokens["alice"], key, e)
    print(f"  alice (who started it) approves: {resp.status} {resp.body[:160]!r}", flush=True)
    _refused_then_control(c, key, "alice", resp, e, 100, fails, "starter")
    return fails


def check_four_eyes_requester_from_input(c):
    """requester: "{{input.submitted_by}}"; alice starts with submitted_by=bob and approves."""
    rc, out, err = c.cli("lint", os.path.join(c.lint_dir, "fe-req.yaml"))
    words = (out + err).strip()
    print(f"  lint fe-req.yaml: exit {rc} {words[:200]!r}", flush=True)
    if not c.loaded("fe-req"):
        if rc != 0:
            return []      # lint and the server refuse the definition: nothing can be started
        return [f"harness: fe-req refused at load but lint passes it: {c.refused_at_load['fe-req']}"]
    fails = []
    r = c.start(c.tokens["alice"], "fe-req", {"order_id": rid(), "amount": 100, "submitted_by": "bob"})
    if r.status not in (200, 201):
        return [f"harness: alice's start answered {r!r}"]
    key = (r.json() or {}).get("key")
    e, v = _wait_approval(c, key, lambda e, v: approval_is_open(e), 15)
    if not approval_is_open(e):
        return [f"harness: the request did not open: {json.dumps(e)[:300]}"]
    req = (e.get("snapshot") or {}).get("requester")
    if req != "bob":
        print(f"  (snapshot requester is {req!r}, not 'bob')", flush=True)
    resp = c.decide(c.tokens["alice"], key, e)
    print(f"  alice (started it, submitted_by=bob) approves: {resp.status} {resp.body[:160]!r}", flush=True)
    _refused_then_control(c, key, "alice", resp, e, 100, fails, "requester from input")
    return fails

# ================================================================ 4. idle sockets

def _raise_nofile(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, n)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def _probe(c, path, token):
    try:
        return c.req("GET", path, token=token, timeout=5).status
    except (OSError, http.client.HTTPException) as e:
        return e.__class__.__name__


def idle_run(c):
    if c.idle_result is not None:
        return c.idle_result
    soft, hard = _raise_nofile(IDLE_COUNT + 500)
    if soft < IDLE_COUNT + 200:
        c.idle_result = {"error": f"RLIMIT_NOFILE is only {soft}/{hard}"}
        return c.idle_result
    if c.proc.poll() is not None:
        c.ensure_server()
    # make sure the token works before the flood (a harness check)
    pre = _probe(c, "/v1/me", c.tokens["ops"])
    socks, opened, errors = [], {}, 0
    t0 = time.monotonic()
    for _ in range(IDLE_COUNT):
        s = socket.socket()
        s.setblocking(True)
        s.settimeout(3)
        try:
            s.connect(("127.0.0.1", c.port))
        except OSError:
            errors += 1; s.close(); continue
        s.setblocking(False)
        socks.append(s)
        opened[s.fileno()] = time.monotonic()
    t_open = time.monotonic() - t0
    poller = select.poll()
    fd2sock = {s.fileno(): s for s in socks}
    for fd in fd2sock:
        poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
    closed, answered = {}, {}

    def drain(timeout_ms):
        for fd, ev in poller.poll(timeout_ms):
            s = fd2sock.get(fd)
            if s is None or fd in closed:
                continue
            try:
                d = s.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                d = b""
            if d:
                answered.setdefault(fd, d.split(b"\r\n", 1)[0][:40])
                continue
            closed[fd] = time.monotonic() - opened[fd]
            poller.unregister(fd)

    # the probes, at once, over fresh connections, while the idle ones hold
    tok = c.tokens["ops"]
    health, me = [], []
    tp = time.monotonic()
    for _ in range(40):
        health.append(_probe(c, "/healthz", None))
        me.append(_probe(c, "/v1/me", tok))
        drain(0)
    t_probe = time.monotonic() - tp
    open_during = len(socks) - len(closed)
    # now watch the idle ones close
    deadline = time.monotonic() + IDLE_WATCH_MAX_S
    while len(closed) < len(socks) and time.monotonic() < deadline:
        drain(250)
    for s in socks:
        s.close()
    times = sorted(closed.values())
    c.idle_result = {"pre": pre, "health": health, "me": me, "opened": len(socks), "connect_errors": errors,
                     "t_open": t_open, "t_probe": t_probe, "open_during": open_during, "closed": times,
                     "answered": answered, "never_closed": len(socks) - len(closed)}
    return c.idle_result


def _counts(lst):
    out = {}
    for x in lst:
        out[x] = out.get(x, 0) + 1
    return out


def check_idle_sockets(c):
    r = idle_run(c)
    if "error" in r:
        return [f"harness: {r['error']}"]
    if r["pre"] != 200:
        return [f"harness: /v1/me answered {r['pre']} before the flood"]
    print(f"  {r['opened']} idle connections opened in {r['t_open']:.1f}s ({r['connect_errors']} connect errors); "
          f"{r['open_during']} still open after the probes ({r['t_probe']:.1f}s); "
          f"/healthz {_counts(r['health'])}, /v1/me {_counts(r['me'])}", flush=True)
    fails = []
    if r["opened"] < IDLE_COUNT - 10:
        fails.append(f"harness: only {r['opened']} idle connections opened")
    h_ok = sum(1 for x in r["health"] if x == 200)
    m_ok = sum(1 for x in r["me"] if x == 200)
    if h_ok != 40:
        fails.append(f"/healthz answered 200 in {h_ok}/40 probes during the idle flood: {_counts(r['health'])}")
    if m_ok < ME_MIN_OK:
        fails.append(f"/v1/me answered 200 in {m_ok}/40 probes (want >= {ME_MIN_OK}): {_counts(r['me'])}")
    return fails


def check_idle_close(c):
    r = idle_run(c)
    if "error" in r:
        return [f"harness: {r['error']}"]
    times = r["closed"]
    ans = _counts(r["answered"].values())
    if times:
        med = times[len(times) // 2]
        print(f"  closed by the server: {len(times)}/{r['opened']}; first {times[0]:.1f}s, median {med:.1f}s, "
              f"last {times[-1]:.1f}s after connect; never closed within {IDLE_WATCH_MAX_S}s: {r['never_closed']}; "
              f"answers seen on idle connections: {ans}", flush=True)
    else:
        print(f"  none of {r['opened']} idle connections was closed within {IDLE_WATCH_MAX_S}s", flush=True)
    fails = []
    if r["never_closed"]:
        fails.append(f"{r['never_closed']}/{r['opened']} idle connections that never sent a byte were still open "
                     f"after {IDLE_WATCH_MAX_S}s")
    late = [t for t in times if t > IDLE_DEADLINE_S]
    if late:
        fails.append(f"{len(late)} idle connections closed only after {IDLE_DEADLINE_S}s "
                     f"(api.read_timeout {READ_TIMEOUT_S}s + 5s): the latest after {max(late):.1f}s")
    return fails

# ================================================================ main

DEFS_BY_WF = {v[0]: v for v in DEFS.values()}

CHECKS = [
    ("lint_destination", check_lint_destination, False),
    ("lint_destination_ok", check_lint_destination_ok, False),
    ("destination_userinfo", check_destination_userinfo, True),
    ("destination_port", check_destination_port, True),
    ("destination_compensation", check_destination_compensation, True),
    ("destination_legit", check_destination_legit, True),
    ("destination_encoding", check_destination_encoding, True),
    ("files_per_tenant", check_files_per_tenant, True),
    ("files_own_tenant", check_files_own_tenant, True),
    ("four_eyes_control", check_four_eyes_control, True),
    ("four_eyes_revise_first", check_four_eyes_revise_first, True),
    ("four_eyes_revise_event", check_four_eyes_revise_event, True),
    ("four_eyes_starter", check_four_eyes_starter, True),
    ("four_eyes_requester_from_input", check_four_eyes_requester_from_input, True),
    ("idle_sockets", check_idle_sockets, True),
    ("idle_close", check_idle_close, True),
]
# shorthands for --only
GROUPS = {"destination_by_data": [n for n, _, _ in CHECKS if n.startswith(("destination_", "lint_"))],
          "files_per_tenant": ["files_per_tenant", "files_own_tenant"],
          "four_eyes": [n for n, _, _ in CHECKS if n.startswith("four_eyes")],
          "idle": ["idle_sockets", "idle_close"]}


def default_exe():
    here = os.path.dirname(os.path.abspath(__file__))
    for p in ("build/apps/waystone", "build/src/cli/waystone"):
        p = os.path.join(here, "..", "..", p)
        if os.access(p, os.X_OK):
            return os.path.abspath(p)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--waystone", default=default_exe())
    ap.add_argument("--only", default="", help="comma-separated check names (or groups: "
                    + ", ".join(GROUPS) + ")")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (db, config, logs)")
    args = ap.parse_args()
    if not args.waystone or not os.access(args.waystone, os.X_OK):
        print(f"no waystone binary: {args.waystone!r}"); return 2
    only = []
    for x in [x for x in args.only.split(",") if x]:
        only += GROUPS.get(x, [x])
    unknown = set(only) - {n for n, _, _ in CHECKS}
    if unknown:
        print(f"unknown checks: {sorted(unknown)}; known: {[n for n, _, _ in CHECKS]} and {list(GROUPS)}")
        return 2

    def on_signal(sig, frame):
        raise KeyboardInterrupt(f"signal {sig}")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    tmp = tempfile.mkdtemp(prefix="waystone-tenantiso-")
    c = Ctx(os.path.abspath(args.waystone), tmp)
    results = {}
    try:
        c.start_downstreams()
        c.write_files()
        for name, fn, needs_server in CHECKS:
            if only and name not in only:
                continue
            t0 = time.monotonic()
            try:
                if needs_server:
                    c.ensure_server()
                fails = fn(c)
            except KeyboardInterrupt:
                raise
            except Exception as e:     # a check that blew up is a failed check
                fails = [f"{e.__class__.__name__}: {e}"]
            results[name] = not fails
            dt = time.monotonic() - t0
            if fails:
                print(f"FAIL {name}: " + "; ".join(f[:600] for f in fails) + f"  ({dt:.1f}s)", flush=True)
            else:
                print(f"PASS {name}  ({dt:.1f}s)", flush=True)
    except KeyboardInterrupt as e:
        print(f"FAIL interrupted: {e}", flush=True)
        results["interrupted"] = False
    except Exception as e:
        print(f"FAIL setup: {e.__class__.__name__}: {e}", flush=True)
        results["setup"] = False
    finally:
        try:
            c.close()
        finally:
            if c.refused_at_load:
                print(f"  (definitions the server refused at load: {sorted(c.refused_at_load)})")
            if args.keep:
                print(f"kept {tmp}")
            else:
                shutil.rmtree(tmp, ignore_errors=True)
    ran = [k for k in results if k not in ("setup", "interrupted")]
    print(f"{sum(results[k] for k in ran)}/{len(ran)} checks passed")
    ok = bool(results) and all(results.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
