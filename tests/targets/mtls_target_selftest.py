#!/usr/bin/env python3
"""Self-test for mtls_target.py.

Makes throw-away certificates with the openssl command line, starts the target
as a subprocess and checks it from the outside with Python's ssl/http.client:

  (a) a good client certificate gets 201 and is counted with its CN;
  (b) no client certificate fails at TLS and is not counted as a request
      (TLS 1.2 and TLS 1.3, the latter with a full request sent early);
  (c) a client certificate from another CA fails and is not counted;
  (d) a client that does not trust the server's CA fails verification.

Run:  python3 tests/targets/mtls_target_selftest.py   (exit 0 = pass)
"""

import ctypes
import http.client
import json
import os
import select
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "mtls_target.py")

OPENSSL_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca_ext]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""

REQUEST = (b"POST /orders HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           b"Content-Length: 14\r\n\r\n{\"ref\":\"t:13\"}")


class Failure(Exception):
    pass


def check(cond, message):
    if not cond:
        raise Failure(message)


def openssl(d, *args):
    res = subprocess.run(["openssl", *args], cwd=d, capture_output=True, text=True)
    if res.returncode != 0:
        raise Failure("openssl %s failed:\n%s" % (" ".join(args), res.stderr))


def make_pki(d):
    with open(os.path.join(d, "openssl.cnf"), "w") as f:
        f.write(OPENSSL_CNF)
    newkey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "ca2"):
        openssl(d, "req", "-x509", "-new", *newkey, "-keyout", ca + ".key", "-out", ca + ".pem",
                "-days", "2", "-subj", "/CN=mtls selftest " + ca, "-config", "openssl.cnf",
                "-extensions", "ca_ext")
    for name, cn, ca, ext in (("server", "localhost", "ca", "server_ext"),
                              ("client", "waystone-worker", "ca", "client_ext"),
                              ("intruder", "intruder", "ca2", "client_ext")):
        openssl(d, "req", "-new", *newkey, "-keyout", name + ".key", "-out", name + ".csr",
                "-subj", "/CN=" + cn, "-config", "openssl.cnf")
        openssl(d, "x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey", ca + ".key",
                "-CAcreateserial", "-out", name + ".pem", "-days", "2",
                "-extfile", "openssl.cnf", "-extensions", ext)
    return {k: os.path.join(d, k) for k in ("ca.pem", "ca2.pem", "server.pem", "server.key",
                                             "client.pem", "client.key", "intruder.pem",
                                             "intruder.key")}


def start_server(files):
    proc = subprocess.Popen([sys.executable, SERVER, "--cert", files["server.pem"],
                             "--key", files["server.key"], "--client-ca", files["ca.pem"]],
                            stdout=subprocess.PIPE)
    out, deadline = b"", time.monotonic() + 10
    while out.count(b"\n") < 2 and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        data = os.read(proc.stdout.fileno(), 4096) if ready else b""
        if ready and not data:
            break
        out += data
    lines = out.decode(errors="replace").splitlines()
    ports = {}
    for want, line in zip(("PORT", "CONTROL"), lines + ["", ""]):
        key, _, value = line.strip().partition(" ")
        if key != want or not value.isdigit():
            proc.kill()
            raise Failure("expected '%s <n>' from the server, got %r" % (want, line))
        ports[want] = int(value)
    return proc, ports["PORT"], ports["CONTROL"]


def control(port, method, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request(method, path)
    resp = conn.getresponse()
    data = json.loads(resp.read())
    conn.close()
    check(resp.status == 200, "control %s %s -> %d" % (method, path, resp.status))
    return data


def wait_stats(port, failures):
    """Handshake failures are counted by the server's own thread: poll."""
    deadline = time.monotonic() + 3
    while True:
        stats = control(port, "GET", "/_target/stats")
        if stats["handshake_failures"] >= failures or time.monotonic() > deadline:
            return stats


def client_ctx(files, cert=None, trust="ca.pem", version=None):
    ctx = ssl.create_default_context(cafile=files[trust])
    if cert:
        ctx.load_cert_chain(files[cert + ".pem"], files[cert + ".key"])
    if version:
        ctx.minimum_version = ctx.maximum_version = version
    return ctx


def post_order(port, ctx, ref):
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
    try:
        conn.request("POST", "/orders", body=json.dumps({"ref": ref}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def expect_rejected(port, ctx, what):
    try:
        status, body = post_order(port, ctx, "rejected")
    except (ssl.SSLError, OSError) as exc:
        return exc
    raise Failure("%s: expected a TLS failure, got HTTP %d %r" % (what, status, body))


def early_request_tls13(port, ctx):
    """TLS 1.3: the client's handshake completes before the server has checked
    its certificate, so it can send a whole request.  It must get no answer."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    try:
        check(sock.version() == "TLSv1.3", "expected TLS 1.3, got %s" % sock.version())
        got = b""
        try:
            sock.sendall(REQUEST)
            while True:
                data = sock.recv(4096)
                if not data:
                    break
                got += data
        except (ssl.SSLError, OSError):
            pass
        check(not got.startswith(b"HTTP/"), "TLS 1.3 early request was answered: %r" % got)
    finally:
        sock.close()


def run(files):
    proc, port, cport = start_server(files)
    try:
        stats = control(cport, "GET", "/_target/stats")
        check(stats == {"requests": 0, "orders": 0, "client_cns": [], "handshake_failures": 0,
                        "handshake_errors": []}, "fresh stats wrong: %r" % stats)

        # (a) good client certificate, both TLS versions
        for i, version in enumerate((ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2), 1):
            status, body = post_order(port, client_ctx(files, "client", version=version), "r%d" % i)
            check(status == 201 and body == {"id": "ORD-%d" % i, "client_cn": "waystone-worker",
                                             "ref": "r%d" % i}, "(a) got %d %r" % (status, body))
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=client_ctx(files, "client"))
        conn.request("GET", "/nope")
        resp = conn.getresponse()
        check(resp.status == 404 and "error" in json.loads(resp.read()), "(a) 404 route")
        conn.close()
        stats = control(cport, "GET", "/_target/stats")
        check(stats["requests"] == 3 and stats["orders"] == 2
              and stats["client_cns"] == ["waystone-worker"] * 3
              and stats["handshake_failures"] == 0, "(a) stats wrong: %r" % stats)

        # (b) no client certificate: TLS 1.2, TLS 1.3 (http.client), TLS 1.3 early request
        expect_rejected(port, client_ctx(files, version=ssl.TLSVersion.TLSv1_2), "(b) TLS1.2")
        expect_rejected(port, client_ctx(files, version=ssl.TLSVersion.TLSv1_3), "(b) TLS1.3")
        early_request_tls13(port, client_ctx(files, version=ssl.TLSVersion.TLSv1_3))
        stats = wait_stats(cport, 3)
        check(stats["requests"] == 3 and stats["handshake_failures"] == 3
              and len(stats["handshake_errors"]) == 3, "(b) stats wrong: %r" % stats)
        check(all("CERTIFICATE" in e for e in stats["handshake_errors"]),
              "(b) unexpected handshake errors: %r" % stats["handshake_errors"])

        # (c) client certificate from another CA (TLS 1.2, TLS 1.3, TLS 1.3 early request)
        for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
            expect_rejected(port, client_ctx(files, "intruder", version=version), "(c)")
        early_request_tls13(port, client_ctx(files, "intruder", version=ssl.TLSVersion.TLSv1_3))
        stats = wait_stats(cport, 6)
        check(stats["requests"] == 3 and stats["handshake_failures"] == 6
              and "intruder" not in stats["client_cns"], "(c) stats wrong: %r" % stats)
        check(all("CERTIFICATE_VERIFY_FAILED" in e for e in stats["handshake_errors"][3:]),
              "(c) unexpected handshake errors: %r" % stats["handshake_errors"])

        # (d) a client that does not trust the server's CA
        exc = expect_rejected(port, client_ctx(files, "client", trust="ca2.pem"), "(d)")
        check(isinstance(exc, ssl.SSLCertVerificationError),
              "(d) expected certificate verification error, got %r" % exc)
        stats = wait_stats(cport, 7)
        check(stats["requests"] == 3 and stats["handshake_failures"] == 7,
              "(d) stats wrong: %r" % stats)

        # reset clears everything and numbering restarts
        stats = control(cport, "POST", "/_target/reset")
        check(stats["requests"] == 0 and stats["handshake_errors"] == [], "reset: %r" % stats)
        status, body = post_order(port, client_ctx(files, "client"), None)
        check(status == 201 and body["id"] == "ORD-1" and body["ref"] is None,
              "after reset: %d %r" % (status, body))
    finally:
        # The SIGTERM goes to a thread other than the main one (there is
        # always the control server's), as the kernel may choose to do with
        # a process-directed signal: the target must stop all the same.
        signal_another_thread(proc, signal.SIGTERM)
        try:
            rc = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise Failure("server did not stop on SIGTERM")
    check(rc == 0, "server exited with status %d after SIGTERM" % rc)


def signal_another_thread(proc, sig):
    others = [int(t) for t in os.listdir("/proc/%d/task" % proc.pid) if int(t) != proc.pid]
    if not others:
        raise Failure("the target has no thread besides its main one")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.tgkill(proc.pid, min(others), sig) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")


def main():
    start = time.monotonic()
    try:
        with tempfile.TemporaryDirectory() as d:
            run(make_pki(d))
    except Failure as exc:
        print("FAIL: %s" % exc, file=sys.stderr)
        return 1
    print("mtls_target selftest OK (%.1f s)" % (time.monotonic() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
