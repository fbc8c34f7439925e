#!/usr/bin/env python3
"""Tenant secrets: an outsider's black-box test of what `waystone serve` lets a token see.

Written from docs/*.md, README.md and examples/ only. Starts its own `waystone serve` (SQLite in
a temp dir, 127.0.0.1, free ports), its own downstreams (http.server in threads, each COUNTING
what it received) and, for the relay checks, its own `waystone relay` processes; cleans up all.

  python3 tests/hostile/tenant_secrets.py --waystone build/apps/waystone [--keep]

Checks (one line each, `ok` / `FAIL`, then a summary; exit 0 only when every check passed):
  1 secret_cut_*        an echoed Bearer secret cut at the 500-character message limit: no 6+
                        character prefix of it in the viewer's (and admin's) answers
  2 oauth_*             the OAuth2 access token, the client secret and the Basic value the
                        engine itself sent, echoed back by our resource/token servers: not shown
  3 redact_*            a redacted non-ASCII input value echoed JSON-escaped; input_hash keyed for
                        viewers; a 409 business-key conflict must not hand a token without
                        see_redacted the plain input hash either (redact_conflict_hash)
  4 token_name_*        token names with NUL, ESC, U+202E, ZWSP, Latin+Cyrillic, fullwidth refused
  5 tenant_*, token_create_no_store   /metrics, targets, pause, token listing across tenants
  6 relay_*             a sink needs its tenants; acme's sink gets acme's events only, no
                        instance_id in any event's data, no secret in any event
  7 approval_contradictions_one_alert   late contradicting decisions: refused, one alert
Python 3 standard library only.
"""
import argparse, base64, hashlib, json, os, re, secrets, shutil, signal, socket, subprocess
import sys, tempfile, threading, time, urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import http.client

REST = {"completed", "compensated", "failed", "closed", "needs_attention"}
TOKEN_RE = re.compile(r"wst_[0-9a-f]{64}")
# letters that are not hex digits: a 6-character prefix cannot turn up by chance in ids/hashes
ALPHA = "ghijklmnopqrstuvwxyzGHIJKLMNOPQRSTUVWXYZ"

def letters(n):
    return "".join(secrets.choice(ALPHA) for _ in range(n))

def rid():
    return secrets.token_hex(3)

def kpath(key):
    return urllib.parse.quote(key, safe=":")

# ================================================================ HTTP client

class Resp:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body
        self.text = body.decode("utf-8", "replace")

    def header(self, name):
        return self.headers.get(name.lower())

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def short(self, n=240):
        return f"{self.status} {self.text[:n]!r}"

def hreq(port, method, path, body=None, token=None, headers=None, timeout=15.0):
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
        return Resp(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        c.close()

def all_strings(doc):
    """Every string (keys too) of a parsed JSON document."""
    out = []
    def walk(x):
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, dict):
            for k, v in x.items():
                out.append(k); walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(doc)
    return out

def has_key(doc, name):
    if isinstance(doc, dict):
        return name in doc or any(has_key(v, name) for v in doc.values())
    if isinstance(doc, list):
        return any(has_key(v, name) for v in doc)
    return False

def wait_for(fn, timeout, interval=0.25):
    end = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() >= end:
            return v
        time.sleep(interval)

# ================================================================ downstreams that count

class Down:
    """http.server downstream recording each request; respond(method, path, headers, body) -> (status, body)."""

    def __init__(self, name, respond=None):
        self.name, self.records, self.lock = name, [], threading.Lock()
        self.respond = respond or (lambda *a: (200, {"id": "OK-1"}))
        me = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"
            def log_message(self, *a):
                pass
            def _any(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                hd = {k.lower(): v for k, v in self.headers.items()}
                with me.lock:
                    me.records.append({"method": self.command, "path": self.path, "headers": hd, "body": body})
                try:
                    status, out = me.respond(self.command, self.path, hd, body)
                except Exception as e:
                    status, out = 500, {"error": repr(e)}
                out = (json.dumps(out) if isinstance(out, dict) else out)  # ensure_ascii: ë leaves as \\u00eb
                out = out.encode() if isinstance(out, str) else out
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _any

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def url(self, path=""):
        return f"http://127.0.0.1:{self.port}{path}"

    def snap(self, prefix=""):
        with self.lock:
            return [r for r in self.records if r["path"].startswith(prefix)]

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()

# ================================================================ definitions

def one_call(wf, key, url, headers="", top="", step="recovery: manual", attempts=1):
    """A workflow of one POST step `call` (manual, unless `step` says otherwise)."""
    hdr = f", headers: {{ {headers} }}" if headers else ""
    return (f'workflow: {wf}\nkey: "{key}"\n{top}steps:\n  - name: call\n    {step}\n'
            f'    retry: {{ max_attempts: {attempts} }}\n'
            f'    request: {{ method: POST, url: "{url}", timeout: 3s{hdr}, body: {{ ref: "{{{{instance.ref}}}}" }} }}\n')

def oauth_target(name, url_env, token_env, scope=""):
    return (f'targets:\n  {name}:\n    url: "{{{{env.{url_env}}}}}"\n    oauth2:\n'
            f'      token_url: "{{{{env.{token_env}}}}}"\n      client_id: "{{{{env.OAUTH_CLIENT_ID}}}}"\n'
            f'      client_secret: "{{{{secret.OAUTH_CLIENT_SECRET}}}}"\n' + (f"      scope: {scope}\n" if scope else ""))

def limited_target(name, url_env):
    return f'targets:\n  {name}:\n    url: "{{{{env.{url_env}}}}}"\n    limits: {{ concurrency: 8 }}\n'

DEFS = {
    "ts-cut": one_call("ts-cut", "cut:{{input.id}}", "{{env.ECHO_URL}}/cut/{{input.status}}/{{input.shift}}",
                       headers='Authorization: "Bearer {{secret.CUT_TOKEN}}"'),
    "ts-oauth": one_call("ts-oauth", "oa:{{input.id}}", "{{env.OAUTH_RES_URL}}/orders/{{input.status}}",
                         top=oauth_target("oauth-res", "OAUTH_RES_URL", "TOKEN_URL_GOOD", "orders.write")),
    "ts-oauth-bad": one_call("ts-oauth-bad", "ob:{{input.id}}", "{{env.OAUTH_BAD_RES_URL}}/orders",
                             top=oauth_target("oauth-bad", "OAUTH_BAD_RES_URL", "TOKEN_URL_BAD")),
    "ts-acme-work": one_call("ts-acme-work", "aw:{{input.id}}", "{{env.ACME_ERP_URL}}/orders",
                             top=limited_target("acme-erp", "ACME_ERP_URL"),
                             step="idempotency: { honored: true }", attempts=2),
    "ts-globex-work": one_call("ts-globex-work", "gw:{{input.id}}", "{{env.GLOBEX_LEDGER_URL}}/entries",
                               headers='Authorization: "Bearer {{secret.LEDGER_TOKEN}}"',
                               top=limited_target("globex-ledger", "GLOBEX_LEDGER_URL"),
                               step="idempotency: { honored: true }", attempts=2),
    "ts-redact": """\
workflow: ts-redact
key: "rd:{{input.id}}"
redact: [/customer/name]
steps:
  - name: call
    recovery: manual
    retry: { max_attempts: 1 }
    request: { method: POST, url: "{{env.ECHO_URL}}/redact", timeout: 3s, body: { ref: "{{instance.ref}}", name: "{{input.customer.name}}" } }
""",
    "ts-approve": """\
workflow: ts-approve
key: "ap:{{input.id}}"
steps:
  - name: approve
    approval:
      material: [/amount]
      summary: "Order {{input.id}}: {{input.amount}} EUR"
      approvers: { role: operator }
      on_reject: close
  - name: hold
    wait: { event: com.tenantsecrets.never }
""",
}
ACME_WF = ["ts-cut", "ts-oauth", "ts-oauth-bad", "ts-redact", "ts-acme-work", "ts-approve"]
GLOBEX_WF = ["ts-globex-work"]

# tokens made with the CLI: name -> (tenant, role)
CLI_TOKENS = {
    "all-admin": ("*", "admin"), "acme-admin": ("acme", "admin"), "globex-admin": ("globex", "admin"),
    "acme-viewer": ("acme", "viewer"), "acme-viewer2": ("acme", "viewer"),
    "acme-ops": ("acme", "operator"), "globex-ops": ("globex", "operator"),
    "ap-starter": ("acme", "operator"), "ap-one": ("acme", "operator"),
    "ap-two": ("acme", "operator"), "ap-three": ("acme", "operator"),
}

# ================================================================ the harness

class H:
    def __init__(self, exe, tmp):
        self.exe, self.tmp = exe, tmp
        self.db = os.path.join(tmp, "w.db")
        self.defs = os.path.join(tmp, "defs")
        self.config = os.path.join(tmp, "server.yaml")
        self.log = os.path.join(tmp, "server.log")
        self.proc, self.port, self.tok, self.procs = None, None, {}, []
        self.cut_secret = letters(32)
        self.client_id = "ts-client-" + letters(6)
        self.client_secret = letters(28)
        self.ledger_secret = letters(24)
        self.issued = []                        # access tokens our token endpoint issued
        self.downs = []

    # ---------------------------------------------------------- downstreams
    def start_downs(self):
        def echo(method, path, hd, body):
            parts = path.split("?")[0].strip("/").split("/")
            if parts[0] == "cut":               # /cut/<status>/<pad>: the secret after <pad> x's
                auth = hd.get("authorization", "")
                text = "refused-by-echo " + "x" * int(parts[2]) + auth.split(" ", 1)[-1] + " " + "y" * 700
                return int(parts[1]), {"error": text}
            if parts[0] == "redact":
                name = json.loads(body or b"{}").get("name", "")
                return 422, {"error": f"no customer named {name} here", "customer": {"name": name}}
            return 200, {"id": "E-" + rid()}
        self.echo = Down("echo", echo)

        def tokens(method, path, hd, body):
            auth = hd.get("authorization", "")
            if path.startswith("/good"):
                t = "at" + letters(30)
                self.issued.append(t)
                return 200, {"access_token": t, "token_type": "Bearer", "expires_in": 3600}
            dec = base64.b64decode(auth.split(" ", 1)[-1] + "==").decode("utf-8", "replace")
            return 401, {"error": "invalid_client",
                         "error_description": f"bad client credentials in '{auth}' ({dec})",
                         "received_authorization": auth, "decoded": dec}
        self.tokensrv = Down("token-endpoint", tokens)

        def res(method, path, hd, body):
            auth = hd.get("authorization", "")
            st = 401 if path.rstrip("/").endswith("/401") else 422
            return st, {"error": f"order refused for caller {auth}", "bearer": auth.split(" ", 1)[-1]}
        self.res = Down("resource", res)
        self.acme_erp = Down("acme-erp")
        self.ledger = Down("globex-ledger")
        self.hook_acme, self.hook_globex, self.hook_open = (Down(n, lambda *a: (204, b""))
                                                            for n in ("hook-acme", "hook-globex", "hook-open"))
        self.downs = [self.echo, self.tokensrv, self.res, self.acme_erp, self.ledger,
                      self.hook_acme, self.hook_globex, self.hook_open]

    # ---------------------------------------------------------- files
    def write_files(self):
        os.makedirs(self.defs)
        for wf, text in DEFS.items():
            with open(os.path.join(self.defs, wf + ".yaml"), "w") as f:
                f.write(text)
        self.acme_env = os.path.join(self.tmp, "acme.env")
        self.globex_env = os.path.join(self.tmp, "globex.env")
        for p, text in ((self.acme_env, f"CUT_TOKEN={self.cut_secret}\n"
                                        f"OAUTH_CLIENT_SECRET={self.client_secret}\n"),
                        (self.globex_env, f"LEDGER_TOKEN={self.ledger_secret}\n")):
            with open(p, "w") as f:
                f.write(text)
            os.chmod(p, 0o600)
        with open(self.config, "w") as f:
            f.write(f"database: {self.db}\nworkers: 4\ndefinitions: {self.defs}\n"
                    "tenants:\n"
                    f"  acme:\n    workflows: [{', '.join(ACME_WF)}]\n    secrets_file: {self.acme_env}\n"
                    f"  globex:\n    workflows: [{', '.join(GLOBEX_WF)}]\n    secrets_file: {self.globex_env}\n"
                    "events:\n  - type: com.tenantsecrets.never\n    signal: { key: /order_ref }\n")

    def env(self, **extra):
        e = {k: v for k, v in os.environ.items() if not k.startswith("WAYSTONE_")}
        e.update(ECHO_URL=self.echo.url(), OAUTH_RES_URL=self.res.url("/good"),
                 OAUTH_BAD_RES_URL=self.res.url("/bad"), TOKEN_URL_GOOD=self.tokensrv.url("/good/token"),
                 TOKEN_URL_BAD=self.tokensrv.url("/bad/token"), OAUTH_CLIENT_ID=self.client_id,
                 ACME_ERP_URL=self.acme_erp.url(), GLOBEX_LEDGER_URL=self.ledger.url())
        e.update(extra)
        return e

    def cli(self, *args, timeout=60):
        p = subprocess.run([self.exe, *args], capture_output=True, timeout=timeout, env=self.env())
        return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")

    # ---------------------------------------------------------- server
    def start_server(self):
        s = socket.socket(); s.bind(("127.0.0.1", 0)); self.port = s.getsockname()[1]; s.close()
        self.proc = subprocess.Popen([self.exe, "serve", "--config", self.config,
                                      "--listen", f"127.0.0.1:{self.port}"],
                                     stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     env=self.env(WAYSTONE_LOG="info"), start_new_session=True)
        def up():
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited {self.proc.returncode}: {open(self.log).read()[-1500:]}")
            try:
                return hreq(self.port, "GET", "/healthz", timeout=1).status == 200
            except OSError:
                return False
        if not wait_for(up, 30, 0.1):
            raise RuntimeError("serve did not answer /healthz in 30 s")
        for name, (tenant, role) in CLI_TOKENS.items():
            rc, out, err = self.cli("token", "create", "--db", self.db, "--tenant", tenant,
                                    "--role", role, "--name", name)
            m = TOKEN_RE.findall(out)
            if rc != 0 or not m:
                raise RuntimeError(f"token create {name}: rc {rc} {out[-200:]} {err[-200:]}")
            self.tok[name] = m[-1]

    def stop(self, p, grace=10):
        """SIGTERM to the process group we started (start_new_session), SIGKILL after `grace`."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 30)):
            if not p or p.poll() is not None:
                return
            try:
                os.killpg(p.pid, sig)
            except OSError:
                p.send_signal(sig)
            try:
                p.wait(wait)
            except subprocess.TimeoutExpired:
                pass

    def close(self):
        for p in self.procs:
            self.stop(p, 5)
        self.stop(self.proc)
        for d in self.downs:
            d.close()

    # ---------------------------------------------------------- API shortcuts
    def req(self, method, path, body=None, token=None, headers=None):
        return hreq(self.port, method, path, body, token, headers)

    def start(self, who, wf, inp, wait=10):
        return self.req("POST", "/v1/instances", {"workflow": wf, "input": inp}, self.tok[who],
                        {"Prefer": f"wait={wait}"} if wait else None)

    def view(self, who, key):
        r = self.req("GET", f"/v1/instances/{kpath(key)}", token=self.tok[who])
        return r.json() if r.status == 200 else None

    def settle(self, keys, who="acme-admin", timeout=25):
        out = {}
        def done():
            for k in keys:
                if out.get(k, {}).get("state") not in REST:
                    v = self.view(who, k)
                    if v:
                        out[k] = v
            return all(out.get(k, {}).get("state") in REST for k in keys)
        wait_for(done, timeout, 0.3)
        return out

    def surfaces(self, who, keys):
        """What a token gets back: each key's view and attempts, the list, alerts, triage, as
        ({surface: raw answer + every string in it}, [problems])."""
        paths = [p for k in keys for p in (f"/v1/instances/{kpath(k)}",
                                           f"/v1/attempts?key={urllib.parse.quote(k)}&limit=1000")]
        paths += ["/v1/instances?limit=1000", "/v1/alerts", "/v1/alerts?state=open",
                  "/v1/alerts?state=resolved", "/v1/triage"]
        texts, problems = {}, []
        for p in paths:
            r = self.req("GET", p, token=self.tok[who])
            if r.status != 200:
                problems.append(f"{p} answered {r.short(120)}")
            else:
                texts[p] = r.text + "\n" + "\n".join(all_strings(r.json()))
        return texts, problems

def leaks(texts, needles, ci=False):
    """[(needle label, surface)] for every needle found in a surface's text."""
    out = []
    for label, n in needles.items():
        for surf, txt in texts.items():
            if (n.lower() in txt.lower()) if ci else (n in txt):
                out.append((label, surf))
    return out

def fmt_leaks(found, limit=6):
    return "; ".join(f"{l} in {s}" for l, s in found[:limit]) + (f" (+{len(found) - limit})" if len(found) > limit else "")

# ================================================================ checks

class Results:
    rows = []
    def add(self, name, ok, detail):
        self.rows.append((name, bool(ok)))
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)

def check_secret_cut(h, R):
    sec = h.cut_secret
    keys, refused = [], []
    # the message is "HTTP 422: " + the body; whatever else precedes the cut, one of these pads
    # puts a 500-character cut 6..31 characters into the secret (cut positions 386..511 of the pad)
    runs = [(st, str(pad)) for st in ("422", "503") for pad in range(380, 481, 20)]
    for st, sh in runs:
        inp = {"id": f"{st}-{sh}-{rid()}", "status": st, "shift": sh}
        r = h.start("acme-ops", "ts-cut", inp, wait=0)
        if r.status not in (200, 201, 202):
            refused.append(r.short())
        keys.append("cut:" + inp["id"])
    views = h.settle(keys)
    got = h.echo.snap("/cut/")
    with_secret = [r for r in got if r["headers"].get("authorization") == "Bearer " + sec]
    pre = ["start refused: " + "; ".join(refused[:2])] if refused else []
    if len(with_secret) < len(runs):
        pre.append(f"echo got {len(got)} requests, {len(with_secret)} with the Bearer secret (want {len(runs)})")
    unsettled = [k for k in keys if views.get(k, {}).get("state") not in REST]
    if unsettled:
        pre.append(f"not at rest: {unsettled}")
    for who, name in (("acme-viewer", "secret_cut_viewer"), ("acme-admin", "secret_cut_admin")):
        texts, probs = h.surfaces(who, keys)
        marker = [s for s, t in texts.items() if "refused-by-echo" in t]
        found = leaks(texts, {f"prefix '{sec[:6]}…' (6 of {len(sec)})": sec[:6]})
        # the longest message that quotes the echo: tells where the cut fell
        quotes = {m for t in texts.values() for m in re.findall(r"refused-by-echo[^\n\"]*", t)}
        longest = max(map(len, quotes), default=0)
        # quotes cut before the filler that follows the secret: the cut fell in or at the secret
        split = sorted({re.sub(r"^refused-by-echo x+", "x…", q)[:8] for q in quotes
                        if "y" not in q[15:] and re.match(r"refused-by-echo x+[^x]", q)})
        fails = pre + probs
        if not marker:
            fails.append("the echoed error body is shown nowhere (docs: messages keep 500 characters of it): not exercised")
        if found:
            fails.append("secret fragment visible: " + fmt_leaks(found))
        R.add(name, not fails, "; ".join(fails) if fails else
              f"{len(with_secret)} requests carried the secret; echo quoted in {len(marker)} surfaces "
              f"(longest {longest} chars; cut at the secret shows as {split[:3]}); "
              f"no 6+ character prefix in {len(texts)} surfaces")

def check_oauth(h, R):
    keys, pre = [], []
    for wf, inp in (("ts-oauth", {"id": "r422-" + rid(), "status": "422"}),     # resource answers 422
                    ("ts-oauth", {"id": "r401-" + rid(), "status": "401"}),     # 401: renewed, then fails
                    ("ts-oauth-bad", {"id": "bad-" + rid()})):                  # token endpoint 401
        r = h.start("acme-ops", wf, inp, wait=0)
        if r.status not in (200, 201, 202):
            pre.append(f"{wf} start answered {r.short()}")
        keys.append(("oa:" if wf == "ts-oauth" else "ob:") + inp["id"])
    h.settle(keys)
    basic_expected = base64.b64encode(
        (urllib.parse.quote_plus(h.client_id) + ":" + urllib.parse.quote_plus(h.client_secret)).encode()).decode()
    good_tok = h.tokensrv.snap("/good")
    bad_tok = h.tokensrv.snap("/bad")
    res_got = h.res.snap("/good")
    basics = {r["headers"].get("authorization", "").split(" ", 1)[-1] for r in good_tok + bad_tok}
    if not good_tok or any(b"client_credentials" not in r["body"] for r in good_tok):
        pre.append(f"token endpoint got {len(good_tok)} grant requests (want >= 1 client_credentials)")
    if basic_expected not in basics:
        pre.append(f"no token request carried Basic {basic_expected[:10]}… (got {sorted(basics)[:2]})")
    bearers = {r["headers"].get("authorization", "") for r in res_got}
    if not res_got or not bearers <= {"Bearer " + t for t in h.issued}:
        pre.append(f"resource got {len(res_got)} requests with bearers {sorted(bearers)[:2]} (issued {len(h.issued)})")
    if not bad_tok:
        pre.append("the refusing token endpoint got no request")
    if h.res.snap("/bad"):
        pre.append("a request reached the resource without a token (credentials were refused)")
    for who in ("acme-viewer", "acme-admin"):
        texts, probs = h.surfaces(who, keys)
        at = {f"access token #{i + 1}": t for i, t in enumerate(h.issued)}
        at.update({f"access token #{i + 1} prefix": t[:12] for i, t in enumerate(h.issued)})
        cs = {"client secret": h.client_secret, "client secret prefix": h.client_secret[:10]}
        bb = {f"Basic value {b[:8]}…": b for b in basics if b}
        bb.update({f"Basic value prefix {b[:8]}…": b[:16] for b in basics if len(b) > 16})
        echo_seen = [s for s, t in texts.items() if "order refused for caller" in t]
        tok_seen = [s for s, t in texts.items() if "bad client credentials" in t or "invalid_client" in t]
        l1, l2 = leaks(texts, {**at, **cs}), leaks(texts, {**bb, **cs})
        f1 = pre + probs + (["visible: " + fmt_leaks(l1)] if l1 else [])
        if not echo_seen:
            f1.append("the resource's echo is shown nowhere: not exercised")
        R.add(f"oauth_access_token_hidden[{who}]", not f1, "; ".join(f1) if f1 else
              f"{len(h.issued)} tokens issued, resource got {len(res_got)} calls with them; echo quoted in "
              f"{len(echo_seen)} surfaces; no token or client secret in {len(texts)} surfaces")
        f2 = pre + probs + (["visible: " + fmt_leaks(l2)] if l2 else [])
        if not tok_seen:
            f2.append("the token endpoint's refusal is shown nowhere: not exercised")
        R.add(f"oauth_basic_hidden[{who}]", not f2, "; ".join(f2) if f2 else
              f"token endpoint echoed Basic {basic_expected[:6]}… in its 401; refusal quoted in "
              f"{len(tok_seen)} surfaces; neither the Basic value nor the secret visible")

def check_redact(h, R):
    name = "Zoë Ångström"
    inp = {"id": "rd-" + rid(), "customer": {"name": name, "tier": "gold"}}
    key = "rd:" + inp["id"]
    r = h.start("acme-ops", "ts-redact", inp, wait=0)
    v = h.settle([key]).get(key, {})
    got = h.echo.snap("/redact")
    echoed = [x for x in got if json.loads(x["body"] or b"{}").get("name") == name]
    esc = json.dumps(name)[1:-1]                                   # Zo\u00eb \u00c5ngstr\u00f6m
    needles = {"plain": name, "escaped": esc, "first name": "Zoë", "last name": "Ångström",
               "escaped first": esc.split(" ")[0], "escaped last": esc.split(" ")[1],
               "percent-encoded": urllib.parse.quote(name), "escaped-utf8 bytes": "\\xc3\\xab"}
    pre = []
    if r.status not in (200, 201, 202):
        pre.append(f"start answered {r.short()}")
    if not echoed:
        pre.append(f"echo got {len(got)} requests, none with the name")
    if v.get("state") not in REST:
        pre.append(f"instance not at rest: {v.get('state')}")
    admin_v = h.view("acme-admin", key) or {}
    if ((admin_v.get("input") or {}).get("customer") or {}).get("name") != name:
        pre.append(f"admin (see_redacted) does not see the name in input: {json.dumps(admin_v.get('input'))[:120]}")
    texts, probs = h.surfaces("acme-viewer", [key])
    vv = h.view("acme-viewer", key) or {}
    shown = ((vv.get("input") or {}).get("customer") or {}).get("name")
    found = leaks(texts, needles, ci=True)
    quoted = [s for s, t in texts.items() if "no customer named" in t]
    fails = pre + probs + (["visible to viewer: " + fmt_leaks(found)] if found else [])
    if shown != "[redacted]":
        fails.append(f"viewer's input.customer.name is {shown!r}, not \"[redacted]\"")
    if not quoted:
        fails.append("the echoed error body is shown nowhere: not exercised")
    R.add("redact_non_ascii", not fails, "; ".join(fails) if fails else
          f"echo quoted in {len(quoted)} surfaces with the name as {esc!r}; neither form (nor parts) visible")

    # input_hash: admin sees the plain hash; viewers an HMAC under the server's secret and tenant
    def ih(who):
        x = h.view(who, key) or {}
        lst = h.req("GET", "/v1/instances?key_prefix=" + urllib.parse.quote(key), token=h.tok[who]).json() or {}
        li = [i.get("input_hash") for i in lst.get("items", []) if i.get("key") == key]
        return x.get("input_hash"), (li[0] if li else None)
    a, a_l = ih("acme-admin")
    v1, v1_l = ih("acme-viewer")
    v2, v2_l = ih("acme-viewer2")
    plain = {hashlib.sha256(json.dumps(inp, sort_keys=True, separators=(",", ":"), ensure_ascii=ea).encode()).hexdigest()
             for ea in (True, False)}
    fails = []
    if not a or not v1:
        fails.append(f"input_hash not shown (admin {a!r}, viewer {v1!r})")
    else:
        if v1 == a:
            fails.append(f"viewer sees the admin's (plain) input_hash {a[:16]}…")
        if v1 in plain:
            fails.append("viewer's input_hash is the plain SHA-256 of the canonical input")
        if v1 != v2:
            fails.append(f"two viewers of acme see different hashes {v1[:12]}… / {str(v2)[:12]}…")
        if v1_l is not None and v1_l != v1:
            fails.append(f"viewer's list shows {v1_l[:16]}… but the view {v1[:16]}…")
        if v1_l is not None and v1_l in plain | {a}:
            fails.append("viewer's list shows the plain input_hash")
    R.add("redact_input_hash", not fails, "; ".join(fails) if fails else
          f"admin {a[:12]}… ({'=' if a in plain else '≠'} our SHA-256 of canonical JSON); viewers both "
          f"{v1[:12]}… (view and list agree)")

    # an operator without see_redacted, starting the same key with other input, gets a 409 that
    # names input hashes (definition-reference: "naming both input hashes"): not the plain one
    me = (h.req("GET", "/v1/me", token=h.tok["acme-ops"]).json() or {})
    ov = ((h.view("acme-ops", key) or {}).get("input") or {}).get("customer") or {}
    if "see_redacted" in (me.get("actions") or []) or ov.get("name") != "[redacted]" or not a:
        R.add("redact_conflict_hash", bool(a), "not applicable: the operator has see_redacted"
              if a else "no admin input_hash to compare with")
        return
    r2 = h.start("acme-ops", "ts-redact", {**inp, "customer": {"name": "Other", "tier": "x"}}, wait=0)
    hexes = set(re.findall(r"[0-9a-f]{8,64}", r2.text))
    fails = []
    if r2.status != 409:
        fails.append(f"same key, other input answered {r2.short()} (want 409)")
    if any(p.startswith(x) for x in hexes for p in plain | {a}):
        fails.append(f"the 409 to a token without see_redacted names the plain input_hash {a[:16]}… "
                     f"(a redacted value can be brute-forced against it): {r2.text[:200]!r}")
    R.add("redact_conflict_hash", not fails, "; ".join(fails) if fails else
          f"409 names {sorted(x[:12] for x in hexes)}, not the plain {a[:12]}…: {r2.text[:160]!r}")

BAD_NAMES = [("nul", "ts{r}\x00admin"), ("esc", "\x1b[31mts{r}admin\x1b[0m"), ("bidi", "ts{r}\u202enimda"),
             ("zwsp", "ts{r}ad\u200bmin"), ("cyrillic", "\u0430dmin{r}"), ("fullwidth", "ａｄｍｉｎ{r}")]
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")

def token_names(h):
    r = h.req("GET", "/v1/tokens", token=h.tok["all-admin"])
    api = sorted(i.get("name") for i in (r.json() or {}).get("items", []))
    rc, out, err = h.cli("token", "list", "--db", h.db)
    return api, out

def check_token_names(h, R):
    api0, cli0 = token_names(h)
    cli_f, api_f, cli_note, api_note = [], [], [], []
    for label, tmpl in BAD_NAMES:
        name = tmpl.format(r=letters(4).lower())
        if "\x00" in name:
            cli_note.append("nul: not passable in argv (execve cuts C strings), tried over the API only")
        else:
            rc, out, err = h.cli("token", "create", "--db", h.db, "--tenant", "acme", "--role", "viewer",
                                 "--name", name)
            if rc == 0 or TOKEN_RE.search(out):
                cli_f.append(f"{label}: created (rc {rc})")
            elif not err.strip() or "name" not in err.lower():
                cli_f.append(f"{label}: rc {rc} but no clear error on stderr: {err[:120]!r}")
            elif label == "cyrillic":
                cli_note.append(f"e.g. {err.strip().splitlines()[-1][:110]!r}")
            if rc != 0 and UNSAFE.search(out + err):
                cli_f.append(f"{label}: refused, but the error prints the raw character(s) to the terminal: {err[:120]!r}")
        r = h.req("POST", "/v1/tokens", {"name": name, "role": "viewer"}, token=h.tok["acme-admin"])
        doc = r.json() or {}
        if r.status in (200, 201) or TOKEN_RE.search(r.text):
            api_f.append(f"{label}: created ({r.status})")
        elif r.status not in (400, 422) or not str(doc.get("type", "")).startswith("urn:waystone:problem:"):
            api_f.append(f"{label}: answered {r.short(120)}")
        elif "name" not in str(doc.get("detail", "")).lower():
            api_f.append(f"{label}: {r.status} without naming the name: {doc.get('detail')!r}")
        elif UNSAFE.search(str(doc.get("detail", ""))):
            api_note.append(f"{label}: detail repeats the raw character")
    api1, cli1 = token_names(h)
    if api1 != api0:
        api_f.append(f"token list changed: +{sorted(set(api1) - set(api0))}")
    if cli1 != cli0:
        cli_f.append("`token list` changed: " + repr([l for l in cli1.splitlines() if l not in cli0.splitlines()][:3]))
    # control: a plain name is accepted on both paths (the refusals above are about the name)
    rc, out, err = h.cli("token", "create", "--db", h.db, "--tenant", "acme", "--role", "viewer",
                         "--name", "plain-" + letters(5).lower())
    if rc != 0:
        cli_f.append(f"control: a plain name was refused too ({err[:100]!r})")
    r = h.req("POST", "/v1/tokens", {"name": "plain-" + letters(5).lower(), "role": "viewer"}, token=h.tok["acme-admin"])
    if r.status != 201:
        api_f.append(f"control: a plain name answered {r.short(120)}")
    R.add("token_name_cli", not cli_f, "; ".join(cli_f) if cli_f else
          f"{len(BAD_NAMES) - 1} names refused with a clear error, nothing listed; " + "; ".join(cli_note))
    R.add("token_name_api", not api_f, "; ".join(api_f) if api_f else
          f"{len(BAD_NAMES)} names refused (problem+json naming the name), nothing listed"
          + ("; note: " + "; ".join(api_note) if api_note else ""))

def check_tenants(h, R):
    # (a) /metrics
    a1 = h.req("GET", "/metrics", token=h.tok["acme-admin"])
    a2 = h.req("GET", "/metrics", token=h.tok["all-admin"])
    f = []
    if a1.status != 403:
        f.append(f"acme admin got {a1.short(80)}")
    if a2.status != 200 or "waystone_instances" not in a2.text:
        f.append(f"'*' admin got {a2.short(80)}")
    R.add("tenant_metrics", not f, "; ".join(f) if f else "acme admin 403, '*' admin 200 with waystone_instances")

    # (b) targets: listing and pausing
    def names(who, tenant=None):
        r = h.req("GET", "/v1/targets" + (f"?tenant={tenant}" if tenant else ""), token=h.tok[who])
        return r, {i.get("name"): i for i in (r.json() or {}).get("items", [])}
    r, acme_t = names("acme-ops")
    f = []
    if r.status != 200:
        f.append(f"GET /v1/targets answered {r.short(80)}")
    if "globex-ledger" in acme_t or "globex-ledger" in r.text:
        f.append("acme's listing names globex-ledger")
    if "acme-erp" not in acme_t:
        f.append(f"acme's own target acme-erp missing (control): {sorted(acme_t)}")
    R.add("tenant_targets_list", not f, "; ".join(f) if f else f"acme sees {sorted(acme_t)}")

    f = []
    for who in ("acme-ops", "acme-admin"):
        p = h.req("POST", "/v1/targets/globex-ledger/pause", {"reason": "acme tries " + who}, token=h.tok[who])
        if p.status not in (403, 404):
            f.append(f"{who} pausing globex-ledger answered {p.short(120)}")
    r, gl = names("all-admin", "globex")
    if "globex-ledger" not in gl:
        f.append(f"'*' admin does not see globex-ledger for globex: {r.short(120)}")
    elif gl["globex-ledger"].get("paused"):
        f.append(f"globex-ledger is paused for globex: {gl['globex-ledger']}")
    _, acme_t2 = names("acme-ops")
    if "globex-ledger" in acme_t2:
        f.append("after the attempt, acme's listing holds a globex-ledger entry")
    n0 = len(h.ledger.snap())
    g = h.start("globex-ops", "ts-globex-work", {"id": "after-pause-" + rid()})
    gv = h.settle([(g.json() or {}).get("key", "?")], who="globex-admin", timeout=15)
    if len(h.ledger.snap()) <= n0 or not any(v.get("state") == "completed" for v in gv.values()):
        f.append(f"globex's call did not get through after acme's attempt ({g.short(100)})")
    c1 = h.req("POST", "/v1/targets/acme-erp/pause", {"reason": "control"}, token=h.tok["acme-ops"])
    c2 = h.req("POST", "/v1/targets/acme-erp/resume", {"reason": "control"}, token=h.tok["acme-ops"])
    if c1.status != 200 or c2.status != 200:
        f.append(f"control: acme pausing/resuming its own acme-erp answered {c1.status}/{c2.status}")
    R.add("tenant_target_pause", not f, "; ".join(f) if f else
          "acme's pause of globex-ledger refused (operator and admin); globex not paused, its call went "
          "through; acme may pause its own target")

    # (c)+(d) tokens over the API
    victim, reason = "globex-victim-" + letters(4).lower(), "GLOBEX-ONLY-REASON-" + letters(10)
    f_store = []
    for who, body in (("all-admin", {"name": victim, "role": "viewer", "tenant": "globex"}),
                      ("acme-admin", {"name": "acme-extra-" + letters(4).lower(), "role": "viewer"})):
        c = h.req("POST", "/v1/tokens", body, token=h.tok[who])
        cc = (c.header("cache-control") or "").lower()
        if c.status != 201 or not TOKEN_RE.search(c.text):
            f_store.append(f"{who} create answered {c.short(100)}")
        elif "no-store" not in cc:
            f_store.append(f"201 from {who} has Cache-Control {c.header('cache-control')!r}")
    R.add("token_create_no_store", not f_store, "; ".join(f_store) if f_store else
          "both 201 answers carrying a token have Cache-Control: no-store")
    rv = h.req("POST", f"/v1/tokens/{victim}/revoke", {"reason": reason}, token=h.tok["all-admin"])
    cross = h.req("POST", "/v1/tokens/globex-ops/revoke", {"reason": "acme tries"}, token=h.tok["acme-admin"])
    al = h.req("GET", "/v1/tokens", token=h.tok["all-admin"])
    lst = h.req("GET", "/v1/tokens", token=h.tok["acme-admin"])
    items = (lst.json() or {}).get("items", [])
    all_items = {i.get("name"): i for i in (al.json() or {}).get("items", [])}
    f = []
    if rv.status != 200:
        f.append(f"'*' admin revoking {victim} answered {rv.short(100)}")
    if all_items.get(victim, {}).get("revoke_reason") != reason:
        f.append(f"control: the '*' listing does not show the reason: {all_items.get(victim)}")
    if cross.status != 404:
        f.append(f"acme admin revoking globex-ops answered {cross.short(100)} (docs: 404)")
    if all_items.get("globex-ops", {}).get("state") != "active":
        f.append(f"globex-ops is {all_items.get('globex-ops', {}).get('state')} after acme's attempt")
    if lst.status != 200:
        f.append(f"acme admin GET /v1/tokens answered {lst.short(100)}")
    foreign = [i.get("name") for i in items if i.get("tenant") != "acme"]
    gnames = [n for n, i in all_items.items() if i.get("tenant") == "globex" and n in lst.text]
    if foreign or gnames:
        f.append(f"acme's listing shows {sorted(set(foreign + gnames))}")
    if reason in lst.text or "GLOBEX-ONLY-REASON" in lst.text:
        f.append("acme's listing shows globex's revocation reason")
    if "acme-viewer" not in {i.get("name") for i in items}:
        f.append("control: acme's own tokens missing from its listing")
    R.add("tenant_tokens_list", not f, "; ".join(f) if f else
          f"acme admin lists {len(items)} acme tokens only, no globex name or reason; its revoke of a globex token is 404")

def parse_events(down):
    """[(event, raw text)] of what a webhook receiver got (a body that is no JSON object: {})."""
    out = []
    for r in down.snap():
        doc = Resp(200, {}, r["body"]).json()
        out.append((doc if isinstance(doc, dict) else {}, r["body"].decode("utf-8", "replace")))
    return out

def relay_config(h, sinks):
    path = os.path.join(h.tmp, f"relay-{rid()}.yaml")
    text = "deployment: ts\nretry: { max_attempts: 3, initial_interval: 200ms, max_interval: 1s }\nsinks:\n"
    for name, url, tenants in sinks:
        text += (f"  - name: {name}\n    type: webhook\n    url: {url}\n    secret_env: TS_HOOK_SECRET\n"
                 "    timeout: 5s\n" + (f"    tenants: [{', '.join(tenants)}]\n" if tenants else ""))
    with open(path, "w") as f:
        f.write(text)
    return path

def run_relay(h, cfg):
    out = open(os.path.join(h.tmp, os.path.basename(cfg) + ".log"), "wb")
    p = subprocess.Popen([h.exe, "relay", "--config", cfg, "--db", h.db], stdout=out, stderr=subprocess.STDOUT,
                         env=h.env(WAYSTONE_CONFIG=h.config, TS_HOOK_SECRET=h.hook_secret),
                         start_new_session=True)
    h.procs.append(p)
    return p, out.name

def check_relay(h, R):
    h.hook_secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
    # a sink without a tenants list is refused at start when the server has tenants
    cfg = relay_config(h, [("acme-ok", h.hook_open.url("/a"), ["acme"]), ("open-sink", h.hook_open.url("/o"), None)])
    p, log = run_relay(h, cfg)
    wait_for(lambda: p.poll() is not None, 15)
    words = open(log, "rb").read().decode("utf-8", "replace")
    f = []
    if p.poll() is None:
        f.append("the relay is still running after 15 s")
        h.stop(p, 5)
    elif p.returncode == 0:
        f.append("the relay exited 0")
    if "open-sink" not in words:
        f.append(f"its output does not name the sink: {words[-200:]!r}")
    if h.hook_open.snap():
        f.append(f"the sinks of the refused config received {len(h.hook_open.snap())} deliveries")
    R.add("relay_sink_tenants_required", not f, "; ".join(f) if f else
          f"refused (exit {p.returncode}): {words.strip().splitlines()[-1][:160] if words.strip() else ''}")

    # acme's sink and globex's sink; instances in both tenants
    cfg = relay_config(h, [("acme-hooks", h.hook_acme.url("/hook"), ["acme"]),
                           ("globex-hooks", h.hook_globex.url("/hook"), ["globex"])])
    p, log = run_relay(h, cfg)
    ak = h.start("acme-ops", "ts-acme-work", {"id": "relay-" + rid()}).json() or {}
    gk = h.start("globex-ops", "ts-globex-work", {"id": "relay-" + rid()}).json() or {}
    ak, gk = ak.get("key", "?"), gk.get("key", "?")
    def delivered(down, key):
        return any(e.get("subject") == key and e.get("type") == "waystone.instance.completed"
                   for e, _ in parse_events(down))
    wait_for(lambda: delivered(h.hook_acme, ak) and delivered(h.hook_globex, gk), 30, 0.5)
    acme_ev, globex_ev = parse_events(h.hook_acme), parse_events(h.hook_globex)
    f = []
    if p.poll() is not None:
        f.append(f"relay exited {p.returncode}: {open(log).read()[-300:]!r}")
    if not delivered(h.hook_acme, ak):
        f.append(f"acme's receiver did not get {ak}'s completion ({len(acme_ev)} events)")
    if not delivered(h.hook_globex, gk):
        f.append(f"control: globex's receiver did not get {gk}'s completion ({len(globex_ev)} events)")
    foreign = [e.get("type", "?") + " " + str(e.get("subject")) for e, raw in acme_ev
               if (e.get("data") or {}).get("tenant") != "acme" or "globex" in raw or gk in raw]
    if foreign:
        f.append(f"acme's receiver got {len(foreign)} events not acme's: {foreign[:3]}")
    R.add("relay_acme_only", not f, "; ".join(f) if f else
          f"acme's receiver got {len(acme_ev)} events, all tenant acme; globex's got {len(globex_ev)}")

    with_id = [e.get("type", "?") for e, _ in acme_ev + globex_ev if has_key(e.get("data"), "instance_id")]
    no_key = [e.get("type", "?") for e, _ in acme_ev + globex_ev
              if e.get("type", "").startswith("waystone.instance.") and not (e.get("data") or {}).get("instance_key")]
    f = []
    if not acme_ev:
        f.append("no events received: not exercised")
    if with_id:
        f.append(f"{len(with_id)} events carry data.instance_id: {sorted(set(with_id))[:4]}")
    if no_key:
        f.append(f"{len(no_key)} instance events without data.instance_key: {sorted(set(no_key))[:3]}")
    R.add("relay_no_instance_id", not f, "; ".join(f) if f else
          f"{len(acme_ev) + len(globex_ev)} events; none carries instance_id, instance events name their key")

    # every secret of the earlier checks, in whatever the relay delivered (docs: outbox events too)
    needles = {"cut secret prefix": h.cut_secret[:6], "client secret": h.client_secret[:10],
               "ledger secret": h.ledger_secret[:10]}
    needles.update({f"access token #{i + 1}": t[:12] for i, t in enumerate(h.issued)})
    raw = {f"{e.get('type')}#{i}": r for i, (e, r) in enumerate(acme_ev + globex_ev)}
    found = leaks(raw, needles)
    R.add("relay_events_no_secrets", not found and bool(acme_ev), fmt_leaks(found) if found else
          f"no secret or token in {len(raw)} delivered events" if acme_ev else "no events: not exercised")
    h.stop(p, 10)

def check_approvals(h, R):
    inp = {"id": "ap-" + rid(), "amount": 4200}
    key = "ap:" + inp["id"]
    r = h.start("ap-starter", "ts-approve", inp, wait=0)
    def entry():
        v = h.view("acme-admin", key) or {}
        return next((a for a in v.get("approvals") or [] if a.get("step") == "approve"
                     and isinstance(a.get("request"), int) and a.get("data_version")), None)
    e = wait_for(entry, 15, 0.3)
    if not e:
        R.add("approval_contradictions_one_alert", False, f"no open request (start {r.short(100)})")
        return
    def decide(who, decision):
        return h.req("POST", f"/v1/instances/{kpath(key)}/decide",
                     {"step": "approve", "request": e["request"], "data_version": e["data_version"],
                      "decision": decision, "comment": f"{who} says {decision}"}, token=h.tok[who])
    first = decide("ap-one", "approve")
    f = []
    if first.status != 200:
        f.append(f"first decision answered {first.short(150)}")
    late = [("ap-two", "reject"), ("ap-two", "reject"), ("ap-three", "reject"), ("ap-one", "reject"),
            ("ap-two", "reject")]
    for who, d in late:
        x = decide(who, d)
        if x.status != 409:
            f.append(f"late {d} by {who} answered {x.short(120)} (want 409)")
    def contra():
        al = h.req("GET", "/v1/alerts?state=open", token=h.tok["acme-admin"]).json() or {}
        return [a for a in al.get("items", []) if a.get("kind") == "contradicting_decision"
                and a.get("instance") == key]
    wait_for(contra, 3, 0.3)
    time.sleep(0.5)
    open_alerts = contra()
    v = h.view("acme-admin", key) or {}
    refusals = [a for a in v.get("audit") or [] if "decision_refused" in json.dumps(a)]
    if len(refusals) < len(late):
        f.append(f"{len(refusals)} decision_refused audit records for {len(late)} refusals (docs: each is audited)")
    in_view = [a for a in v.get("alerts") or [] if a.get("kind") == "contradicting_decision" and a.get("state") == "open"]
    ap = [a for a in v.get("approvals") or [] if a.get("step") == "approve"]
    outcome = ((ap[0].get("decision") or {}).get("outcome") if ap else None)
    if outcome != "approve":
        f.append(f"the first decision did not stand: {outcome!r}")
    if len(open_alerts) > 1 or len(in_view) > 1:
        f.append(f"{len(open_alerts)} open contradicting_decision alerts for the step ({len(in_view)} in the view)")
    if not open_alerts and not in_view:
        f.append("no contradicting_decision alert at all (docs: raised when a late decision differs)")
    R.add("approval_contradictions_one_alert", not f, "; ".join(f) if f else
          f"{len(late)} late contradicting decisions refused 409 and audited; one open alert; approval stands")

# ================================================================ main

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--waystone", required=True, help="path of the built waystone binary")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (db, configs, logs)")
    args = ap.parse_args()
    exe = os.path.abspath(args.waystone)
    if not os.access(exe, os.X_OK):
        print(f"no waystone binary at {exe}")
        return 2

    def on_signal(sig, frame):
        raise KeyboardInterrupt(f"signal {sig}")
    signal.signal(signal.SIGTERM, on_signal)

    tmp = tempfile.mkdtemp(prefix="waystone-tsecrets-")
    h, R = H(exe, tmp), Results()
    try:
        h.start_downs()
        h.write_files()
        h.start_server()
        for fn in (check_secret_cut, check_oauth, check_redact, check_token_names, check_tenants,
                   check_approvals, check_relay):
            try:
                fn(h, R)
            except KeyboardInterrupt:
                raise
            except Exception as e:
                R.add(fn.__name__, False, f"blew up: {e.__class__.__name__}: {e}")
            if h.proc.poll() is not None:
                R.add("server_alive", False, f"serve exited {h.proc.returncode} during {fn.__name__}")
                break
    except KeyboardInterrupt as e:
        R.add("interrupted", False, str(e))
    except Exception as e:
        R.add("setup", False, f"{e.__class__.__name__}: {e}")
    finally:
        h.close()
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    passed = sum(ok for _, ok in R.rows)
    print(f"{passed}/{len(R.rows)} checks passed")
    return 0 if R.rows and passed == len(R.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
