#!/usr/bin/env python3
"""Tenant tables: an outsider's black-box test that sql steps of two tenants never touch each other's rows.

Written from docs/*.md (definition-reference.md#sql, http-api.md#tenants, cli.md, operations.md),
README.md and examples/ only. Starts its own `waystone serve` processes (127.0.0.1, free ports,
a temp dir; SQLite, and PostgreSQL when WAYSTONE_TEST_PG names a server), keeps a business table
`accounts (tenant, k, v)` beside Waystone's own, and counts what that table holds with its own
client (Python's sqlite3, `psql`), never with what the API says. Cleans up every process, the
temp dir and the PostgreSQL database it made (unless --keep).

  python3 tests/hostile/tenant_tables.py --waystone build/apps/waystone [--keep]
  WAYSTONE_TEST_PG=postgresql://user@127.0.0.1:PORT python3 tests/hostile/tenant_tables.py --waystone ...

Checks (one line each, `ok` / `FAIL` / `skip`, then a summary; exit 0 only when every check passed):
  lint_scoped_clean            the per-tenant statements of the main definition lint without warning
  lint_allowed_forms_clean     the other forms the docs allow (multi-row INSERT, ON CONFLICT DO NOTHING,
                               DO UPDATE ... WHERE accounts.tenant = :tenant, DELETE, SELECT) lint clean
  lint_warns_unscoped          `waystone lint` on `UPDATE accounts SET v = :v WHERE k = :k`: exit 0
                               (warnings refuse nothing), a `FILE:LINE: warning:` line inside that
                               step, naming the step
  lint_flags_<shape>           each bypass shape gets a warning (or a problem) on a line of its step
  scoped_rows_sqlite           globex then acme run `UPDATE ... WHERE tenant = :tenant AND k = :k` and
                               an `INSERT ... VALUES (:tenant, ...)`: sqlite3 sees only the runner's
                               rows changed, the inserted row carries the runner's tenant
  unscoped_refused_at_start    a server with tenants: and the probe's statement exits non-zero, its
                               output naming file, line (inside the step) and step; table unchanged
  bypass_<shape>_refused_at_start   the same for each bypass shape (OR 1 = 1, a late tenant
                               condition with OR, a subquery, a literal tenant, an upsert without
                               WHERE, DELETE ... OR, comments, parentheses, SET tenant, IN, OR
                               REPLACE, UPDATE ... FROM, WITH, UNION)
  params_tenant_refused        `params: { tenant: "acme" }`: lint exits 1 naming the field, the server
                               refuses to start naming file, line, step and the field; table unchanged
  scoped_rows_postgres         scoped_rows_sqlite on a fresh PostgreSQL database, counted with psql
  unscoped_refused_at_start_postgres   the probe's statement refused at start on PostgreSQL too
                               (both `skip` without WAYSTONE_TEST_PG)
A server that should have refused a definition but came up is then used the way the probe did
(globex starts the workflow with k = 'A1') and the detail says what happened to acme's rows.

Python 3 standard library only (plus the `psql` client for the PostgreSQL checks).
"""
import argparse, http.client, json, os, re, secrets, shutil, signal, socket, sqlite3, subprocess
import sys, tempfile, time, urllib.parse

# ================================================================ knobs (a loaded 2-core machine)

SERVE_UP_S = 90          # a server that should start: /healthz within this
REFUSE_S = 60            # a server that should refuse: exits within this (the docs: at start)
LATE_EXIT_S = 4          # after /healthz answered, how long we watch for a late refusal
SETTLE_S = 120           # an instance at rest within this
STOP_GRACE_S = 20        # SIGTERM, then SIGKILL
CLI_S = 90               # lint, token create
PSQL_S = 60

REST = {"completed", "compensated", "failed", "closed", "needs_attention"}
TOKEN_RE = re.compile(r"wst_[0-9a-f]{64}")
TENANTS = ("acme", "globex")
INITIAL_ROWS = [("acme", "A1", 1), ("globex", "A1", 1), ("acme", "X", 1)]
CREATE_TABLE = "CREATE TABLE accounts (tenant TEXT, k TEXT, v INTEGER, PRIMARY KEY (tenant, k))"

def rid():
    return secrets.token_hex(3)

def kpath(key):
    return urllib.parse.quote(key, safe=":")

def named(word, text):
    """`word` in `text` as a whole name (names here are made of letters, digits and `-`)."""
    return re.search(r"(?<![\w-])" + re.escape(word) + r"(?![\w-])", text) is not None

def tail(text, n=900):
    text = text.strip()
    return ("…" + text[-n:]) if len(text) > n else text

def oneline(text, n=900):
    return " | ".join(l.strip() for l in tail(text, n).splitlines() if l.strip())

def wait_for(fn, timeout, interval=0.25):
    end = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() >= end:
            return v
        time.sleep(interval)

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p

# ================================================================ HTTP client

class Resp:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body
        self.text = body.decode("utf-8", "replace")

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def short(self, n=240):
        return f"{self.status} {self.text[:n]!r}"

def hreq(port, method, path, body=None, token=None, headers=None, timeout=30.0):
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

def healthy(port):
    try:
        return hreq(port, "GET", "/healthz", timeout=2).status == 200
    except OSError:
        return False

# ================================================================ definitions

def q(s):
    """A YAML double-quoted scalar (JSON's string syntax is YAML's)."""
    return json.dumps(s)

def sql_step(name, statement, params):
    ps = ", ".join(f"{k}: {q(v)}" for k, v in params.items())
    return (f"  - name: {name}\n"
            f"    sql:\n"
            f"      statement: {q(statement)}\n"
            f"      params: {{ {ps} }}\n")

def definition(wf, steps):
    return f'workflow: {wf}\nkey: "tt:{{{{input.id}}}}"\nsteps:\n' + "".join(steps)

IN_K, IN_V, IN_NEW = "{{input.k}}", "{{input.v}}", "{{input.new_k}}"

SCOPED_WF, SCOPED_FILE = "tt-scoped", "tt-scoped.yaml"
SCOPED_TEXT = definition(SCOPED_WF, [
    sql_step("set-value", "UPDATE accounts SET v = :v WHERE tenant = :tenant AND k = :k RETURNING k",
             {"v": IN_V, "k": IN_K}),
    sql_step("add-row", "INSERT INTO accounts (tenant, k, v) VALUES (:tenant, :k, :v)",
             {"k": IN_NEW, "v": IN_V}),
])

# the forms definition-reference.md#sql allows, besides the two above (lint only)
ALLOWED_FILE = "tt-allowed.yaml"
ALLOWED_TEXT = definition("tt-allowed", [
    sql_step("two-rows", "INSERT INTO accounts (tenant, k, v) VALUES (:tenant, :k, :v), (:tenant, :k2, :v)",
             {"k": IN_K, "k2": IN_NEW, "v": IN_V}),
    sql_step("upsert-nothing", "INSERT INTO accounts (tenant, k, v) VALUES (:tenant, :k, :v) "
                               "ON CONFLICT (tenant, k) DO NOTHING", {"k": IN_K, "v": IN_V}),
    sql_step("upsert-where", "INSERT INTO accounts (tenant, k, v) VALUES (:tenant, :k, :v) "
                             "ON CONFLICT (tenant, k) DO UPDATE SET v = excluded.v WHERE accounts.tenant = :tenant",
             {"k": IN_K, "v": IN_V}),
    sql_step("drop-some", "DELETE FROM accounts WHERE tenant = :tenant AND (k = :k OR k = :k2)",
             {"k": IN_K, "k2": IN_NEW}),
    sql_step("read-some", "SELECT k, v FROM accounts WHERE tenant = :tenant AND k = :k ORDER BY k LIMIT 5",
             {"k": IN_K}),
])

# every hostile definition starts with a harmless, scoped step, so that naming "the step" means
# naming the right one of two
FIRST_STEP = sql_step("look-first", "SELECT k, v FROM accounts WHERE tenant = :tenant AND k = :k", {"k": IN_K})

# shape -> (statement, params). Params are exactly what the statement uses (an unused param or a
# missing one is a load error of its own, which would hide what we test).
SHAPES = {
    # the security probe's statement
    "unscoped": ("UPDATE accounts SET v = :v WHERE k = :k", {"v": IN_V, "k": IN_K}),
    # the brief's bypass shapes
    "or-true": ("UPDATE accounts SET v = :v WHERE tenant = :tenant OR 1 = 1", {"v": IN_V}),
    "and-or": ("UPDATE accounts SET v = :v WHERE k = :k AND tenant = :tenant OR k = 'X'", {"v": IN_V, "k": IN_K}),
    "subquery": ("UPDATE accounts SET v = (SELECT v FROM accounts WHERE k = 'X') WHERE tenant = :tenant AND k = :k",
                 {"k": IN_K}),
    "literal-tenant": ("INSERT INTO accounts (tenant, k, v) VALUES ('acme', :k, :v)", {"k": IN_NEW, "v": IN_V}),
    "upsert-no-where": ("INSERT INTO accounts (tenant, k, v) VALUES (:tenant, :k, :v) "
                        "ON CONFLICT (tenant, k) DO UPDATE SET v = excluded.v", {"k": IN_K, "v": IN_V}),
    "delete-or": ("DELETE FROM accounts WHERE tenant = :tenant OR k = :k", {"k": IN_K}),
    # more of what the docs say is refused, or what a naive check might read wrongly
    "paren-or": ("UPDATE accounts SET v = :v WHERE (tenant = :tenant) OR k = :k", {"v": IN_V, "k": IN_K}),
    "line-comment-or": ("UPDATE accounts SET v = :v WHERE tenant = :tenant AND k = :k -- only ours\nOR k = 'X'",
                        {"v": IN_V, "k": IN_K}),
    "block-comment-or": ("UPDATE accounts SET v = :v WHERE tenant = :tenant AND k = :k /* only ours */ or k = 'X'",
                         {"v": IN_V, "k": IN_K}),
    "lowercase-or": ("update accounts set v = :v where tenant = :tenant and k = :k or k = 'X'",
                     {"v": IN_V, "k": IN_K}),
    "set-tenant": ("UPDATE accounts SET tenant = 'acme', v = :v WHERE tenant = :tenant AND k = :k",
                   {"v": IN_V, "k": IN_K}),
    "tenant-in": ("UPDATE accounts SET v = :v WHERE tenant IN (:tenant, 'acme') AND k = :k", {"v": IN_V, "k": IN_K}),
    "or-replace": ("INSERT OR REPLACE INTO accounts (tenant, k, v) VALUES (:tenant, :k, :v)", {"k": IN_K, "v": IN_V}),
    "update-from": ("UPDATE accounts SET v = o.v FROM accounts AS o "
                    "WHERE accounts.tenant = :tenant AND accounts.k = :k AND o.k = 'X'", {"k": IN_K}),
    "with-cte": ("WITH o AS (SELECT v FROM accounts WHERE k = 'X') "
                 "UPDATE accounts SET v = (SELECT v FROM o) WHERE tenant = :tenant AND k = :k", {"k": IN_K}),
    "union-read": ("SELECT k, v FROM accounts WHERE tenant = :tenant AND k = :k "
                   "UNION SELECT k, v FROM accounts WHERE k = 'X'", {"k": IN_K}),
}

def shape_def(shape):
    """(file name, workflow, step, text) of the hostile definition of a shape."""
    statement, params = SHAPES[shape]
    wf, step = "wf-" + shape, "stp-" + shape
    return "bad-" + shape + ".yaml", wf, step, definition(wf, [FIRST_STEP, sql_step(step, statement, params)])

# `params.tenant` set by the definition (a load error). File, workflow and step names hold no
# "tenant", so that finding the word in a message means the message names the field.
PT_FILE, PT_WF, PT_STEP = "fixed-scope.yaml", "wf-fixed-scope", "stp-fixed-scope"
PT_TEXT = definition(PT_WF, [FIRST_STEP, sql_step(
    PT_STEP, "UPDATE accounts SET v = :v WHERE tenant = :tenant AND k = :k",
    {"tenant": "acme", "v": IN_V, "k": IN_K})])

def step_lines(text, step):
    """(first, last) 1-based line numbers of a step's entry in a definition we wrote."""
    lines = text.splitlines()
    start = next(i for i, l in enumerate(lines, 1) if re.match(r"\s*- name: " + re.escape(step) + r"\s*$", l))
    end = len(lines)
    for i in range(start, len(lines)):
        if re.match(r"\s*- name: ", lines[i]):
            end = i
            break
    return start, end

def cited_lines(fname, out):
    """Line numbers an output gives for a file: `FILE:LINE` (the documented form) or `FILE ... line N`."""
    pat = re.escape(fname) + r"(?::(\d+)|[^\n]{0,40}?\bline (\d+))"
    return [int(m.group(1) or m.group(2)) for m in re.finditer(pat, out)]

def lint_lines(fname, out):
    """[(line number, rest of the line)] of every `FILE:LINE: ...` line lint printed for a file."""
    res = []
    for l in out.splitlines():
        m = re.search(re.escape(fname) + r":(\d+):\s*(.*)$", l)
        if m:
            res.append((int(m.group(1)), m.group(2)))
    return res

# ================================================================ databases (our own clients)

class SqliteDB:
    kind = "sqlite"

    def __init__(self, path):
        self.path = self.url = path

    def config_line(self):
        return f"database: {q(self.path)}\n"

    def server_env(self):
        return {}

    def setup_table(self):
        c = sqlite3.connect(self.path, timeout=60)
        try:
            c.execute(CREATE_TABLE)
            c.executemany("INSERT INTO accounts (tenant, k, v) VALUES (?, ?, ?)", INITIAL_ROWS)
            c.commit()
        finally:
            c.close()

    def rows(self):
        """{(tenant, k): v} of the whole table, read with Python's sqlite3."""
        c = sqlite3.connect(self.path, timeout=60)
        try:
            return {(t, k): v for t, k, v in c.execute("SELECT tenant, k, v FROM accounts")}
        finally:
            c.close()

class PgDB:
    kind = "postgres"

    def __init__(self, base_url, psql):
        parts = urllib.parse.urlsplit(base_url)
        self.psql_exe = psql
        self.name = "waystone_tt_" + secrets.token_hex(5)
        given = parts.path.lstrip("/")
        def url(db):    # by hand: urlunsplit drops the // of an empty host (a socket in ?host=)
            return f"postgresql://{parts.netloc}/{db}" + (f"?{parts.query}" if parts.query else "")
        self.admin_url = url(given or "postgres")
        self.url = url(self.name)
        self.has_password = parts.password is not None
        self.created = False

    def shown(self):
        """The URL without a password, for messages."""
        p = urllib.parse.urlsplit(self.url)
        host = p.netloc.rsplit("@", 1)[-1]
        user = p.username or ""
        return f"postgresql://{(user + '@') if user else ''}{host}{p.path}"

    def config_line(self):
        # a URL with a password goes through WAYSTONE_DB (docs: "a PostgreSQL password from
        # WAYSTONE_DB, PGPASSWORD or ~/.pgpass"; the config file holds no secrets)
        return "" if self.has_password else f"database: {q(self.url)}\n"

    def server_env(self):
        return {"WAYSTONE_DB": self.url} if self.has_password else {}

    def psql(self, url, sql):
        p = subprocess.run([self.psql_exe, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-A", "-t", "-F", "|",
                            "-d", url, "-c", sql], capture_output=True, timeout=PSQL_S)
        out, err = p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
        if p.returncode != 0:
            raise RuntimeError(f"psql {sql[:60]!r} exited {p.returncode}: {err.strip()[-400:]}")
        return out

    def create(self):
        self.psql(self.admin_url, f'CREATE DATABASE "{self.name}"')
        self.created = True

    def drop(self):
        if not self.created:
            return
        try:
            self.psql(self.admin_url, f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        except Exception:
            self.psql(self.admin_url, f'DROP DATABASE IF EXISTS "{self.name}"')
        self.created = False

    def setup_table(self):
        values = ", ".join(f"('{t}', '{k}', {v})" for t, k, v in INITIAL_ROWS)
        self.psql(self.url, f"{CREATE_TABLE}; INSERT INTO accounts (tenant, k, v) VALUES {values};")

    def rows(self):
        out = self.psql(self.url, "SELECT tenant, k, v FROM accounts ORDER BY tenant, k")
        res = {}
        for l in out.splitlines():
            if l.strip():
                t, k, v = l.split("|")
                res[(t, k)] = int(v) if v != "" else None
        return res

def fmt_rows(rows):
    return ", ".join(f"({t},{k})={v}" for (t, k), v in sorted(rows.items(), key=lambda x: (x[0][0], str(x[0][1]))))

def diff_rows(want, got):
    out = []
    for key in sorted(set(want) | set(got), key=lambda x: (x[0], str(x[1]))):
        t, k = key
        if key not in got:
            out.append(f"{t}'s {k} is missing (want {want[key]})")
        elif key not in want:
            out.append(f"an unexpected row ({t}, {k}, {got[key]})")
        elif want[key] != got[key]:
            out.append(f"{t}'s {k} is {got[key]!r} (want {want[key]!r})")
    return out

# ================================================================ the harness

class Harness:
    def __init__(self, exe, tmp):
        self.exe, self.tmp = exe, tmp
        self.procs = []
        self.secfiles = {}
        for t in TENANTS:
            p = os.path.join(tmp, f"{t}.env")
            with open(p, "w") as f:
                f.write(f"TT_UNUSED_{t.upper()}={''.join(secrets.choice('ghijkmnpqrstuvwxyz') for _ in range(24))}\n")
            os.chmod(p, 0o600)
            self.secfiles[t] = p
        self.lint_dir = os.path.join(tmp, "lint")
        os.makedirs(self.lint_dir)

    def env(self, **extra):
        e = {k: v for k, v in os.environ.items() if not k.startswith("WAYSTONE_")}
        e.update(extra)
        return e

    def cli(self, *args, env=None, timeout=CLI_S):
        p = subprocess.run([self.exe, *args], capture_output=True, timeout=timeout,
                           env=self.env(**(env or {})), cwd=self.tmp)
        return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")

    def lint(self, fname, text):
        path = os.path.join(self.lint_dir, fname)
        with open(path, "w") as f:
            f.write(text)
        rc, out, err = self.cli("lint", path)
        return rc, out + err

    # ---------------------------------------------------------- servers
    def setup_dir(self, label, db, files, workflows):
        """A folder with the given definitions and a serve config with tenants acme and globex
        (both may start `workflows`); returns the config's path."""
        d = os.path.join(self.tmp, label)
        defs = os.path.join(d, "defs")
        os.makedirs(defs)
        for fname, text in files:
            with open(os.path.join(defs, fname), "w") as f:
                f.write(text)
        text = db.config_line() + f"workers: 2\ndefinitions: {q(defs)}\ntenants:\n"
        for t in TENANTS:
            text += (f"  {t}:\n    workflows: [{', '.join(workflows)}]\n"
                     f"    secrets_file: {q(self.secfiles[t])}\n")
        cfg = os.path.join(d, "waystone.yaml")
        with open(cfg, "w") as f:
            f.write(text)
        return cfg

    def spawn(self, cfg, db, log):
        port = free_port()
        out = open(log, "ab")
        try:
            p = subprocess.Popen([self.exe, "serve", "--config", cfg, "--listen", f"127.0.0.1:{port}"],
                                 stdout=out, stderr=subprocess.STDOUT, cwd=self.tmp,
                                 env=self.env(WAYSTONE_LOG="info", **db.server_env()),
                                 start_new_session=True)
        finally:
            out.close()
        self.procs.append(p)
        return p, port

    def watch(self, p, port, timeout):
        """'exited' | 'up' | 'hung', and the seconds it took."""
        t0 = time.monotonic()
        while True:
            if p.poll() is not None:
                return "exited", time.monotonic() - t0
            if healthy(port):
                # a server that answers and then refuses a definition a moment later still refused
                if wait_for(lambda: p.poll() is not None, LATE_EXIT_S, 0.2):
                    return "exited", time.monotonic() - t0
                return "up", time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                return "hung", time.monotonic() - t0
            time.sleep(0.2)

    def start_up(self, cfg, db, log):
        """A server that should start: (proc, port) or raises with its output's tail."""
        p, port = self.spawn(cfg, db, log)
        state, secs = self.watch(p, port, SERVE_UP_S)
        if state != "up":
            self.stop(p)
            raise RuntimeError(f"serve {state} after {secs:.1f} s (rc {p.returncode}): {oneline(read(log))}")
        return p, port

    def stop(self, p, grace=STOP_GRACE_S):
        """SIGTERM to the process group we started (start_new_session), SIGKILL after `grace`."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 30)):
            if not p or p.poll() is not None:
                return
            try:
                os.killpg(p.pid, sig)
            except OSError:
                try:
                    p.send_signal(sig)
                except OSError:
                    pass
            try:
                p.wait(wait)
            except subprocess.TimeoutExpired:
                pass

    def close(self):
        for p in self.procs:
            self.stop(p, 5)

    def make_tokens(self, db):
        tok = {}
        for t in TENANTS:
            name = f"tt-{t}-op"
            rc, out, err = self.cli("token", "create", "--db", db.url, "--tenant", t, "--role", "operator",
                                    "--name", name)
            m = TOKEN_RE.findall(out + err)
            if rc != 0 or not m:
                raise RuntimeError(f"token create {name}: rc {rc}: {oneline(out + err, 300)}")
            tok[t] = m[-1]
        return tok

def read(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""

def step_summary(view):
    out = []
    for s in (view or {}).get("steps") or []:
        bits = [str(s.get("name")), str(s.get("state"))]
        for k, v in s.items():
            if v and any(w in k for w in ("error", "reason", "message")) and not isinstance(v, (dict, list)):
                bits.append(f"{k}={str(v)[:160]!r}")
        out.append(" ".join(bits))
    return "; ".join(out)

def run_instance(port, token, wf, inp):
    """Starts `wf` with `inp` as the token's tenant and polls it to rest: (view or None, words)."""
    try:
        r = hreq(port, "POST", "/v1/instances", {"workflow": wf, "input": inp}, token,
                 {"Prefer": "wait=10"}, timeout=45)
    except OSError as e:
        return None, f"POST /v1/instances: {e}"
    if r.status not in (200, 201, 202):
        return None, f"POST /v1/instances answered {r.short(300)}"
    key = (r.json() or {}).get("key") or ("tt:" + inp["id"])
    last = {}
    def rest():
        try:
            g = hreq(port, "GET", f"/v1/instances/{kpath(key)}", token=token)
        except OSError:
            return False
        if g.status == 200:
            last["view"] = g.json() or {}
            return last["view"].get("state") in REST
        last["err"] = g.short(200)
        return False
    wait_for(rest, SETTLE_S, 0.4)
    v = last.get("view")
    if not v:
        return None, f"GET {key}: {last.get('err')}"
    return v, f"{key} {v.get('state')}" + (f" ({step_summary(v)})" if v.get("state") != "completed" else "")

class Results:
    def __init__(self):
        self.rows, self.skipped = [], []

    def add(self, name, ok, detail):
        self.rows.append((name, bool(ok)))
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)

    def skip(self, name, why):
        self.skipped.append(name)
        print(f"skip {name} ({why})", flush=True)

# ================================================================ lint checks

def check_lint(h, R):
    rc, out = h.lint(SCOPED_FILE, SCOPED_TEXT)
    warn = [l for l in out.splitlines() if "warning" in l.lower()]
    f = []
    if rc != 0:
        f.append(f"exit {rc}")
    if warn:
        f.append(f"warnings: {warn[:3]}")
    R.add("lint_scoped_clean", not f, ("; ".join(f) + f": {oneline(out, 400)!r}") if f else
          f"exit 0, no warning for UPDATE/INSERT scoped by :tenant")

    rc, out = h.lint(ALLOWED_FILE, ALLOWED_TEXT)
    warn = [l for l in out.splitlines() if "warning" in l.lower()] + \
           [f"{ALLOWED_FILE}:{n}: {r}" for n, r in lint_lines(ALLOWED_FILE, out)]
    f = []
    if rc != 0:
        f.append(f"exit {rc}")
    if warn:
        f.append(f"flagged: {warn[:4]}")
    R.add("lint_allowed_forms_clean", not f, ("forms the docs allow are flagged (over-strict, no leak): " +
                                              "; ".join(f) + f": {oneline(out, 400)!r}") if f else
          "exit 0, nothing flagged: multi-row INSERT, DO NOTHING, DO UPDATE ... WHERE accounts.tenant = :tenant, "
          "DELETE ... AND (a OR b), SELECT ... ORDER BY LIMIT")

    for shape in SHAPES:
        fname, wf, step, text = shape_def(shape)
        rc, out = h.lint(fname, text)
        lo, hi = step_lines(text, step)
        cited = lint_lines(fname, out)
        inside = [(n, rest) for n, rest in cited if lo <= n <= hi]
        warns = [(n, rest) for n, rest in inside if rest.lower().startswith("warning")]
        f = []
        if shape == "unscoped":
            # the docs: lint "warns" about it; `lint` "exits 1 only for problems"; warnings are
            # `FILE:LINE: warning: …`; the brief: the warning names the step
            if rc != 0:
                f.append(f"exit {rc} (docs: warnings refuse nothing, exit 1 only for problems)")
            if not warns:
                f.append(f"no `{fname}:LINE: warning:` line within the step (lines {lo}-{hi}); cited {cited[:4]}")
            elif not any(named(step, rest) for _, rest in warns):
                f.append(f"the warning does not name step {step!r}: {warns[0][1][:200]!r}")
            if any(named("look-first", rest) for _, rest in warns):
                f.append("a warning names the scoped step look-first")
            R.add("lint_warns_unscoped", not f, ("; ".join(f) + f"; output {oneline(out, 500)!r}") if f else
                  f"exit 0; {fname}:{warns[0][0]}: {warns[0][1][:160]}")
            continue
        if not inside:
            f.append(f"nothing flagged within step {step} (lines {lo}-{hi}); exit {rc}; cited {cited[:4]}")
        elif not any(named(step, rest) for _, rest in inside):
            f.append(f"flagged at line {inside[0][0]} without naming step {step!r}: {inside[0][1][:160]!r}")
        if rc not in (0, 1):
            f.append(f"exit {rc}")
        kind = "warning" if warns else "problem"
        R.add(f"lint_flags_{shape}", not f, ("; ".join(f) + f"; output {oneline(out, 400)!r}") if f else
              f"exit {rc}, {kind} at {fname}:{inside[0][0]}: {inside[0][1][:140]}")

# ================================================================ rows that change

def check_scoped_rows(h, R, name, db):
    """Returns the tokens when the server with the scoped definition ran (for the later checks)."""
    cfg = h.setup_dir(name, db, [(SCOPED_FILE, SCOPED_TEXT)], [SCOPED_WF])
    log = os.path.join(h.tmp, name, "serve.log")
    # 1. a first start makes Waystone's schema (the docs say neither that a file holding a table of
    #    ours may be migrated nor that it may not); tokens made meanwhile; then stop, add our table
    try:
        p, port = h.start_up(cfg, db, log)
    except RuntimeError as e:
        R.add(name, False, f"the server with only per-tenant statements did not start: {e}")
        return None
    try:
        tok = h.make_tokens(db)
    except Exception as e:
        h.stop(p)
        R.add(name, False, f"harness: {e}")
        return None
    h.stop(p)
    if p.returncode not in (0, None):
        print(f"  note: first serve exited {p.returncode} on SIGTERM", flush=True)
    try:
        db.setup_table()
        before = db.rows()
    except Exception as e:
        R.add(name, False, f"harness: creating the business table: {e}")
        return None
    want = {(t, k): v for t, k, v in INITIAL_ROWS}
    if before != want:
        R.add(name, False, f"harness: the table holds {fmt_rows(before)} after setup")
        return None
    # 2. the server again, now beside our table
    try:
        p, port = h.start_up(cfg, db, log)
    except RuntimeError as e:
        R.add(name, False, f"the server did not start again once the business table was there: {e}")
        return None
    f, notes = [], []
    try:
        for tenant, v in (("globex", 99), ("acme", 7)):
            new_k = f"N-{tenant}-{rid()}"
            inp = {"id": f"{tenant}-{rid()}", "k": "A1", "v": v, "new_k": new_k}
            view, words = run_instance(port, tok[tenant], SCOPED_WF, inp)
            state = (view or {}).get("state")
            if state != "completed":
                f.append(f"{tenant}'s instance: {words}")
            else:
                want[(tenant, "A1")] = v
                want[(tenant, new_k)] = v
            try:
                got = db.rows()
            except Exception as e:
                f.append(f"after {tenant}'s run: reading the table: {e}")
                break
            d = diff_rows(want, got)
            if d:
                f.append(f"after {tenant}'s run (A1 := {v}, insert {new_k}): " + "; ".join(d))
            other = "acme" if tenant == "globex" else "globex"
            if (other, new_k) in got:
                f.append(f"{tenant}'s inserted row {new_k} carries tenant {other}")
            notes.append(f"after {tenant}: {fmt_rows(got)}")
        if p.poll() is not None:
            f.append(f"serve exited {p.returncode} meanwhile: {oneline(read(log), 400)}")
    finally:
        h.stop(p)
    R.add(name, not f, ("; ".join(f) + f" [{'; '.join(notes)}] [server: {oneline(read(log), 300)}]") if f else
          f"counted with {'sqlite3' if db.kind == 'sqlite' else 'psql'}: " + " / ".join(notes))
    return tok

# ================================================================ refusals at start

def attempt(h, label, db, tok, bad_file, bad_wf, bad_text):
    """Starts a server whose definitions are the scoped one and one hostile one. Returns a dict:
    outcome (exited|up|hung), secs, rc, output, before/after rows (or an error), exploit words."""
    res = {"exploit": None}
    cfg = h.setup_dir(label, db, [(SCOPED_FILE, SCOPED_TEXT), (bad_file, bad_text)], [SCOPED_WF, bad_wf])
    log = os.path.join(h.tmp, label, "serve.log")
    try:
        res["before"] = db.rows()
    except Exception as e:
        res["before"] = None
        res["table_error"] = str(e)
    p, port = h.spawn(cfg, db, log)
    try:
        res["outcome"], res["secs"] = h.watch(p, port, REFUSE_S)
        if res["outcome"] == "up" and tok:
            # what the probe did: globex sets k = 'A1' (and inserts new_k) through the hostile step
            inp = {"id": "probe-" + rid(), "k": "A1", "v": 666, "new_k": "Z-" + rid()}
            view, words = run_instance(port, tok["globex"], bad_wf, inp)
            res["exploit"] = words
            if view:
                res["exploit_view"] = json.dumps(view)[:4000]
    finally:
        h.stop(p)
    res["rc"] = p.returncode
    res["output"] = read(log)
    try:
        res["after"] = db.rows() if res["before"] is not None else None
    except Exception as e:
        res["after"] = None
        res["table_error"] = str(e)
    return res

def judge_refusal(res, fname, text, step, field=None):
    f = []
    out = res["output"]
    if res["outcome"] == "up":
        f.append(f"the server STARTED (/healthz 200 after {res['secs']:.1f} s) with {fname}")
        if res["exploit"]:
            f.append(f"globex's probe instance: {res['exploit']}")
    elif res["outcome"] == "hung":
        f.append(f"the server neither exited nor answered within {REFUSE_S} s")
    elif res["rc"] == 0:
        f.append("the server exited 0 (want non-zero)")
    if res["outcome"] == "exited":
        lo, hi = step_lines(text, step)
        nums = cited_lines(fname, out)
        if not nums:
            f.append(f"its output does not name {fname} with a line")
        elif not any(lo <= n <= hi for n in nums):
            f.append(f"its output names line(s) {sorted(set(nums))[:5]} of {fname}, outside step {step} (lines {lo}-{hi})")
        if not named(step, out):
            f.append(f"its output does not name step {step!r}")
        if field and not any(re.search(r"(?<!\w)" + re.escape(field) + r"(?!\w)", l) for l in out.splitlines()
                             if fname in l or named(step, l)):
            f.append(f"the line naming the file/step does not name the field {field!r}")
    if res["before"] is None:
        f.append(f"harness: the business table could not be read ({res.get('table_error')})")
    elif res["after"] is None:
        f.append(f"the business table could not be read afterwards ({res.get('table_error')})")
    elif res["after"] != res["before"]:
        f.append("the table changed: " + "; ".join(diff_rows(res["before"], res["after"])))
    return f

def refusal_words(res, fname):
    lines = [l.strip() for l in res["output"].splitlines() if fname in l]
    return (lines[0] if lines else oneline(res["output"], 200))[:220]

def check_refusals(h, R, db, tok, suffix=""):
    shapes = list(SHAPES) if not suffix else ["unscoped"]
    for shape in shapes:
        fname, wf, step, text = shape_def(shape)
        name = ("unscoped_refused_at_start" if shape == "unscoped" else f"bypass_{shape}_refused_at_start") + suffix
        try:
            res = attempt(h, name, db, tok, fname, wf, text)
        except Exception as e:
            R.add(name, False, f"blew up: {e.__class__.__name__}: {e}")
            continue
        f = judge_refusal(res, fname, text, step)
        R.add(name, not f, ("; ".join(f) + f" [exit {res['rc']}; output: {oneline(res['output'], 700)}]") if f else
              f"exit {res['rc']} after {res['secs']:.1f} s, table unchanged; {refusal_words(res, fname)!r}")

def check_params_tenant(h, R, db, tok):
    f, words = [], []
    rc, out = h.lint(PT_FILE, PT_TEXT)
    lo, hi = step_lines(PT_TEXT, PT_STEP)
    inside = [(n, rest) for n, rest in lint_lines(PT_FILE, out) if lo <= n <= hi]
    if rc != 1:
        f.append(f"lint exit {rc} (want 1: a load error is a problem)")
    if not inside:
        f.append(f"lint prints no `{PT_FILE}:LINE:` line within step {PT_STEP} (lines {lo}-{hi}): {oneline(out, 300)!r}")
    else:
        probs = [(n, r) for n, r in inside if not r.lower().startswith("warning")]
        if not probs:
            f.append(f"lint only warns: {inside[0][1][:200]!r}")
        elif not any(named(PT_STEP, r) and re.search(r"(?<!\w)tenant(?!\w)", r) for _, r in probs):
            f.append(f"lint's problem line does not name step and field 'tenant': {probs[0][1][:200]!r}")
        else:
            words.append(f"lint exit {rc}: {PT_FILE}:{probs[0][0]}: {probs[0][1][:140]}")
    try:
        res = attempt(h, "params_tenant_refused", db, tok, PT_FILE, PT_WF, PT_TEXT)
        g = judge_refusal(res, PT_FILE, PT_TEXT, PT_STEP, field="tenant")
        f += ["serve: " + x for x in g]
        if g:
            f.append(f"[serve exit {res['rc']}; output: {oneline(res['output'], 600)}]")
        else:
            words.append(f"serve exit {res['rc']} after {res['secs']:.1f} s: {refusal_words(res, PT_FILE)!r}")
    except Exception as e:
        f.append(f"serve attempt blew up: {e.__class__.__name__}: {e}")
    R.add("params_tenant_refused", not f, "; ".join(f) if f else "; ".join(words) + "; table unchanged")

# ================================================================ main

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--waystone", required=True, help="path of the built waystone binary")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (dbs, configs, logs) and the PostgreSQL database")
    args = ap.parse_args()
    exe = os.path.abspath(args.waystone)
    if not os.access(exe, os.X_OK):
        print(f"no waystone binary at {exe}")
        return 2
    pg_url = os.environ.get("WAYSTONE_TEST_PG", "").strip()

    def on_signal(sig, frame):
        raise KeyboardInterrupt(f"signal {sig}")
    signal.signal(signal.SIGTERM, on_signal)

    tmp = tempfile.mkdtemp(prefix="waystone-ttables-")
    R = Results()
    h = None
    pg = None
    try:
        h = Harness(exe, tmp)

        def guarded(name, fn, *a):
            try:
                return fn(*a)
            except KeyboardInterrupt:
                raise
            except Exception as e:
                R.add(name, False, f"blew up: {e.__class__.__name__}: {e}")
                return None

        guarded("lint", check_lint, h, R)

        sq = SqliteDB(os.path.join(tmp, "sqlite", "w.db"))
        os.makedirs(os.path.dirname(sq.path))
        tok = guarded("scoped_rows_sqlite", check_scoped_rows, h, R, "scoped_rows_sqlite", sq)
        guarded("refusals", check_refusals, h, R, sq, tok)
        guarded("params_tenant_refused", check_params_tenant, h, R, sq, tok)

        if not pg_url:
            R.skip("scoped_rows_postgres", "WAYSTONE_TEST_PG is not set")
            R.skip("unscoped_refused_at_start_postgres", "WAYSTONE_TEST_PG is not set")
        else:
            psql = shutil.which("psql")
            if not psql:
                R.add("scoped_rows_postgres", False, "WAYSTONE_TEST_PG is set but no psql on PATH")
            else:
                pg = PgDB(pg_url, psql)
                try:
                    pg.create()
                except Exception as e:
                    R.add("scoped_rows_postgres", False, f"harness: creating database {pg.name}: {e}")
                else:
                    print(f"  postgres database {pg.shown()}", flush=True)
                    ptok = guarded("scoped_rows_postgres", check_scoped_rows, h, R, "scoped_rows_postgres", pg)
                    if ptok:
                        guarded("unscoped_refused_at_start_postgres", check_refusals, h, R, pg, ptok, "_postgres")
                    else:
                        R.add("unscoped_refused_at_start_postgres", False,
                              "not exercised: the PostgreSQL server with the scoped definition did not run")
    except KeyboardInterrupt as e:
        R.add("interrupted", False, str(e))
    except Exception as e:
        R.add("setup", False, f"{e.__class__.__name__}: {e}")
    finally:
        if h:
            h.close()
        if pg and pg.created:
            if args.keep:
                print(f"kept postgres database {pg.name}")
            else:
                try:
                    pg.drop()
                except Exception as e:
                    print(f"  note: could not drop postgres database {pg.name}: {e}", flush=True)
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    passed = sum(ok for _, ok in R.rows)
    skipped = f", {len(R.skipped)} skipped" if R.skipped else ""
    print(f"{passed}/{len(R.rows)} checks passed{skipped}")
    return 0 if R.rows and passed == len(R.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
