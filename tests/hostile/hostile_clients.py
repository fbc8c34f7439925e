#!/usr/bin/env python3
"""Hostile clients: an outsider's adversarial test suite for `waystone serve`.

Written from docs/*.md only. Starts a real server on 127.0.0.1 (SQLite in a temp dir), a small
downstream (http.server) for the workflows to call, and attacks the API over raw sockets.

  python3 tests/hostile/hostile_clients.py --waystone build/src/cli/waystone [--only a,b] [--keep]

Prints `PASS name` / `FAIL name: why` per check; exits 0 only if every check passed.
"""
import argparse, base64, json, os, re, secrets, select, signal, socket, subprocess, sys
import tempfile, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEPTH = 100_000
DEEP = b"[" * DEPTH + b"]" * DEPTH
TENANT_OK = ("acme", "globex")

# ---------------------------------------------------------------- names guessed (adjust here)

def step_error(step):
    """(error class, message) of a step's last error, as GET /v1/instances/{key} shows it."""
    cls = step.get("error_class")
    msg = step.get("error") or step.get("error_message") or step.get("last_error") or ""
    reqs = step.get("requests") or []
    if reqs:
        last = reqs[-1]
        if cls in (None, "none"):
            cls = last.get("error_class")
        msg = msg + " " + (last.get("detail") or "")
    return cls, msg

def token_list_cmd(db):            return ["token", "list", "--db", db]
def token_revoke_cmd(db, name):    return ["token", "revoke", "--db", db, "--name", name]
def token_expires_args(spec):      return ["--expires", spec]

def tenants_config(acme_secrets, globex_secrets):
    return ("tenants:\n"
            "  acme:\n"
            "    workflows: [echo-order, deep-answer, wait-order, manual-order, cursor-probe]\n"
            f"    secrets_file: {acme_secrets}\n"
            "  globex:\n"
            "    workflows: [echo-order]\n"
            f"    secrets_file: {globex_secrets}\n")

# ---------------------------------------------------------------- raw HTTP

class Closed(Exception):
    """The server closed the connection before a complete response."""

class Resp:
    def __init__(self, status, reason, headers, body, raw_head, elapsed):
        self.status, self.reason, self.headers, self.body = status, reason, headers, body
        self.raw_head, self.elapsed = raw_head, elapsed

    def header(self, name):
        name = name.lower()
        for k, v in self.headers:
            if k == name:
                return v
        return None

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def raw(self):
        return self.raw_head + b"\r\n\r\n" + self.body

    def __repr__(self):
        return f"{self.status} {self.body[:200]!r}"


def read_response(sock, timeout=10.0, method="GET", buf=b"", max_body=None):
    """Reads one response; with max_body, stops once the body is known to be larger (the
    Resp then has truncated=True and the body read so far)."""
    deadline = time.monotonic() + timeout
    buf = bytearray(buf)

    def more():
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("response not complete in time")
        sock.settimeout(left)
        d = sock.recv(65536)
        if not d:
            raise Closed("connection closed" + (f" after {len(buf)} bytes" if buf else " without a response"))
        return d

    while True:
        while b"\r\n\r\n" not in buf:
            buf += more()
            if len(buf) > (4 << 20):
                raise ValueError("response head too large")
        head, rest = bytes(buf).split(b"\r\n\r\n", 1)
        buf = bytearray(rest)
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise ValueError(f"bad status line {lines[0][:100]!r}")
        status = int(parts[1])
        reason = parts[2].decode("latin-1") if len(parts) > 2 else ""
        headers = []
        for ln in lines[1:]:
            k, _, v = ln.partition(b":")
            headers.append((k.strip().lower().decode("latin-1"), v.strip().decode("latin-1")))
        if 100 <= status < 200:
            continue
        break
    hd = dict(headers)
    body, truncated = bytearray(), False
    def too_big(n):
        return max_body is not None and n > max_body
    if method == "HEAD" or status in (204, 304):
        pass
    elif "chunked" in hd.get("transfer-encoding", "").lower():
        while True:
            while b"\r\n" not in buf:
                buf += more()
            i = buf.index(b"\r\n")
            size_line, buf = bytes(buf[:i]), buf[i + 2:]
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                while b"\r\n" not in buf:    # trailers end with an empty line
                    buf += more()
                break
            while len(buf) < size + 2:
                buf += more()
            body += buf[:size]
            del buf[:size + 2]
            if too_big(len(body)):
                truncated = True; break
    elif "content-length" in hd:
        n = int(hd["content-length"])
        if too_big(n):
            truncated, body = True, buf
        else:
            while len(buf) < n:
                buf += more()
            body = buf[:n]
    else:
        try:
            while not too_big(len(buf)):
                buf += more()
            truncated = True
        except Closed:
            pass
        body = buf
    r = Resp(status, reason, headers, bytes(body), head, 0.0)
    r.truncated = truncated
    return r


def q(text):
    """Percent-encodes a query value (RFC 3986 unreserved characters stay)."""
    return "".join(chr(b) if chr(b).isalnum() and b < 128 or chr(b) in "-._~" else f"%{b:02X}"
                   for b in str(text).encode("utf-8"))


def _b(x):
    return x if isinstance(x, bytes) else str(x).encode("utf-8")


def request(port, method, path, headers=(), body=None, token=None, timeout=10.0, max_body=None):
    """One request on a fresh connection; headers is a list of (name, value) (str or bytes)."""
    t0 = time.monotonic()
    hl = [(b"Host", b"127.0.0.1"), (b"Connection", b"close")]
    if token:
        hl.append((b"Authorization", b"Bearer " + _b(token)))
    hl += [(_b(k), _b(v)) for k, v in headers]
    if body is not None:
        body = _b(body)
        if not any(k.lower() in (b"content-length", b"transfer-encoding") for k, _ in hl):
            hl.append((b"Content-Length", str(len(body)).encode()))
    data = _b(method) + b" " + _b(path) + b" HTTP/1.1\r\n"
    data += b"".join(k + b": " + v + b"\r\n" for k, v in hl) + b"\r\n" + (body or b"")
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass   # the server may answer and close before reading everything
        r = read_response(s, timeout, method, max_body=max_body)
        r.elapsed = time.monotonic() - t0
        return r
    finally:
        s.close()

JSON = [("Content-Type", "application/json")]

def is_problem(r, status):
    """None if r is a problem+json with this status (or one of these), else why not."""
    want = status if isinstance(status, tuple) else (status,)
    if r.status not in want:
        return f"status {r.status} (want {'/'.join(map(str, want))}) body {r.body[:160]!r}"
    ct = (r.header("content-type") or "").lower()
    if not ct.startswith("application/problem+json"):
        return f"{r.status} with Content-Type {ct!r}"
    j = r.json()
    if not isinstance(j, dict) or not str(j.get("type", "")).startswith("urn:waystone:problem:"):
        return f"{r.status} problem body is not a waystone problem: {r.body[:160]!r}"
    return None

# ---------------------------------------------------------------- the downstream

DOWN_RECORDS, DOWN_LOCK = [], threading.Lock()

class Downstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *a):
        pass

    def _any(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        auth = self.headers.get("Authorization") or ""
        with DOWN_LOCK:
            DOWN_RECORDS.append({"method": self.command, "path": self.path, "auth": auth,
                                 "headers": dict(self.headers.items()), "body": body})
        p = self.path.split("?")[0]
        if p.startswith("/echo"):
            # a careless target: echoes what it received, in the body, a header and the reason
            out = json.dumps({"error": "bad request", "received_headers": dict(self.headers.items()),
                              "received_body": body.decode("utf-8", "replace"),
                              "token_seen": auth.split(" ")[-1]}).encode()
            self._send(400, out, reason="Bad Request, you sent Authorization=" + auth,
                       extra=[("X-Echo-Authorization", auth)])
        elif p == "/deep-json":
            self._send(200, DEEP)
        elif p == "/ok":
            self._send(200, b'{"ok":true,"id":"OK-1"}')
        elif p.startswith("/status/"):
            self._send(int(p.rsplit("/", 1)[1]), b'{"error":"as asked"}')
        else:
            self._send(404, b'{"error":"no such path"}')

    def _send(self, code, body, reason=None, extra=()):
        self.send_response(code, reason)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

# ---------------------------------------------------------------- definitions

DEFS = {
    "echo-order.yaml": """\
workflow: echo-order
key: "echo:{{input.order_id}}"
steps:
  - name: call-erp
    recovery: manual
    request:
      method: POST
      url: "{{env.DOWN_URL}}/echo/{{instance.tenant}}"
      headers: { Authorization: "Bearer {{secret.ERP_TOKEN}}" }
      body: { ref: "{{instance.ref}}" }
      timeout: 2s
""",
    "deep-answer.yaml": """\
workflow: deep-answer
key: "deep:{{input.id}}"
steps:
  - name: fetch-deep
    request: { method: GET, url: "{{env.DOWN_URL}}/deep-json", timeout: 5s }
    retry: { max_attempts: 2, initial_interval: 100ms, max_interval: 200ms }
""",
    "wait-order.yaml": """\
workflow: wait-order
key: "wait:{{input.order_id}}"
steps:
  - name: await-approval
    wait: { event: com.example.order.approved }
  - name: done
    transform: { approved: true }
""",
    "manual-order.yaml": """\
workflow: manual-order
key: "manual:{{input.id}}"
steps:
  - name: reserve
    recovery: compensable
    idempotency: { honored: true }
    request: { method: POST, url: "{{env.DOWN_URL}}/ok", timeout: 2s }
    compensate:
      request: { method: POST, url: "{{env.DOWN_URL}}/ok", timeout: 2s }
  - name: decide
    recovery: manual
    request: { method: POST, url: "{{env.DOWN_URL}}/status/{{input.code}}", timeout: 2s }
""",
    "cursor-probe.yaml": """\
workflow: cursor-probe
key: "probe:{{input.id}}"
steps:
  - name: noop
    transform: { ok: true }
""",
}

# ---------------------------------------------------------------- the harness

class Ctx:
    def __init__(self, exe, tmp):
        self.exe, self.tmp = exe, tmp
        self.db = os.path.join(tmp, "w.db")
        self.proc = None
        self.port = None
        self.tokens = {}
        self.all_tokens = []
        self.acme_secret = secrets.token_hex(16)
        self.globex_secret = secrets.token_hex(16)
        self.out_path = os.path.join(tmp, "server.stdout")
        self.err_path = os.path.join(tmp, "server.stderr")

    # -- processes
    def clean_env(self, **extra):
        env = {k: v for k, v in os.environ.items() if not k.startswith("WAYSTONE_")}
        env.update(extra)
        return env

    def cli(self, *args, env=None, timeout=60):
        p = subprocess.run([self.exe, *args], capture_output=True, timeout=timeout,
                           env=env or self.clean_env())
        return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")

    def make_token(self, name, tenant, role, *extra):
        rc, out, err = self.cli("token", "create", "--db", self.db, "--tenant", tenant,
                                "--role", role, "--name", name, *extra)
        if rc != 0:
            return None, rc, err
        words = re.findall(r"wst_[A-Za-z0-9_\-]+", out)
        tok = words[-1] if words else out.strip().split()[-1]
        self.all_tokens.append(tok)
        return tok, rc, err

    def start_server(self):
        s = socket.socket(); s.bind(("127.0.0.1", 0)); self.port = s.getsockname()[1]; s.close()
        env = self.clean_env(DOWN_URL=self.down_url, WAYSTONE_LOG="debug")
        self.proc = subprocess.Popen(
            [self.exe, "serve", "--config", self.config, "--listen", f"127.0.0.1:{self.port}"],
            stdout=open(self.out_path, "ab"), stderr=open(self.err_path, "ab"), env=env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.logs()[-2000:]}")
            try:
                if request(self.port, "GET", "/healthz", timeout=1).status == 200:
                    return
            except (OSError, Closed, ValueError):
                pass
            time.sleep(0.1)
        raise RuntimeError("server did not answer /healthz in 30 s")

    def stop_server(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill(); self.proc.wait()

    def ensure_server(self):
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:
                print(f"  (server had exited with {self.proc.returncode}; restarting it)", flush=True)
            self.start_server()

    def logs(self):
        data = b""
        for p in (self.out_path, self.err_path):
            if os.path.exists(p):
                data += open(p, "rb").read()
        return data.decode("utf-8", "replace")

    # -- HTTP shortcuts
    def req(self, method, path, headers=(), body=None, token=None, timeout=10.0, max_body=None):
        return request(self.port, method, path, headers, body, token, timeout, max_body)

    def alive(self, pid):
        """None if the same server process is alive and /healthz answers 200, else why not."""
        if self.proc.poll() is not None or self.proc.pid != pid:
            return f"server process {pid} died (exit {self.proc.returncode})"
        try:
            r = self.req("GET", "/healthz", timeout=5)
        except (OSError, Closed, ValueError) as e:
            return f"/healthz failed: {e!r}"
        return None if r.status == 200 else f"/healthz answered {r.status}"

    def start(self, token, workflow, input_, tenant=None):
        doc = {"workflow": workflow, "input": input_}
        if tenant:
            doc["tenant"] = tenant
        return self.req("POST", "/v1/instances", JSON, json.dumps(doc), token)

    def instance(self, token, key):
        r = self.req("GET", "/v1/instances/" + key, token=token)
        return r.json() if r.status == 200 else None

    def keys(self, token, query=""):
        out, cursor = set(), None
        for _ in range(100):
            qs = "?limit=1000" + query + (f"&cursor={q(cursor)}" if cursor else "")
            r = self.req("GET", "/v1/instances" + qs, token=token)
            if r.status != 200:
                raise AssertionError(f"GET /v1/instances{qs} answered {r.status} {r.body[:200]!r}")
            j = r.json()
            out |= {i.get("key") for i in j.get("items", [])}
            cursor = j.get("next_cursor")
            if not cursor:
                return out
        return out

    def snapshot(self, token, key):
        j = self.instance(token, key) or {}
        steps = tuple((s.get("name"), s.get("state"), s.get("attempts"), s.get("compensation_attempts"))
                      for s in j.get("steps") or [])
        alerts = tuple(sorted((a.get("id"), a.get("state")) for a in j.get("alerts") or []))
        return (j.get("state"), steps, len(j.get("audit") or []), alerts)


def wait_for(fn, timeout, interval=0.2):
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(interval)

def rid():
    return secrets.token_hex(4)

# ---------------------------------------------------------------- checks

def check_deep_json(c):
    op, fails = c.tokens["acme-op"], []
    existing = "x" + rid()
    r = c.start(op, "echo-order", {"order_id": existing})
    if r.status not in (200, 201):
        return [f"could not start the existing instance: {r!r}"]
    key = f"echo:{existing}"
    pid, before = c.proc.pid, c.keys(op)
    arr = DEEP
    obj = b'{"a":' * DEPTH + b"1" + b"}" * DEPTH
    def ev(data):
        return (b'{"specversion":"1.0","id":"deep-' + rid().encode() + b'","source":"/hostile",'
                b'"type":"com.example.order.created","data":' + data + b"}")
    cases = [
        ("POST", "/v1/instances", JSON, b'{"workflow":"echo-order","key":"k1","input":' + arr + b"}"),
        ("POST", "/v1/instances", JSON, b'{"workflow":"echo-order","input":{"order_id":"d1","x":' + arr + b"}}"),
        ("POST", "/v1/instances", JSON, b'{"workflow":"echo-order","input":{"order_id":"d2","x":' + obj + b"}}"),
        ("POST", "/v1/instances", JSON, arr),
        ("POST", "/v1/events", [("Content-Type", "application/cloudevents+json")], ev(arr)),
        ("POST", "/v1/events", [("Content-Type", "application/cloudevents+json")], ev(b'{"order_id":"d3","x":' + arr + b"}")),
        ("POST", "/v1/events", [("Content-Type", "application/cloudevents+json")], arr),
        ("POST", "/v1/events", [("Content-Type", "application/cloudevents-batch+json")], b"[" + ev(arr) + b"]"),
        ("POST", "/v1/events", [("Content-Type", "application/cloudevents-batch+json")], arr),
    ]
    for typ, data in (("com.example.order.created", arr),
                      ("com.example.order.created", b'{"order_id":"d4","x":' + arr + b"}"),
                      ("com.example.order.approved", b'{"order_ref":"' + key.encode() + b'","x":' + arr + b"}")):
        cases.append(("POST", "/v1/events", JSON + [("ce-specversion", "1.0"), ("ce-id", "deepbin-" + rid()),
                      ("ce-source", "/hostile"), ("ce-type", typ)], data))
    acts = {"confirm": b'{"step":"call-erp","happened":false,"reason":',
            "retry": b'{"step":"call-erp","reason":', "compensate": b'{"reason":',
            "skip": b'{"step":"call-erp","reason":', "close": b'{"reason":'}
    for k in ("missing-" + rid(), key):
        for act, prefix in acts.items():
            for q in ("?dry_run=true", ""):
                cases.append(("POST", f"/v1/instances/{k}/{act}{q}", JSON, prefix + arr + b"}"))
                cases.append(("POST", f"/v1/instances/{k}/{act}{q}", JSON, arr))
    for q in ("", "?dry_run=true"):
        cases.append(("POST", "/v1/alerts/1/acknowledge" + q, JSON, b'{"reason":' + arr + b"}"))
        cases.append(("POST", "/v1/alerts/1/acknowledge" + q, JSON, arr))
    for m, path, h, body in cases:
        label = f"{path} [{body[:30]!r}...]"
        try:
            r = c.req(m, path, h, body, op, timeout=15)
        except (OSError, Closed, ValueError) as e:
            fails.append(f"{label}: {e!r}")
            if c.proc.poll() is not None:
                fails.append("server died"); break
            continue
        why = is_problem(r, 400)
        if why:
            fails.append(f"{label}: {why}")
    why = c.alive(pid)
    if why:
        return fails + [why]
    after = c.keys(op)
    if after != before:
        fails.append(f"instances changed: +{sorted(after - before)} -{sorted(before - after)}")
    return fails


def check_deep_downstream(c):
    op, pid, key = c.tokens["acme-op"], c.proc.pid, "deep:" + rid()
    r = c.start(op, "deep-answer", {"id": key[5:]})
    if r.status not in (200, 201):
        return [f"start answered {r!r}"]
    seen = {}
    def settled():
        if c.proc.poll() is not None:
            return True
        j = c.instance(op, key)
        for s in (j or {}).get("steps") or []:
            if s.get("name") == "fetch-deep":
                seen["step"] = s
                cls, _ = step_error(s)
                return cls not in (None, "none", "")
        return False
    wait_for(settled, 20, 0.3)
    why = c.alive(pid)
    if why:
        return [why]
    s = seen.get("step")
    if not s:
        return ["instance has no step fetch-deep"]
    cls, msg = step_error(s)
    fails = []
    if cls != "rejected":
        fails.append(f"step error class {cls!r} (want 'rejected'), state {s.get('state')!r}")
    if not re.search(r"depth|nest", msg, re.I):
        fails.append(f"error message does not mention depth/nesting: {msg[:200]!r}")
    return fails


def check_slowloris(c):
    view, pid = c.tokens["acme-view"], c.proc.pid
    head = (b"GET /v1/instances HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slow\r\nX-Slow: "
            + b"a" * 400 + b"\r\n\r\n")
    duration, stop = 30.0, threading.Event()
    stats = {"reconnects": 0}

    def slow():
        socks = [None] * 16
        pos = [0] * 16
        while not stop.is_set():
            for i in range(16):
                try:
                    if socks[i] is None:
                        socks[i] = socket.create_connection(("127.0.0.1", c.port), timeout=2)
                        pos[i] = 0
                    socks[i].send(head[pos[i]:pos[i] + 1])
                    pos[i] = (pos[i] + 1) % len(head)
                except OSError:
                    if socks[i] is not None:
                        socks[i].close()
                        stats["reconnects"] += 1
                    socks[i] = None
            stop.wait(1.0)
        for s in socks:
            if s:
                s.close()

    t = threading.Thread(target=slow, daemon=True)
    t.start()
    time.sleep(1.0)    # deliberate: the slow connections are opened and trickling before we measure
    fails, worst, n = [], 0.0, 0
    end = time.monotonic() + duration
    while time.monotonic() < end:
        tick = time.monotonic()
        for path, tok in (("/healthz", None), ("/v1/instances", view)):
            t0 = time.monotonic()
            try:
                r = c.req("GET", path, token=tok, timeout=3)
                lat = time.monotonic() - t0
                if r.status != 200:
                    fails.append(f"{path} answered {r.status}")
            except (OSError, Closed, ValueError) as e:
                lat = time.monotonic() - t0
                fails.append(f"{path}: {e!r} after {lat:.2f}s")
            n += 1
            worst = max(worst, lat)
            if lat > 1.0:
                fails.append(f"{path} took {lat:.2f}s")
        time.sleep(max(0.0, 0.5 - (time.monotonic() - tick)))    # deliberate: one probe per 0.5 s
    stop.set(); t.join(5)
    print(f"  slowloris: {n} requests, worst latency {worst:.3f}s, slow reconnects {stats['reconnects']}",
          flush=True)
    why = c.alive(pid)
    if len(fails) > 6:
        fails = fails[:6] + [f"... {len(fails) - 6} more"]
    return fails + ([why] if why else [])


def rss_kb(pid):
    for ln in open(f"/proc/{pid}/status"):
        if ln.startswith("VmRSS:"):
            return int(ln.split()[1])
    return 0


def push_chunked(port, token, total=40 << 20, chunk=64 << 10):
    """Streams a chunked body without blocking; stops as soon as the server answers or closes.
    Returns (bytes accepted by the socket, status or None, how it ended)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10)
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    head = (b"POST /v1/instances HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n" + (b"Authorization: Bearer " + token.encode() + b"\r\n" if token else b"")
            + b"\r\n")
    s.sendall(head)
    s.setblocking(False)
    piece = (b"%x\r\n" % chunk) + b" " * chunk + b"\r\n"
    sent, pending, got, ended = 0, memoryview(piece), b"", None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        want_w = [s] if sent < total else []
        r, w, _ = select.select([s], want_w, [], 0.5)
        if r:
            try:
                d = s.recv(65536)
            except (ConnectionResetError, BlockingIOError) as e:
                ended = f"reset ({e.__class__.__name__})"; break
            if not d:
                ended = "closed"; break
            got += d
            if b"\r\n\r\n" in got:
                ended = "answered"; break
        if w:
            try:
                n = s.send(pending)
            except (BrokenPipeError, ConnectionResetError) as e:
                ended = f"reset on send ({e.__class__.__name__})"; break
            except BlockingIOError:
                continue
            sent += n
            pending = pending[n:]
            if len(pending) == 0:
                if sent >= total:
                    try:
                        s.send(b"0\r\n\r\n")
                    except OSError:
                        pass
                else:
                    pending = memoryview(piece)
    status = None
    s.setblocking(True)
    try:
        status = read_response(s, 3, "POST", got).status
    except (OSError, Closed, ValueError):
        if got.startswith(b"HTTP/"):
            try:
                status = int(got.split(b" ", 2)[1])
            except (ValueError, IndexError):
                pass
    s.close()
    return sent, status, ended or "timeout"


def check_chunked_40mb(c):
    pid, fails = c.proc.pid, []
    rss0 = rss_kb(pid)
    for label, tok, want in (("no token", None, 401), ("operator token", c.tokens["acme-op"], 413)):
        try:
            sent, status, ended = push_chunked(c.port, tok)
        except OSError as e:
            fails.append(f"{label}: {e!r}"); continue
        print(f"  chunked {label}: {sent / 1e6:.1f} MB accepted, {ended}, status {status}", flush=True)
        if ended == "timeout":
            fails.append(f"{label}: no answer and no close after {sent / 1e6:.1f} MB")
        elif sent >= (40 << 20):
            fails.append(f"{label}: the server read all {sent / 1e6:.1f} MB before it answered")
        elif sent > (4 << 20) + (256 << 10):
            fails.append(f"{label}: {sent / 1e6:.1f} MB accepted before the server answered/closed (max ~4 MB)")
        if status is not None and status != want:
            fails.append(f"{label}: answered {status}, want {want}")
    time.sleep(0.5)    # deliberate: give a server that the floods broke time to die before asking
    why = c.alive(pid)
    if why:
        return fails + [why]
    growth = (rss_kb(pid) - rss0) / 1024
    print(f"  chunked: VmRSS growth {growth:.1f} MB", flush=True)
    if growth >= 64:
        fails.append(f"VmRSS grew by {growth:.1f} MB")
    return fails


def refused_or_closed(c, raw):
    s = socket.create_connection(("127.0.0.1", c.port), timeout=10)
    try:
        try:
            s.sendall(raw)
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            r = read_response(s, 10)
        except (Closed, ConnectionResetError):
            return None
        return None if r.status in (431, 400) else f"answered {r.status} (want 431/400 or a closed connection)"
    finally:
        s.close()


def check_many_headers(c):
    pid, fails = c.proc.pid, []
    many = b"".join(b"X-H-%d: v\r\n" % i for i in range(10000))
    for label, extra in (("10000 headers", many), ("one 100 KB header", b"X-Big: " + b"a" * 100_000 + b"\r\n")):
        raw = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra + b"Connection: close\r\n\r\n"
        try:
            why = refused_or_closed(c, raw)
        except OSError as e:
            why = repr(e)
        if why:
            fails.append(f"{label}: {why}")
        why = c.alive(pid)
        if why:
            return fails + [f"after {label}: {why}"]
    return fails


def check_multi_range(c):
    plain = c.req("GET", "/v1/openapi.json")
    if plain.status != 200 or not plain.body:
        return [f"GET /v1/openapi.json answered {plain.status}"]
    size = len(plain.body)
    rng = "bytes=" + ",".join(["0-"] * 2000)
    r = c.req("GET", "/v1/openapi.json", [("Range", rng)], max_body=size)
    if r.status not in (200, 206, 416):
        return [f"answered {r.status} (want 200, 206 with one range, or 416)"]
    if r.truncated or len(r.body) > size:
        return [f"{r.status} body larger than the document of {size} bytes (Content-Length "
                f"{r.header('content-length')}, Content-Type {r.header('content-type')!r})"]
    if r.status == 200 and r.body != plain.body:
        return ["200 but the body is not the document"]
    if r.status == 206 and "multipart" in (r.header("content-type") or "").lower():
        return ["206 multipart/byteranges"]
    return []


BAD_RAW = (b"\xff\xfe", b"\xc0\xaf", b"\xed\xa0\x80")   # invalid, overlong, a surrogate
# Percent-encoded in ce-* headers: a receiver that decodes them (the CloudEvents HTTP binding says
# it should) gets invalid UTF-8 and must refuse; one that does not must keep the text literally.
BAD_PCT = (b"%FF%FE", b"%C0%AF", b"%ED%A0%80")
CE_ATTRS = ("id", "source", "type", "specversion", "subject", "time", "tenant")

def ce_attrs(n, kind, attr):
    a = {"specversion": "1.0", "id": f"u8-{n}", "source": "/hostile/utf8",
         "type": "com.example.order.created" if kind == "start" else "com.example.order.approved"}
    if attr == "subject":
        a["subject"] = "order"
    if attr == "time":
        a["time"] = "2024-01-01T00:00:00Z"
    if attr == "tenant":
        a["tenant"] = "acme"
    return a

def ce_json(attrs, data, bad_attr=None, bad=b""):
    """One structured event; bad is appended raw to the value of attribute bad_attr."""
    members = [json.dumps(k).encode() + b':"' + attrs[k].encode() + (bad if k == bad_attr else b"") + b'"'
               for k in attrs]
    members.append(b'"data":' + json.dumps(data).encode())
    return b"{" + b",".join(members) + b"}"

def send_event(c, token, mode, attrs, data, bad_attr=None, bad=b"", before=()):
    """POST /v1/events in binary, structured or batch mode (batch: the events `before`, each
    (attrs, data), then this one)."""
    if mode == "binary":
        h = JSON + [("ce-" + k, attrs[k].encode() + (bad if k == bad_attr else b"")) for k in attrs]
        return c.req("POST", "/v1/events", h, json.dumps(data), token)
    if mode == "binary-dup":    # the valid header, then a second copy of it with the bad bytes
        h = JSON + [("ce-" + k, attrs[k]) for k in attrs]
        if bad_attr:
            h.append(("ce-" + bad_attr, attrs[bad_attr].encode() + bad))
        return c.req("POST", "/v1/events", h, json.dumps(data), token)
    if mode == "structured":
        return c.req("POST", "/v1/events", [("Content-Type", "application/cloudevents+json")],
                     ce_json(attrs, data, bad_attr, bad), token)
    body = b"[" + b",".join([ce_json(a, d) for a, d in before] + [ce_json(attrs, data, bad_attr, bad)]) + b"]"
    return c.req("POST", "/v1/events", [("Content-Type", "application/cloudevents-batch+json")], body, token)

def utf8_variants():
    for mode in ("binary", "binary-dup", "structured", "batch"):
        for kind in ("start", "signal"):
            for attr in CE_ATTRS:
                bads = {"binary": BAD_RAW, "binary-dup": BAD_RAW[:1], "structured": BAD_RAW,
                        "batch": BAD_RAW[1:2]}[mode]
                for bad in bads:
                    yield mode, kind, attr, bad, "acme-op"
                    if attr == "tenant":    # a token of all tenants picks the tenant by this attribute
                        yield mode, kind, attr, bad, "admin-all"

def pct_case(c, n, attr, bad):
    """Binary mode, a percent-encoded invalid sequence: refused, or kept as literal text."""
    op = c.tokens["acme-op"]
    oid = f"p{n}{rid()}"
    attrs = ce_attrs(f"{n}-{rid()}", "start", attr)
    before = c.keys(op)
    r = send_event(c, op, "binary", attrs, {"order_id": oid}, attr, bad)
    tag = f"binary/start/{attr}/{bad.decode()}"
    # refused: 400 (decoded, not UTF-8); kept literally: 403 (another tenant), 422 (no such route)
    if r.status == 400 or (attr, r.status) in (("tenant", 403), ("type", 422)):
        why = is_problem(r, r.status)
        if why:
            return [f"{tag}: {why}"]
        return [f"{tag}: refused, yet instances changed"] if c.keys(op) != before else []
    if not 200 <= r.status < 300:
        return [f"{tag}: answered {r!r}"]
    try:
        res = (json.loads(r.body.decode("utf-8")).get("results") or [{}])[0]
    except (UnicodeDecodeError, ValueError):
        return [f"{tag}: accepted, and the answer is not UTF-8 JSON: {r.body[:120]!r}"]
    literal = attrs[attr] + bad.decode()
    if attr in ("id", "source", "type") and res.get(attr) != literal:
        return [f"{tag}: accepted, and {attr} came back as {res.get(attr)!r}, not {literal!r}"]
    return []

def utf8_case(c, n, mode, kind, attr, bad, tok, known):
    op, tk, fails = c.tokens["acme-op"], c.tokens[tok], []
    tag = f"{mode}/{kind}/{attr}/{bad!r}/{tok}"
    oid = f"u{n}{rid()}"
    if kind == "signal":
        key = f"wait:{oid}"
        r = c.start(op, "wait-order", {"order_id": oid})
        if r.status not in (200, 201):
            return [f"{tag}: could not start {key}: {r!r}"], known
        wait_for(lambda: any(s.get("state") == "waiting" for s in
                             (c.instance(op, key) or {}).get("steps") or []), 5, 0.1)
        known = known | {key}
        data = {"order_ref": key, "approver": "mika"}
    else:
        key, data = f"echo:{oid}", {"order_id": oid}
    attrs = ce_attrs(f"{n}-{rid()}", kind, attr)
    before = [(ce_attrs(f"{n}-b-{rid()}", "start", "tenant" if tok == "admin-all" else None),
               {"order_id": oid + "b"})] if mode == "batch" else []
    r = send_event(c, tk, mode, attrs, data, attr, bad, before)
    why = is_problem(r, 400)
    if why:
        fails.append(f"{tag}: {why}")
    now = c.keys(op)
    if now != known:
        fails.append(f"{tag}: instances changed: +{sorted(now - known)}")
    if kind == "signal":       # the waiting instance holds no worker: a 409 here is a leaked lock
        a = c.req("POST", f"/v1/instances/{key}/close?dry_run=true", JSON,
                  '{"reason":"probe after a refused event"}', op)
        if a.status != 200:
            fails.append(f"{tag}: operator dry-run close after the bad event answered {a!r}")
    r = send_event(c, tk, mode, attrs, data, before=before)
    results = (r.json() or {}).get("results") or [] if 200 <= r.status < 300 else []
    want = (["started"] if before else []) + ["started" if kind == "start" else "signalled"]
    got = [x.get("outcome") for x in results]
    if not (200 <= r.status < 300) or got != want:
        fails.append(f"{tag}: the valid event answered {r.status} outcomes {got} (want 2xx {want}) {r.body[:120]!r}")
    known = c.keys(op)
    if kind == "start" and key not in known:
        fails.append(f"{tag}: the valid start event created no {key}")
    if kind == "signal":
        wait_for(lambda: (c.instance(op, key) or {}).get("state") not in ("running", None), 5, 0.1)
        for _ in range(3):    # a worker may hold it for a moment while it finishes: try again
            a = c.req("POST", f"/v1/instances/{key}/close?dry_run=true", JSON,
                      '{"reason":"probe after the signal"}', op)
            if a.status != 409:
                break
            time.sleep(0.5)    # deliberate: a back-off before trying again
        if a.status != 200:
            fails.append(f"{tag}: operator dry-run close after the signal answered {a!r}")
    return fails, known

def text_data_case(c, n, bad):
    """Binary mode, non-JSON data that is not UTF-8, for a waiting instance: 400, nothing
    claimed or locked; the proper JSON signal then works."""
    op, oid = c.tokens["acme-op"], f"t{n}{rid()}"
    key = f"wait:{oid}"
    tag = f"binary/signal/text-data/{bad!r}"
    if c.start(op, "wait-order", {"order_id": oid}).status not in (200, 201):
        return [f"{tag}: could not start {key}"]
    wait_for(lambda: any(s.get("state") == "waiting" for s in
                         (c.instance(op, key) or {}).get("steps") or []), 5, 0.1)
    attrs, fails = ce_attrs(f"t{n}-{rid()}", "signal", None), []
    h = [("Content-Type", "text/plain; charset=utf-8")] + [("ce-" + k, v) for k, v in attrs.items()]
    before = c.snapshot(op, key)
    why = is_problem(c.req("POST", "/v1/events", h, b"approved " + bad, op), 400)
    if why:
        fails.append(f"{tag}: {why}")
    if c.snapshot(op, key) != before:
        fails.append(f"{tag}: the waiting instance changed")
    a = c.req("POST", f"/v1/instances/{key}/close?dry_run=true", JSON, '{"reason":"probe"}', op)
    if a.status != 200:
        fails.append(f"{tag}: operator dry-run close answered {a!r}")
    r = send_event(c, op, "binary", attrs, {"order_ref": key, "approver": "mika"})
    got = [x.get("outcome") for x in (r.json() or {}).get("results") or []] if r.status < 300 else []
    if got != ["signalled"]:
        fails.append(f"{tag}: the proper signal answered {r.status} {got} {r.body[:120]!r}")
    return fails

def check_utf8_ce(c):
    fails, known = [], c.keys(c.tokens["acme-op"])
    for n, v in enumerate(utf8_variants()):
        f, known = utf8_case(c, n, *v, known)
        fails += f
        if c.proc.poll() is not None:
            fails.append("server died"); break
    for n, (attr, bad) in enumerate((a, b) for a in CE_ATTRS for b in BAD_PCT):
        fails += pct_case(c, n, attr, bad)
    for n, bad in enumerate(BAD_RAW):
        fails += text_data_case(c, n, bad)
    if len(fails) > 12:
        fails = fails[:12] + [f"... {len(fails) - 12} more"]
    return fails


DRY_BAD = ("TRUE", "1", "yes", "true&dry_run=true", "true&dry_run=false",
           "True", "", "false&dry_run=false")

def alert_of(c, token, key):
    r = c.req("GET", "/v1/alerts?state=open", token=token)
    for a in (r.json() or {}).get("items") or []:
        if a.get("instance") == key:
            return a
    return None

def check_dry_run_strict(c):
    op, fails = c.tokens["acme-op"], []
    failed_key, unknown_key = "manual:f" + rid(), "manual:u" + rid()
    for key, code in ((failed_key, 422), (unknown_key, 502)):
        r = c.start(op, "manual-order", {"id": key[7:], "code": code})
        if r.status not in (200, 201):
            return [f"could not start {key}: {r!r}"]
    for key in (failed_key, unknown_key):
        if not wait_for(lambda: (c.instance(op, key) or {}).get("state") == "needs_attention", 15, 0.3):
            return [f"{key} did not reach needs_attention: {c.instance(op, key)}"]
    alert = wait_for(lambda: alert_of(c, op, failed_key) or alert_of(c, op, unknown_key), 10, 0.3)
    if not alert:
        return ["no open alert for the needs_attention instances"]
    routes = [(f"/v1/instances/{failed_key}/retry", '{"step":"decide","reason":"r"}', failed_key),
              (f"/v1/instances/{unknown_key}/confirm", '{"step":"decide","happened":false,"reason":"r"}', unknown_key),
              (f"/v1/instances/{failed_key}/compensate", '{"reason":"r"}', failed_key),
              (f"/v1/instances/{failed_key}/skip", '{"step":"decide","reason":"r"}', failed_key),
              (f"/v1/instances/{failed_key}/close", '{"reason":"r"}', failed_key),
              (f"/v1/alerts/{alert['id']}/acknowledge", '{"reason":"r"}', alert.get("instance"))]
    before = {k: c.snapshot(op, k) for k in (failed_key, unknown_key)}
    r = c.req("POST", f"/v1/instances/{failed_key}/close?dry_run=true", JSON, '{"reason":"r"}', op)
    if r.status != 200 or (r.json() or {}).get("dry_run") is not True:
        fails.append(f"sanity: close?dry_run=true answered {r!r}")
    for path, body, _ in routes:
        for v in DRY_BAD:
            r = c.req("POST", f"{path}?dry_run={v}", JSON, body, op)
            why = is_problem(r, 400)
            if why:
                fails.append(f"{path}?dry_run={v}: {why}")
    for k in before:
        after = c.snapshot(op, k)
        if after != before[k]:
            fails.append(f"{k} changed: {before[k]} -> {after}")
    still = alert_of(c, op, alert.get("instance"))
    if not still or still.get("id") != alert["id"]:
        fails.append(f"alert {alert['id']} is no longer open")
    return fails


def check_secret_echo(c):
    op, adm, sec, fails = c.tokens["acme-op"], c.tokens["admin-all"], c.acme_secret, []
    oid = "sec" + rid()
    key = f"echo:{oid}"
    r = c.start(op, "echo-order", {"order_id": oid})
    if r.status not in (200, 201):
        return [f"start answered {r!r}"]
    def failed():
        for s in (c.instance(op, key) or {}).get("steps") or []:
            if s.get("state") in ("failed", "unknown") or step_error(s)[0] not in (None, "none"):
                return True
        return False
    if not wait_for(failed, 15, 0.3):
        return [f"step call-erp did not fail: {c.instance(op, key)}"]
    time.sleep(1.0)    # deliberate: let what the engine writes after the failure land before the leak check
    with DOWN_LOCK:
        carried = [d for d in DOWN_RECORDS if d["path"] == "/echo/acme" and sec in d["auth"]]
    if not carried:
        fails.append("the downstream never received acme's ERP_TOKEN: the check proves nothing")
    needle = sec.encode()
    api = [("GET", f"/v1/instances/{key}", op), ("GET", "/v1/instances", op),
           ("GET", "/v1/instances?error_class=rejected", op), ("GET", "/v1/instances?alert=any", op),
           ("GET", "/v1/alerts", op), ("GET", "/v1/alerts?state=open", op),
           ("GET", "/v1/alerts?state=resolved", op), ("GET", f"/v1/instances/{key}?tenant=acme", adm),
           ("GET", "/metrics", adm)]
    for m, p, tok in api:
        r = c.req(m, p, token=tok)
        if needle in r.raw():
            fails.append(f"secret in the answer of {m} {p}")
    env = c.clean_env(WAYSTONE_TOKEN=op, WAYSTONE_SERVER=f"http://127.0.0.1:{c.port}")
    srv = ["--server", f"http://127.0.0.1:{c.port}"]
    cmds = [(["status", key, "--db", c.db, "--tenant", "acme"], True),
            (["status", key, "--db", c.db, "--tenant", "acme", "--json"], True),
            (["status", "--db", c.db], False), (["list", "--db", c.db, "--tenant", "acme", "--json"], False),
            (["show", key, *srv], True), (["show", key, "--json", *srv], True),
            (["instances", *srv], False), (["alerts", "--json", *srv], False)]
    for args, must_work in cmds:
        rc, out, err = c.cli(*args, env=env)
        if sec in out or sec in err:
            fails.append(f"secret in the output of `waystone {' '.join(args)}`")
        if must_work and (rc != 0 or oid not in out):
            fails.append(f"`waystone {' '.join(args)}` exited {rc} without showing the instance: {err[-200:]!r}")
    for f in ("w.db", "w.db-wal", "w.db-shm"):
        p = os.path.join(c.tmp, f)
        if os.path.exists(p) and needle in open(p, "rb").read():
            fails.append(f"secret in the bytes of {f}")
    if sec in c.logs():
        fails.append("secret in the server's stdout/stderr")
    return fails


def check_tenants(c):
    fails = []
    gop, iop, adm = c.tokens["globex-op"], c.tokens["initech-op"], c.tokens["admin-all"]
    # (a) workflows per tenant
    oid = "t" + rid()
    r = c.start(gop, "deep-answer", {"id": oid})
    why = is_problem(r, (403, 422))
    if why:
        fails.append(f"(a) globex starting deep-answer: {why}")
    if c.instance(adm, f"deep:{oid}?tenant=globex") or c.instance(gop, f"deep:{oid}"):
        fails.append("(a) globex's refused deep-answer instance exists")
    for wf, inp, key in (("echo-order", {"order_id": oid}, f"echo:{oid}"), ("deep-answer", {"id": oid}, f"deep:{oid}")):
        r = c.start(iop, wf, inp)
        why = is_problem(r, (403, 422))
        if why:
            fails.append(f"(a) initech starting {wf}: {why}")
        if c.instance(iop, key) or c.instance(adm, key + "?tenant=initech"):
            fails.append(f"(a) initech's {key} exists")
    r = send_event(c, iop, "structured", ce_attrs("init-" + rid(), "start", None), {"order_id": oid + "e"})
    if 200 <= r.status < 300:
        fails.append(f"(a) initech's start event accepted: {r!r}")
    if c.instance(iop, f"echo:{oid}e"):
        fails.append("(a) initech's event created an instance")
    # (b) each tenant renders its own secrets
    goid = "g" + rid()
    r = c.start(gop, "echo-order", {"order_id": goid})
    if r.status not in (200, 201):
        fails.append(f"(b) globex starting echo-order answered {r!r}")
    else:
        ref = f"globex:echo:{goid}".encode()
        got = wait_for(lambda: [d for d in list(DOWN_RECORDS) if ref in d["body"]], 15, 0.3)
        if not got:
            fails.append("(b) the downstream never saw globex's request")
        for d in got or []:
            if c.acme_secret in d["auth"]:
                fails.append("(b) globex's request carried ACME's ERP_TOKEN")
            elif c.globex_secret not in d["auth"]:
                fails.append(f"(b) globex's request did not carry globex's ERP_TOKEN: {d['auth'][:60]!r}")
    with DOWN_LOCK:
        for d in DOWN_RECORDS:
            if d["path"].startswith("/echo/acme") and c.globex_secret in d["auth"]:
                fails.append("(b) an acme request carried globex's ERP_TOKEN"); break
    # (c) tokens of all tenants
    for role in ("operator", "viewer"):
        tok, rc, _ = c.make_token(f"star-{role}-{rid()}", "*", role)
        if rc == 0:
            fails.append(f"(c) token create --tenant '*' --role {role} succeeded")
    tok, rc, err = c.make_token(f"star-admin-{rid()}", "*", "admin")
    if rc != 0:
        fails.append(f"(c) token create --tenant '*' --role admin failed: {err[-200:]!r}")
    # (d) list, revoke, expiry, unique names
    rc, out, err = c.cli(*token_list_cmd(c.db))
    if rc != 0:
        fails.append(f"(d) `token list` exited {rc}: {err[-200:]!r}")
    else:
        for name, tenant, role in c.token_specs:
            if not any(name in ln and tenant in ln and role in ln for ln in out.splitlines()):
                fails.append(f"(d) `token list` has no line with {name} {tenant} {role}")
        if any(t in out for t in c.all_tokens):
            fails.append("(d) `token list` prints token secrets")
    name = "rev-" + rid()
    tok, rc, err = c.make_token(name, "acme", "viewer")
    if not tok:
        fails.append(f"(d) could not create {name}: {err[-200:]!r}")
    else:
        s0 = c.req("GET", "/v1/instances?limit=1", token=tok).status
        rc, _, err = c.cli(*token_revoke_cmd(c.db, name))
        s1 = c.req("GET", "/v1/instances?limit=1", token=tok).status
        if s0 != 200 or rc != 0 or s1 != 401:
            fails.append(f"(d) revoke: before {s0}, revoke exit {rc} {err[-120:]!r}, after {s1} (want 200, 0, 401)")
    name = "exp-" + rid()
    tok, rc, err = c.make_token(name, "acme", "viewer", *token_expires_args("2s"))
    if not tok:
        fails.append(f"(d) token create --expires 2s failed ({rc}): {err[-200:]!r}")
    else:
        s0 = c.req("GET", "/v1/instances?limit=1", token=tok).status
        time.sleep(3.0)    # deliberate: the token's 2 s lifetime must pass
        s1 = c.req("GET", "/v1/instances?limit=1", token=tok).status
        if s0 != 200 or s1 != 401:
            fails.append(f"(d) expiring token: {s0} at once, {s1} after 3 s (want 200 then 401)")
    tok, rc, _ = c.make_token("acme-view", "acme", "viewer")
    if rc == 0:
        fails.append("(d) a second token named acme-view was created")
    # (e) metrics
    r0, r1 = c.req("GET", "/metrics"), c.req("GET", "/metrics", token=adm)
    if r0.status != 401:
        fails.append(f"(e) /metrics without a token answered {r0.status}")
    if r1.status != 200:
        fails.append(f"(e) /metrics with an admin token answered {r1.status}")
    # (f) cursors do not count other tenants' instances
    aop, base, others = c.tokens["acme-op"], rid(), 7
    c.start(aop, "cursor-probe", {"id": base + "1"})
    for i in range(others):
        c.start(gop, "echo-order", {"order_id": f"cur{base}{i}"})
    for i in (2, 3, 4):
        c.start(aop, "cursor-probe", {"id": base + str(i)})
    cursors, cur = [], None
    for _ in range(3):
        path = "/v1/instances?workflow=cursor-probe&limit=1" + (f"&cursor={q(cur)}" if cur else "")
        r = c.req("GET", path, token=aop)
        cur = (r.json() or {}).get("next_cursor") if r.status == 200 else None
        if not cur:
            fails.append(f"(f) {path} answered {r.status} without next_cursor"); break
        cursors.append(str(cur))
    for cu in cursors:
        if re.fullmatch(r"\s*\d+\s*", cu):
            fails.append(f"(f) next_cursor is a plain integer: {cu!r}"); break
    if len(cursors) == 3:
        leak = cursor_leak(cursors, others)
        if leak:
            fails.append(f"(f) {leak}")
    # (f) no database ids of instances either (docs/http-api.md: "the API shows no database ids")
    items = (c.req("GET", "/v1/instances?workflow=cursor-probe", token=aop).json() or {}).get("items") or []
    one = c.instance(aop, f"probe:{base}1") or {}
    alerts = (c.req("GET", "/v1/alerts", token=aop).json() or {}).get("items") or []
    if any("id" in i for i in items + [one]) or any("instance_id" in a for a in alerts):
        fails.append("(f) instances carry database ids ('id' in instances or 'instance_id' in alerts)")
    return fails


def cursor_forms(cu):
    forms = [cu]
    try:
        forms.append(bytes.fromhex(cu).decode("ascii") if re.fullmatch(r"(?:[0-9a-fA-F]{2})+", cu) else "")
    except (ValueError, UnicodeDecodeError):
        forms.append("")
    try:
        d = base64.urlsafe_b64decode(cu.replace("+", "-").replace("/", "_") + "=" * (-len(cu) % 4))
        forms.append(d.decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        forms.append("")
    return forms

def cursor_leak(cursors, others):
    """A number in the cursor that jumps by the other tenant's instances between pages 1 and 2
    (others + 1) but by 1 between pages 2 and 3 is a global row counter."""
    f1, f2, f3 = (cursor_forms(x) for x in cursors)
    for i in range(len(f1)):
        n1, n2, n3 = (list(map(int, re.findall(r"\d+", f[i]))) for f in (f1, f2, f3))
        if len(n1) == len(n2) == len(n3):
            for a, b, d in zip(n1, n2, n3):
                if b - a >= others + 1 and 0 < d - b <= 2:
                    return f"cursors {cursors} carry a counter of all tenants' rows ({a} -> {b} -> {d})"
    return None

# ---------------------------------------------------------------- main

CHECKS = [("deep-json", check_deep_json), ("deep-downstream", check_deep_downstream),
          ("slowloris", check_slowloris), ("chunked-40mb", check_chunked_40mb),
          ("many-headers", check_many_headers), ("multi-range", check_multi_range),
          ("utf8-ce", check_utf8_ce), ("dry-run-strict", check_dry_run_strict),
          ("secret-echo", check_secret_echo), ("tenants", check_tenants)]


def setup(c):
    os.makedirs(os.path.join(c.tmp, "defs"))
    for name, text in DEFS.items():
        with open(os.path.join(c.tmp, "defs", name), "w") as f:
            f.write(text)
    sec = {}
    for t, v in (("acme", c.acme_secret), ("globex", c.globex_secret)):
        sec[t] = os.path.join(c.tmp, f"{t}.secrets")
        with open(sec[t], "w") as f:
            f.write(f"ERP_TOKEN={v}\n")
        os.chmod(sec[t], 0o600)
    down = ThreadingHTTPServer(("127.0.0.1", 0), Downstream)
    down.daemon_threads = True
    threading.Thread(target=down.serve_forever, daemon=True).start()
    c.down, c.down_url = down, f"http://127.0.0.1:{down.server_address[1]}"
    c.config = os.path.join(c.tmp, "waystone.yaml")
    with open(c.config, "w") as f:
        f.write(f"database: {c.db}\nlisten: 127.0.0.1:8080\nworkers: 4\n"
                f"definitions: {os.path.join(c.tmp, 'defs')}\n"
                "api:\n  max_body_bytes: 1048576\n  read_timeout: 10s\n"
                "events:\n"
                "  - type: com.example.order.created\n    start: echo-order\n"
                "  - type: com.example.order.approved\n    signal: { key: /order_ref }\n"
                + tenants_config(sec["acme"], sec["globex"]))
    rc, out, err = c.cli("lint", *sorted(os.path.join(c.tmp, "defs", n) for n in DEFS))
    if rc != 0:
        print(f"  lint exited {rc}:\n{out}{err}", flush=True)
    c.start_server()
    c.token_specs = [("acme-op", "acme", "operator"), ("acme-view", "acme", "viewer"),
                     ("globex-op", "globex", "operator"), ("globex-view", "globex", "viewer"),
                     ("initech-op", "initech", "operator"), ("admin-all", "*", "admin")]
    for name, tenant, role in c.token_specs:
        tok, rc, err = c.make_token(name, tenant, role)
        if not tok:
            raise RuntimeError(f"token create {name} failed ({rc}): {err}")
        c.tokens[name] = tok


def default_exe():
    for p in ("build/src/cli/waystone", "build/apps/waystone"):
        p = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", p)
        if os.access(p, os.X_OK):
            return os.path.abspath(p)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--waystone", default=default_exe())
    ap.add_argument("--only", default="")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    if not args.waystone or not os.access(args.waystone, os.X_OK):
        print(f"no waystone binary: {args.waystone!r}"); return 2
    only = [x for x in args.only.split(",") if x]
    unknown = set(only) - {n for n, _ in CHECKS}
    if unknown:
        print(f"unknown checks: {sorted(unknown)}; known: {[n for n, _ in CHECKS]}"); return 2
    tmp = tempfile.mkdtemp(prefix="waystone-hostile-")
    c = Ctx(os.path.abspath(args.waystone), tmp)
    results = {}
    try:
        setup(c)
        for name, fn in CHECKS:
            if only and name not in only:
                continue
            t0 = time.monotonic()
            try:
                c.ensure_server()
                fails = fn(c)
            except Exception as e:     # a check that blew up is a failed check
                fails = [f"{e.__class__.__name__}: {e}"]
            results[name] = not fails
            dt = time.monotonic() - t0
            if fails:
                print(f"FAIL {name}: " + "; ".join(f[:400] for f in fails) + f"  ({dt:.1f}s)", flush=True)
            else:
                print(f"PASS {name}  ({dt:.1f}s)", flush=True)
    except Exception as e:     # no server: every check that did not run fails
        print(f"FAIL setup: {e}", flush=True)
        results["setup"] = False
        for name, _ in CHECKS:
            if name not in results and (not only or name in only):
                print(f"FAIL {name}: not run (setup failed)")
                results[name] = False
    finally:
        c.stop_server()
        if getattr(c, "down", None):
            c.down.shutdown()
        if args.keep:
            print(f"kept {tmp}")
        else:
            subprocess.run(["rm", "-rf", tmp])
    ok = bool(results) and all(results.values())
    ran = [k for k in results if k != "setup"]
    print(f"{sum(results[k] for k in ran)}/{len(ran)} checks passed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
